"""The one image label vocabulary: every label a speclock image carries, its key and its value (docs/labels.md)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path
from typing import Any

from speclock import __version__
from speclock.core.layout import REPO_ROOT
from speclock.patches.series import load_series, series_label
from speclock.spec.stack import Stack

# Our keys live under this prefix; nix/image-spec.nix reads it from this file (by regex).
LABEL_PREFIX = "io.speclock"
OCI_PREFIX = "org.opencontainers.image"
DEFAULT_SOURCE_URL = "https://github.com/speclock/speclock"


def source_url() -> str:
    """org.opencontainers.image.source: SPECLOCK_SOURCE_URL, else the checkout's origin remote, else the project's URL."""
    if os.environ.get("SPECLOCK_SOURCE_URL"):
        return os.environ["SPECLOCK_SOURCE_URL"]
    proc = subprocess.run(["git", "-C", str(REPO_ROOT), "remote", "get-url", "origin"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else DEFAULT_SOURCE_URL


def patches_label(stack: Stack, patches_root: Path | None = None) -> tuple[str, str]:
    """(key, value) of the patches label: exactly what `speclock patches label` prints for the series.

    `patches_root`: where patches/<engine>/ lives (the staged build context's copy, so the label names
    the files the image applied); default the patches folder `speclock patches` reads."""
    return series_label(load_series(stack, patches_root))


def labels_for(stack: Stack, lock: dict[str, Any], tag: str, inputs: str, revision: str, *,
               patches_root: Path | None = None) -> dict[str, str]:
    """Every label of the stack's image; values are fixed by the inputs (no wall clock), so buildah
    builds stay reproducible."""
    epoch = lock["source_date_epoch"]
    engine = stack.engine
    patches_key, patches_value = patches_label(stack, patches_root)
    return {
        f"{OCI_PREFIX}.title": f"speclock-{stack.name}",
        f"{OCI_PREFIX}.description": stack.data.get("description", ""),
        f"{OCI_PREFIX}.source": source_url(),
        f"{OCI_PREFIX}.revision": revision,
        # The reproducible timestamp (the lock's SOURCE_DATE_EPOCH), not the wall clock.
        f"{OCI_PREFIX}.created": dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        f"{OCI_PREFIX}.version": f"{__version__}+{tag}",
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
    }
