"""The staged SBOM, made again only when what it is made from changed.

build.sbom derives the SBOM from the stack, the lock (base rootfs, wheels), the staged patches and drafter,
and its own code; making it costs ~4 s (CycloneDX model, strict schema validation), most of a warm rebuild.
The key below covers every one of those inputs, the SBOM code by its import closure (build.closure) and the
CycloneDX library by its version, so a reused SBOM is byte for byte the one that would be made."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
from pathlib import Path
from typing import Any

from speclock.build.closure import import_closure, init_stub
from speclock.build.context import SRC_ROOT, tree_files
from speclock.build import sbom
from speclock.build.sbom import SBOM_IN_CONTEXT
from speclock.core.files import atomic_write_text, file_sha256
from speclock.spec.stack import Stack

SBOM_ENTRIES = ("speclock.build.sbom",)
KEY_FILE = ".sbom-key"  # in the context, beside config/ (never copied into the image; not an input of the tag)


def sbom_key(stack: Stack, lock: dict[str, Any], ctx: Path) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(lock, sort_keys=True).encode())
    h.update(b"stack:" + file_sha256(stack.path).encode() + b"\n")
    for folder in ("patches", "draft"):
        for rel, path in sorted(tree_files(ctx / folder).items()):
            h.update(f"{folder}/{rel}:{file_sha256(path)}\n".encode())
    for rel, path in import_closure(SRC_ROOT, SBOM_ENTRIES).items():
        h.update(f"code/{rel}:{file_sha256(path)}\n".encode())
    h.update(init_stub(SRC_ROOT).encode())
    try:
        h.update(b"cyclonedx:" + md.version("cyclonedx-python-lib").encode())
    except md.PackageNotFoundError:
        h.update(b"cyclonedx:none")  # build.sbom says what to install when it runs
    return h.hexdigest()


def stage_sbom(stack: Stack, lock: dict[str, Any], ctx: Path, *, progress=print) -> Path:
    """ctx/config/sbom.cdx.json, reused when the key of its inputs is the one it was made from."""
    key = sbom_key(stack, lock, ctx)
    dest, stamp = ctx / SBOM_IN_CONTEXT, ctx / KEY_FILE
    if dest.is_file() and stamp.is_file() and stamp.read_text().strip() == key:
        return dest
    stamp.unlink(missing_ok=True)  # never a key beside an SBOM it was not made with
    path = sbom.stage_sbom(stack, lock, ctx, progress=progress)
    atomic_write_text(stamp, key + "\n")
    return path
