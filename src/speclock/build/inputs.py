"""What an image is built from, as one hash (its content tag) and the commit that last changed it."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from speclock.build import digests
from speclock.build.containerfile import CONTAINERFILE, KERNELS_CONTAINERFILE
from speclock.build.context import tree_files
from speclock.core.files import file_sha256
from speclock.core.layout import REPO_ROOT
from speclock.spec.lock import LockDoc
from speclock.spec.stack import Stack

# Files of the staged context derived from the inputs (not inputs themselves), and the files of wheels/
# that are hashed: the lists that stand for the wheels (each wheel is covered by the lock's hash), the
# uv unpacker and the prune hook (what the image leaves out is part of what it is). The SBOM is made from
# the lock, the staged files and the locked base (build.sbom): a candidate staged without it gets the same tag.
DERIVED = (
    "config/image.json",
    "config/sbom.cdx.json",
    "Containerfile",
    ".sbom-key",
)  # .sbom-key: left in contexts staged while an SBOM cache existed
WHEEL_LISTS = (
    "wheels/requirements.txt",
    "wheels/assets.txt",
    "wheels/kernels.txt",
    "wheels/uv.txt",
    "wheels/uv_unpack.py",
    "wheels/prune.sh",
)


def context_digests(ctx: Path) -> dict[str, str]:
    """{relative path: sha256} of the staged context's input files (not the wheels, not DERIVED), hashed once
    per build: the inputs hash and the SBOM's cache key (build.sbom.document.stage_sbom) both read them."""
    return {
        rel: digests.sha256(path)
        for rel, path in sorted(tree_files(ctx).items())
        if not (rel.startswith("wheels/") and rel not in WHEEL_LISTS) and rel not in DERIVED
    }


def inputs_hash(ctx: Path, lock: LockDoc, digests: dict[str, str] | None = None) -> str:
    """Hash of everything that reaches the image; wheels are covered by the lock's hash."""
    h = hashlib.sha256()
    h.update(b"lock:" + lock["lock_sha256"].encode() + b"\n")
    h.update(b"containerfile:" + file_sha256(CONTAINERFILE).encode() + b"\n")
    if "kernel_base" in lock:  # the spliced kernel stage is an input of these images only
        h.update(b"kernels-containerfile:" + file_sha256(KERNELS_CONTAINERFILE).encode() + b"\n")
    for rel, digest in sorted((context_digests(ctx) if digests is None else digests).items()):
        h.update(f"{rel}:{digest}\n".encode())
    return h.hexdigest()


def image_tag(inputs: str) -> str:
    """The content tag: the first 16 hex digits of the inputs hash."""
    return inputs[:16]


def image_ref(stack: Stack, tag: str) -> str:
    return f"localhost/speclock-{stack.name}:{tag}"


def git_revision(paths: list[Path]) -> str:
    """The commit that last changed the image's inputs (+dirty when they have uncommitted edits)."""
    # Inputs outside the checkout (an upgrade candidate's stack and lock) have no git history.
    rel = [str(p.resolve().relative_to(REPO_ROOT)) for p in paths if p.exists() and p.resolve().is_relative_to(REPO_ROOT)]
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%H", "--", *rel], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", *rel], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"
    return (rev or "uncommitted") + ("+dirty" if dirty else "")
