"""The one image label vocabulary: every label a speclock image carries, its key and its value (docs/labels.md)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

from speclock import __version__
from speclock.core.layout import REPO_ROOT
from speclock.patches.series import load_series, series_label
from speclock.spec.lock import LockDoc
from speclock.spec.stack import Stack

# Our keys live under this prefix; nix/image-spec.nix reads it from this file (by regex).
LABEL_PREFIX = "io.speclock"
OCI_PREFIX = "org.opencontainers.image"
DEFAULT_SOURCE_URL = "https://github.com/speclock/speclock"
# speclock's own license (pyproject.toml's `license`; tests/test_build_labels.py keeps the two equal).
# The image also holds third-party software under its own licenses: docs/labels.md says what this means.
LICENSES = "Apache-2.0"
DIRTY_SUFFIX = "+dirty"


def source_url() -> str:
    """org.opencontainers.image.source: SPECLOCK_SOURCE_URL, else the checkout's origin remote, else the project's URL."""
    if os.environ.get("SPECLOCK_SOURCE_URL"):
        return os.environ["SPECLOCK_SOURCE_URL"]
    proc = subprocess.run(["git", "-C", str(REPO_ROOT), "remote", "get-url", "origin"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else DEFAULT_SOURCE_URL


def documentation_url(source: str) -> str:
    """org.opencontainers.image.documentation: the README of the source repository (an https source),
    else the project's."""
    base = source.removesuffix(".git") if source.startswith("https://") else DEFAULT_SOURCE_URL
    return f"{base}#readme"


def is_dirty(revision: str) -> bool:
    """Whether a revision (org.opencontainers.image.revision) says the inputs had uncommitted edits."""
    return revision.endswith(DIRTY_SUFFIX)


def base_labels(lock: LockDoc) -> dict[str, str]:
    """org.opencontainers.image.base.name / base.digest of the locked base.

    A registry image (base kind `image`, pinned `name@sha256:...`): its name and manifest digest. A locked
    Debian rootfs: the local image it is imported as and the sha256 of the rootfs tarball (there is no
    registry manifest: the tarball is what the lock pins)."""
    base = lock["base"]
    if base.get("kind") == "image":
        name, _, digest = base["ref"].partition("@")
        return {f"{OCI_PREFIX}.base.name": name, f"{OCI_PREFIX}.base.digest": digest}
    return {
        f"{OCI_PREFIX}.base.name": f"localhost/speclock-base:{base['sha256'][:16]}",
        f"{OCI_PREFIX}.base.digest": f"sha256:{base['sha256']}",
    }


def patches_label(stack: Stack, patches_root: Path | None = None) -> tuple[str, str]:
    """(key, value) of the patches label: exactly what `speclock patches label` prints for the series.

    `patches_root`: where patches/<engine>/ lives (the staged build context's copy, so the label names
    the files the image applied); default the patches folder `speclock patches` reads."""
    return series_label(load_series(stack, patches_root))


def prune_label(lock: LockDoc) -> str:
    """io.speclock.prune: what the image leaves out, as the lock records it ([prune], docs/prune.md): compact JSON
    {"packages": [...], "paths": [...]}, or "none" for a stack without [prune]."""
    record = lock.get("prune")
    if not isinstance(record, dict) or not any(record.get(k) for k in ("packages", "paths")):
        return "none"
    return json.dumps(
        {"packages": list(record.get("packages") or []), "paths": list(record.get("paths") or [])}, separators=(",", ":")
    )


def labels_for(
    stack: Stack,
    lock: LockDoc,
    tag: str,
    inputs: str,
    revision: str,
    *,
    patches_root: Path | None = None,
    sbom: str | None = None,
) -> dict[str, str]:
    """Every label of the stack's image; values are fixed by the inputs (no wall clock), so buildah
    builds stay reproducible. `sbom`: where the image holds its SBOM (Containerfile builds; the Nix
    image has none yet, so it gets no such label)."""
    epoch = lock["source_date_epoch"]
    engine = stack.engine
    patches_key, patches_value = patches_label(stack, patches_root)
    source = source_url()
    return {
        f"{OCI_PREFIX}.title": f"speclock-{stack.name}",
        f"{OCI_PREFIX}.description": stack.data.get("description", ""),
        f"{OCI_PREFIX}.source": source,
        f"{OCI_PREFIX}.documentation": documentation_url(source),
        f"{OCI_PREFIX}.licenses": LICENSES,
        f"{OCI_PREFIX}.revision": revision,
        # The reproducible timestamp (the lock's SOURCE_DATE_EPOCH), not the wall clock.
        f"{OCI_PREFIX}.created": dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        # What the image packages: the engine at its pinned version, the content tag as build metadata.
        f"{OCI_PREFIX}.version": f"{engine['version']}+{tag}",
        **base_labels(lock),
        f"{LABEL_PREFIX}.speclock-version": __version__,
        f"{LABEL_PREFIX}.dirty": "true" if is_dirty(revision) else "false",
        f"{LABEL_PREFIX}.stack": stack.name,
        f"{LABEL_PREFIX}.inputs-sha256": inputs,
        f"{LABEL_PREFIX}.lock-sha256": lock["lock_sha256"],
        f"{LABEL_PREFIX}.engine": engine["name"],
        f"{LABEL_PREFIX}.engine-package": engine["package"],
        f"{LABEL_PREFIX}.engine-version": engine["version"],
        f"{LABEL_PREFIX}.torch-version": stack.torch["version"],
        f"{LABEL_PREFIX}.cuda": stack.gpu["cuda"] or "none",
        f"{LABEL_PREFIX}.archs": ",".join(stack.gpu["archs"]) or "none",
        patches_key: patches_value,
        f"{LABEL_PREFIX}.base": lock["base"].get("sha256") or lock["base"].get("ref", ""),
        f"{LABEL_PREFIX}.prune": prune_label(lock),
        **({f"{LABEL_PREFIX}.sbom": sbom} if sbom else {}),
    }
