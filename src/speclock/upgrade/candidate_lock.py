"""The upgrade's candidate lock: resolved at the current lock's versions wherever the candidate allows them, and
what it changes against the current lock.

An engine bump moves the engine and whatever the new engine requires; a patch-only candidate moves nothing. A
fresh resolve would also move every dependency the package index released since the current lock, so the gate
would judge the engine change mixed with unrelated ones, and the candidate image would share no venv layer with
the current one. `--relock` resolves again; it keeps the current versions the same way."""

from __future__ import annotations

from speclock.core.errors import BadInput
from speclock.core.heartbeat import Progress
from speclock.core.names import normalize
from speclock.spec.lock import LockDoc, check_lock, lock_path, read_lock, write_lock
from speclock.spec.resolve import resolve_lock
from speclock.upgrade.candidate import Candidate


def current_lock(cand: Candidate) -> LockDoc | None:
    """The current stack's lock (the CI mode's candidate lock is the checkout's own; None where there is none)."""
    path = lock_path(cand.current)
    if not path.is_file() or path == cand.lock_file:
        return None
    return read_lock(path)


def lock_candidate(cand: Candidate, current: LockDoc | None, *, relock: bool, progress: Progress) -> LockDoc:
    """Resolve the candidate's lock at the `current` lock's versions (current_lock), reusing one already resolved for
    exactly this candidate and current lock."""
    kept_from = current["lock_sha256"] if current else None
    if cand.lock_file.is_file() and not relock:
        try:
            doc = read_lock(cand.lock_file)
            if not check_lock(cand.stack, doc) and (doc.get("resolver") or {}).get("kept_from") == kept_from:
                progress(f"  reusing the candidate lock {cand.lock_file} (in sync; --relock resolves again)")
                return doc
        except BadInput:
            pass
    doc = resolve_lock(cand.stack, progress=progress, keep_from=current)
    write_lock(cand.lock_file, doc)
    return doc


def lock_changes(current: LockDoc, candidate: LockDoc) -> list[str]:
    """The image packages the candidate lock installs otherwise than the current one: 'name a -> b', '+name b',
    '-name a' (sorted by name)."""
    before = {normalize(p["name"]): p for p in current["packages"]}
    after = {normalize(p["name"]): p for p in candidate["packages"]}
    out = []
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        if a is None and b is not None:
            out.append(f"+{b['name']} {b['version']}")
        elif b is None and a is not None:
            out.append(f"-{a['name']} {a['version']}")
        elif a is not None and b is not None and (a["version"], a["sha256"]) != (b["version"], b["sha256"]):
            out.append(
                f"{b['name']} {a['version']} -> {b['version']}" + ("" if a["version"] != b["version"] else " (other wheel)")
            )
    return out


def changes_text(changed: list[str], limit: int | None = None) -> str:
    """'2 packages changed against the current lock: a 1 -> 2, +b 3' (the first `limit` named)."""
    if not changed:
        return "no package changed against the current lock"
    shown = changed if limit is None else changed[:limit]
    more = f" (+{len(changed) - len(shown)} more)" if len(changed) > len(shown) else ""
    return f"{len(changed)} package(s) changed against the current lock: {', '.join(shown)}{more}"
