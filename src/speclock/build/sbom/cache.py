"""The image's SBOM, reused by the hash of what makes it: a warm rebuild after a source edit need not make
it again (0.23 s of a 1.4 s rebuild on 2 cores, docs/benchmarks.md).

The key is read from digests build-image computes anyway (build.inputs.context_digests), so it costs no
hashing of its own: the lock (its packages, assets and base rootfs), the staged stack file, patches and
drafter, speclock's version, the CycloneDX library's version, and the code that writes the document
(SBOM_CODE, as staged under config/src). Documents live under $SPECLOCK_CACHE/sbom/documents/<key>.json,
written whole (atomic) after the fresh document passed validation (build.sbom.document.sbom_text); one that is not a
whole JSON document is made again."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
from pathlib import Path

from speclock import __version__
from speclock.build.context import sync_text
from speclock.build.sbom.document import stage_sbom
from speclock.build.sbom.format import SBOM_IN_CONTEXT
from speclock.core.files import atomic_write_text
from speclock.core.heartbeat import Progress
from speclock.core.layout import cache_dir
from speclock.spec.lock import LockDoc
from speclock.spec.stack import Stack

# The staged files the document is made from (besides the lock) and the modules that make it: an edit of
# any of them makes a new document; an edit of the rest of speclock's source reuses the old one.
SBOM_INPUTS = ("draft/", "patches/", "config/stacks/")
SBOM_CODE = (
    "config/src/speclock/build/sbom/document.py",
    "config/src/speclock/build/sbom/format.py",
    "config/src/speclock/build/sbom/packages.py",
    "config/src/speclock/build/sbom/cache.py",
    "config/src/speclock/build/sbom/rootfs.py",
    "config/src/speclock/build/context.py",
    "config/src/speclock/core/names.py",
    "config/src/speclock/spec/baseimage.py",
)


def sbom_key(stack: Stack, lock: LockDoc, digests: dict[str, str]) -> str:
    """The document's cache key, from the context digests (build.inputs.context_digests)."""
    try:
        library = md.version("cyclonedx-python-lib")
    except md.PackageNotFoundError:
        library = "none"
    h = hashlib.sha256()
    h.update(f"stack:{stack.name}\nlock:{lock['lock_sha256']}\nspeclock:{__version__}\ncyclonedx:{library}\n".encode())
    for rel, digest in sorted(digests.items()):
        if rel.startswith(SBOM_INPUTS) or rel in SBOM_CODE:
            h.update(f"{rel}:{digest}\n".encode())
    return h.hexdigest()


def documents_dir() -> Path:
    return cache_dir() / "sbom" / "documents"


def stage_sbom_cached(stack: Stack, lock: LockDoc, ctx: Path, digests: dict[str, str], *, progress: Progress = print) -> Path:
    """build.sbom.document.stage_sbom, answered from the cache when the key names a document made before."""
    key = sbom_key(stack, lock, digests)
    kept = documents_dir() / f"{key}.json"
    dest = ctx / SBOM_IN_CONTEXT
    text = _read_kept(kept)
    if text is None:
        stage_sbom(stack, lock, ctx, progress=progress)
        try:
            atomic_write_text(kept, dest.read_text())
        except OSError:
            pass  # best effort: a read-only cache only means making it again next time
        return dest
    sync_text(dest, text)
    return dest


def _read_kept(path: Path) -> str | None:
    """A kept document, or None (missing or not a whole JSON document: made again, never staged half)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.startswith("{") and text.rstrip().endswith("}") else None
