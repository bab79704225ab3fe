"""`speclock upgrade --promote`: a candidate that passed becomes the current stack, lock and baseline."""

from __future__ import annotations

import json
from pathlib import Path

from speclock.core.errors import CheckFailed
from speclock.core.files import atomic_write_text, read_text
from speclock.core.layout import REPO_ROOT
from speclock.spec.lock import lock_path, read_lock
from speclock.spec.pylock import pylock_path, write_lock_files
from speclock.upgrade.steps import UpgradeResult, default_baseline
from speclock.verify.profiles import report_profile


def promote(res: UpgradeResult, *, root: Path | None = None) -> list[Path]:
    """Make the passed candidate current: stack, lock and its report as the new baseline."""
    if not res.ok or res.after is None:
        raise CheckFailed("refusing to promote a candidate that did not pass", hint="read the summary")
    root = root or REPO_ROOT
    cand = res.candidate
    doc = read_lock(cand.lock_file)
    stack_dest = root / "stacks" / f"{cand.stack.name}.toml"
    base_dest = default_baseline(cand.stack, root, report_profile(res.after))  # the new baseline of the profile it ran
    atomic_write_text(base_dest, json.dumps(res.after, indent=2) + "\n")
    write_lock_files(lock_path(cand.stack, root), doc)  # the lock and its pylock, both or neither
    atomic_write_text(
        stack_dest, read_text(cand.stack.path, what="candidate stack")
    )  # last: the stack and its lock agree from here on
    res.promoted = True
    return [stack_dest, lock_path(cand.stack, root), pylock_path(lock_path(cand.stack, root)), base_dest]
