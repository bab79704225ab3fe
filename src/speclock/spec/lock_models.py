"""The lock's `models`: the identity of each model folder a stack names that no wheel pins (issue #36).

A stack with `target.path` (a Hugging Face folder mounted at run time, not built into the image) and a stack whose
`draft.path` is absolute (a drafter outside the repository) get, in their lock:

    "models": {"target": {"path": "models/Kimi-K2.5", "identity": {speclock.model-identity/v1 ...}}}

The identity is part of what lock_sha256 hashes, so a different model is a different lock and a different image tag.
Where the folder is not on the machine that locks (a 1 TB target lives on the GPU host), the record says so:
{"path": ..., "identity": null, "not_pinned": why}; the lock is written with a WARN, and doctor and smoke WARN
"model not pinned" instead of comparing. Stacks whose target ships in a wheel (target.package) have no `models`
key: their locks keep their bytes. What an identity covers, and what not: spec.model_identity.
"""

from __future__ import annotations

import os
from pathlib import Path

from speclock.core.errors import BadInput
from speclock.core.files import confined
from speclock.core.heartbeat import Progress
from speclock.core.layout import REPO_ROOT
from speclock.spec.lock_types import LockDoc, ModelRecord
from speclock.spec.model_identity import check_identity, identity_differences, model_identity
from speclock.spec.provenance import RELOCK
from speclock.spec.stack import Stack

MODEL_KEYS = ("target", "draft")


def pinned_folders(stack: Stack, root: Path | None = None) -> dict[str, tuple[str, Path]]:
    """{"target": (path as the stack gives it, the folder)} for target.path, and "draft" for an absolute draft.path
    (a relative one is a folder of the repository, copied into the image with it). `root`: the checkout relative
    paths are in (default this one, as at run time: drafter.models.target_folder)."""
    out: dict[str, tuple[str, Path]] = {}
    rel = stack.target["path"]
    if rel:
        out["target"] = (rel, Path(rel) if os.path.isabs(rel) else confined(root or REPO_ROOT, rel, what="target.path"))
    draft = stack.draft["path"]
    if draft and os.path.isabs(draft):
        out["draft"] = (draft, Path(draft))
    return out


def _relock(stack: Stack) -> str:
    return f"`speclock lock --stack {stack.name} --no-resolve` (on a machine that has the model, to pin it)"


def model_records(stack: Stack, *, root: Path | None = None, progress: Progress = print) -> dict[str, ModelRecord] | None:
    """The lock's `models` for this stack (None: it names no such folder, and the lock gets no `models` key).
    A folder that is not there is recorded as not pinned, with a WARN; one that is there but broken is refused."""
    folders = pinned_folders(stack, root)
    if not folders:
        return None
    out: dict[str, ModelRecord] = {}
    for what, (declared, folder) in folders.items():
        if not folder.exists() and not folder.is_symlink():
            why = f"{declared} was not there when the lock was made"  # the stack's path: the same lock on every machine
            progress(
                f"WARN: {what}.path: {folder} is not there, so the lock does not pin the model: any folder served as the "
                f"{what} will run (doctor and smoke say 'model not pinned'); run {_relock(stack)}"
            )
            out[what] = {"path": declared, "identity": None, "not_pinned": why}
            continue
        progress(f"{what}: identity of {folder}")
        out[what] = {"path": declared, "identity": model_identity(folder)}
    return out


def check_models(value: dict[str, ModelRecord], path: str | os.PathLike[str]) -> None:
    """The rules of a read lock's `models` that fits its model (read_lock): BadInput naming the key."""
    for what, rec in value.items():
        where = f"models.{what[:40]}"
        if what not in MODEL_KEYS:
            raise BadInput(f"{path}: {where} is not a model a lock records ({', '.join(MODEL_KEYS)})", hint=RELOCK)
        if rec["identity"] is None:
            if "not_pinned" not in rec:
                raise BadInput(
                    f"{path}: key '{where}.not_pinned': missing (string belongs there: why it is not pinned)", hint=RELOCK
                )
        else:
            check_identity(rec["identity"], f"{where}.identity", path, RELOCK)


def model_diffs(stack: Stack, doc: LockDoc, root: Path | None = None) -> list[str]:
    """`lock --check`: the lock's `models` against the folders the stack names and what is in them now. A folder
    absent here is not compared (the model lives on another machine); a changed one is named file by file."""
    want = pinned_folders(stack, root)
    have = doc.get("models") or {}
    out = []
    for what in MODEL_KEYS:
        rec = have.get(what)
        if what not in want:
            if rec is not None:
                out.append(f"models.{what}: the lock pins {rec['path']}, the stack names no such folder")
            continue
        declared, folder = want[what]
        if rec is None:
            out.append(f"models.{what}: the lock does not record the model at {declared}; run {_relock(stack)}")
            continue
        if rec["path"] != declared:
            out.append(f"models.{what}.path: lock has {rec['path']!r}, stack says {declared!r}")
            continue
        if not folder.exists() and not folder.is_symlink():
            continue
        locked = rec.get("identity")
        if locked is None:
            out.append(
                f"models.{what}: the lock does not pin the model ({rec.get('not_pinned')}); it is here now: run {_relock(stack)}"
            )
            continue
        for name, differs in identity_differences(locked, model_identity(folder, like=locked)):
            out.append(f"models.{what}.identity: {folder / name}: {differs}")
    return out
