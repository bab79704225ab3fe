"""The staged Containerfile and its build arguments: containers/Containerfile, with the kernel builder
stage spliced in for stacks with kernels.build. Labels are not written here: the builder sets them."""

from __future__ import annotations

import json
from pathlib import Path

from speclock.build.context import sync_text, tree_sha256
from speclock.core.errors import BadInput
from speclock.core.layout import REPO_ROOT
from speclock.spec.lock import LockDoc
from speclock.spec.stack import Stack

CONTAINERFILE = REPO_ROOT / "containers" / "Containerfile"
BASE_CONTAINERFILE = REPO_ROOT / "containers" / "base-rootfs.Containerfile"
# The kernel builder stage, spliced into CONTAINERFILE at its @kernels markers for stacks with kernels.build.
KERNELS_CONTAINERFILE = REPO_ROOT / "containers" / "kernels.Containerfile"
KERNELS_STAGE_MARK = "# @kernels-stage"
KERNELS_COPY_MARK = "# @kernels-copy"
ENGINE_ENV_MARK = "# @engine-env"
KERNELS_IN_IMAGE = "/opt/speclock/kernels"
# What the venv step reads from wheels/ besides the wheels the lists pin (each wheel is covered by its hash).
VENV_STEP_FILES = (
    "requirements.txt",
    "uv.txt",
    "uv_unpack.py",
    "prune.sh",
)  # speclock.kernels.fp8_cuda looks here (IMAGE.root / "kernels")


def engine_env_line(env: dict[str, str]) -> str:
    """One ENV instruction for the stack's engine.env (names are validated; values JSON-quoted), or ''."""
    return "ENV " + " ".join(f"{k}={json.dumps(str(v))}" for k, v in sorted(env.items())) + "\n" if env else ""


def containerfile_text(with_kernels: bool, engine_env: dict[str, str] | None = None) -> str:
    """containers/Containerfile, with the kernel builder stage and its one COPY spliced in when asked, and the
    stack's engine.env as an ENV line."""
    text = CONTAINERFILE.read_text()
    lines = text.splitlines(keepends=True)
    marks = {
        m: [i for i, line in enumerate(lines) if line.startswith(m)]
        for m in (KERNELS_STAGE_MARK, KERNELS_COPY_MARK, ENGINE_ENV_MARK)
    }
    if any(len(v) != 1 for v in marks.values()):
        raise BadInput(
            f"{CONTAINERFILE} must hold exactly one '{KERNELS_STAGE_MARK}', one '{KERNELS_COPY_MARK}' "
            f"and one '{ENGINE_ENV_MARK}' line",
            hint="restore the marker comments where the kernel stage, its COPY and the engine ENV belong",
        )
    if engine_env:
        lines[marks[ENGINE_ENV_MARK][0]] = engine_env_line(engine_env)
        text = "".join(lines)
    if not with_kernels:
        return text
    lines[marks[KERNELS_COPY_MARK][0]] = f"COPY --from=kernels {KERNELS_IN_IMAGE} {KERNELS_IN_IMAGE}\n"
    lines[marks[KERNELS_STAGE_MARK][0]] = KERNELS_CONTAINERFILE.read_text()
    # A FROM ${ARG} needs the ARG declared before the first FROM.
    first_from = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    lines.insert(first_from, "ARG KERNEL_BASE_IMAGE\n")
    return "".join(lines)


def staged_containerfile(ctx: Path, *, with_kernels: bool = False, engine_env: dict[str, str] | None = None) -> Path:
    """ctx/Containerfile: containers/Containerfile (+ the kernel stage for stacks with kernels.build, + engine.env)."""
    path = ctx / "Containerfile"
    sync_text(path, containerfile_text(with_kernels, engine_env))
    return path


def build_args_for(stack: Stack, lock: LockDoc, ctx: Path, base_ref: str, kernel_base_ref: str | None = None) -> dict[str, str]:
    """The Containerfile's build arguments for a staged context; the kernel ones only for kernel stacks."""
    target = stack.target
    build_args = {
        "BASE_IMAGE": base_ref,
        "SOURCE_DATE_EPOCH": str(lock["source_date_epoch"]),
        "PATCH_SERIES": " ".join(stack.patch_series),
        "STACK_NAME": stack.name,
        "TARGET_GGUF": target["gguf"],
        "TARGET_DTYPE": target["dtype"],
        "PROMPTS_FILE": stack.smoke["prompts_file"],
        # Content of the bind-mounted folders, so a changed lock or patch never reuses a stale layer. Each
        # step is keyed by what it reads: speclock's code only through its own tools folder (the import
        # closure of the step's entry, build.closure), so editing other modules leaves these layers alone.
        "WHEELS_SHA256": tree_sha256(ctx, [f"wheels/{name}" for name in VENV_STEP_FILES]),
        "PATCHES_SHA256": tree_sha256(ctx, ["patch-tools", "patches"]),
        "ASSETS_SHA256": tree_sha256(ctx, ["wheels/assets.txt", "asset-tools"]),
        "DRAFT_SHA256": tree_sha256(ctx, ["draft"]),
    }
    if kernel_base_ref:
        build_args["KERNEL_BASE_IMAGE"] = kernel_base_ref
        build_args["KERNELS_SHA256"] = tree_sha256(ctx, ["wheels/kernels.txt", "kernel-tools"])
    return build_args
