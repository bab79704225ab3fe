"""The staged build context: one folder per stack holding exactly what the Containerfile reads: the environment's
plan (build.envplan, which `speclock host-env` carries out too) as files.

Files are copied only when their content differs, so unchanged files keep their metadata and the
builders' layer caches hit; anything no longer wanted is removed."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from speclock.build import digests, uvwheel, wheelhouse
from speclock.build.closure import INIT_STUB_REL, import_closure, init_stub
from speclock.build.envplan import EnvPlan, baselines_dir, draft_dir, patch_files, plan_environment
from speclock.core.files import atomic_output, atomic_write_text
from speclock.core.heartbeat import Progress
from speclock.core.layout import REPO_ROOT, cache_dir
from speclock.core.locks import exclusive
from speclock.spec.lock import LockDoc, lock_path
from speclock.spec.stack import Stack

# What the early image stages run: each gets the import closure of its entry modules (build.closure), in a
# folder of its own, so its layer is keyed by those files alone and editing any other module of speclock
# rebuilds the final layer only.
#   patch-tools/ (patch stage, only for stacks with a patch series: `python -m speclock.patches patches apply`;
#   the applier runs speclock.engines.probe in the engine's Python)
PATCH_ENTRIES = ("speclock.patches.__main__", "speclock.patches.cli", "speclock.engines.probe")
#   asset-tools/ (assets stage, only for stacks whose target is a GGUF: `python -m speclock.drafter.gguf_convert`)
ASSET_ENTRIES = ("speclock.drafter.gguf_convert",)
#   kernel-tools/ (kernel stage: `python -m speclock.kernels.build`, with the CUDA sources in kernels/csrc)
KERNEL_ENTRIES = ("speclock.kernels.build",)
KERNEL_DATA = ("kernels/csrc",)
SRC_ROOT = REPO_ROOT / "src" / "speclock"
# What wheels/ holds besides the locked files: the pinned lists, the installer and the prune hook.
WHEELS_FILES = ("requirements.txt", "assets.txt", "uv.txt", "uv_unpack.py", "prune.sh")


def sync_file(src: Path, dest: Path) -> None:
    """Copy only when the content differs, so unchanged files keep their metadata (and caches hit).

    Written whole (atomic), with the mode open() would give: image layers do not depend on how it was written."""
    if dest.is_file() and dest.stat().st_size == src.stat().st_size and digests.sha256(dest) == digests.sha256(src):
        return
    with atomic_output(dest, binary=True) as out, open(src, "rb") as fh:
        shutil.copyfileobj(fh, out, 1 << 20)


def sync_text(dest: Path, text: str) -> None:
    """Write `text` to `dest` unless it holds exactly that already."""
    if not dest.is_file() or dest.read_text() != text:
        atomic_write_text(dest, text)


def sync_tree(files: dict[str, Path], dest: Path, keep: tuple[str, ...] = ()) -> None:
    """Make `dest` hold exactly `files` (relative path -> source), removing anything stale (but `keep`)."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel, src in files.items():
        sync_file(src, dest / rel)
    for path in sorted(dest.rglob("*"), reverse=True):
        rel = path.relative_to(dest).as_posix()
        if path.is_file() and rel not in files and rel not in keep:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def tree_files(root: Path) -> dict[str, Path]:
    """{relative path: file} under `root`, without bytecode caches."""
    return {
        p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".pyo"))
    }


def tree_sha256(ctx: Path, rels: list[str]) -> str:
    """One hash over the named files/folders of the staged context (names and contents)."""
    h = hashlib.sha256()
    for rel in rels:
        path = ctx / rel
        files = {rel: path} if path.is_file() else {f"{rel}/{k}": v for k, v in tree_files(path).items()} if path.is_dir() else {}
        for name, f in sorted(files.items()):
            h.update(f"{name}:{digests.sha256(f)}\n".encode())
    return h.hexdigest()


def stage_tool_files(src_root: Path, entries: tuple[str, ...], data: tuple[str, ...] = ()) -> dict[str, Path]:
    """{"speclock/<rel>": source}: the import closure of `entries` and the named data folders of src/speclock
    (the stub speclock/__init__.py is written by the stager: `closure.init_stub`)."""
    files = import_closure(src_root, entries)
    for folder in data:
        files.update({f"speclock/{folder}/{rel}": path for rel, path in tree_files(src_root / folder).items()})
    return files


def _stage_tools(dest: Path, files: dict[str, Path] | None) -> None:
    """A build step's tools folder: `files` and the version-only speclock/__init__.py; empty for None (the step
    has nothing to run: its bind mount still needs a folder, and an empty one never changes its cache key)."""
    sync_tree(files or {}, dest, keep=(INIT_STUB_REL,) if files is not None else ())
    if files is not None:
        sync_text(dest / INIT_STUB_REL, init_stub(SRC_ROOT))


def _stage_wheels(plan: EnvPlan, wheels: Path) -> None:
    """wheels/: the locked files (linked from the verified wheelhouse), the plan's hash-pinned lists and its prune hook."""
    wheelhouse.link_into(plan.lock, wheels)
    lists = plan.lists()
    keep = {p["filename"] for p in plan.lock["packages"] + plan.lock["assets"]} | set(WHEELS_FILES) | set(lists)
    for stale in wheels.iterdir():
        if stale.name not in keep:
            stale.unlink()
    for name, pkgs in lists.items():
        sync_text(wheels / name, wheelhouse.requirements_text(pkgs))
    # The venv step's installer and its prune hook travel with the wheels (both are in WHEELS_SHA256).
    sync_file(Path(uvwheel.__file__), wheels / "uv_unpack.py")
    sync_text(wheels / "prune.sh", plan.prune_script)


def stage_context(stack: Stack, lock: LockDoc, ctx: Path, *, lock_file: Path | None = None) -> None:
    """Lay out the build context: wheels, the build steps' tools, patches, drafter, config with the source.

    The wheelhouse must hold the lock's files (`speclock.build.fetch.fetch` first). `lock_file` is the
    lock to stage (default locks/<stack>.lock; `speclock upgrade` passes a candidate's). Image builds then add
    config/sbom.cdx.json (`build.sbom.document.stage_sbom`: it reads the base rootfs and two asset wheels)."""
    plan = plan_environment(stack, lock)
    _stage_wheels(plan, ctx / "wheels")

    stack_file = {f"stacks/{stack.path.name}": stack.path}  # the patch and kernel steps read the stack
    _stage_tools(ctx / "patch-tools", {**stage_tool_files(SRC_ROOT, PATCH_ENTRIES), **stack_file} if stack.patch_series else None)
    _stage_tools(ctx / "asset-tools", stage_tool_files(SRC_ROOT, ASSET_ENTRIES) if stack.target.get("gguf") else None)
    if stack.kernels:
        _stage_tools(ctx / "kernel-tools", {**stage_tool_files(SRC_ROOT, KERNEL_ENTRIES, KERNEL_DATA), **stack_file})
    # Left by an earlier staging: kernel-tools/ of a stack that no longer builds kernels, tools/ of the layout
    # before closures.
    stale = ["tools"] + ([] if stack.kernels else ["kernel-tools"])
    for name in stale:
        if (ctx / name).exists():
            shutil.rmtree(ctx / name)

    sync_tree(patch_files(stack), ctx / "patches")

    sync_tree(tree_files(draft_dir(stack)), ctx / "draft")

    config: dict[str, Path] = {f"stacks/{stack.path.name}": stack.path}
    config.update({f"patches/{k}": v for k, v in patch_files(stack).items()})  # /opt/speclock/patches
    baselines = baselines_dir(stack)
    if baselines:
        config.update({f"baselines/{stack.name}/{k}": v for k, v in tree_files(baselines).items()})
    # speclock's source rides in config/ (one COPY, the image's last layer with image.json: both change together).
    config.update({f"src/speclock/{k}": v for k, v in tree_files(SRC_ROOT).items()})
    sync_tree(config, ctx / "config", keep=("lock.json", "image.json", "sbom.cdx.json"))  # written after this
    sync_file(lock_file or lock_path(stack), ctx / "config" / "lock.json")
    if (ctx / "src").exists():  # the layout before: src/ beside config/
        shutil.rmtree(ctx / "src")


def context_name(stack: Stack, lock_file: Path | None = None) -> str:
    """The staged context's folder name: candidates get their own, so they never wait on (or disturb) the current build."""
    if lock_file in (None, lock_path(stack)):
        return stack.name
    return f"{stack.name}.candidate-{hashlib.sha256(str(Path(lock_file).resolve()).encode()).hexdigest()[:8]}"


def context_dir(stack: Stack, lock_file: Path | None = None) -> Path:
    """Where the context of this stack (or candidate lock) is staged: under the cache, reused across builds."""
    return cache_dir() / "contexts" / context_name(stack, lock_file)


@contextlib.contextmanager
def context_lock(stack_name: str, progress: Progress = print) -> Iterator[None]:
    """One build per stack at a time: builds share the staged context folder."""
    path = cache_dir() / "contexts" / f"{stack_name}.lock"
    with exclusive(path, on_wait=lambda: progress(f"another build of stack {stack_name} is running; waiting for it to finish")):
        yield
