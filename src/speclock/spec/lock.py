"""Lock files (`locks/<stack>.lock`): where they are, writing one, reading one with its checks, and
comparing it with its stack.

A lock is data (JSON) made by spec.resolve; code never hard-codes a version.

What a lock's checks prove, and what they do not:
- `lock_sha256` is a plain sha256 of the lock's content. It detects corruption and accidental
  hand edits. It proves NOTHING about authenticity: anyone can edit a lock and recompute it.
- Authenticity comes from `read_lock`'s provenance checks plus `speclock lock --check` against
  the (reviewed) stack file: every entry's filename is a plain file name equal to the basename of
  its URL, a wheel's name and version match the entry's, the URL is https on PyPI's hosts or on
  the host of an index a stack file names (file:// is still allowed for the one local torch wheel),
  and each sha256 is 64 hex digits. `lock --check` then says whether the lock was made from the
  stack as it is. A crafted lock can pass all of this only by naming real files on allowed indexes
  with their hashes - so a lock diff in a pull request still needs review (which versions, which
  indexes); the checks make sure that what the diff shows is what fetch downloads and installs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput
from speclock.core.files import atomic_write_json, clean_stale_temps, expect, plain_name, read_json
from speclock.core.layout import REPO_ROOT
from speclock.spec import baseimage
from speclock.spec.provenance import RELOCK, allowed_sources, check_base, check_entry, check_entry_shape
from speclock.spec.stack import Stack, canonical_sha256, pinned_view

LOCK_SCHEMA = "speclock.lock/v1"
ENTRY_LISTS = ("packages", "assets", "excluded")


def locks_dir(root: Path | None = None) -> Path:
    return (root or REPO_ROOT) / "locks"


def lock_path(stack: Stack, root: Path | None = None) -> Path:
    return locks_dir(root) / f"{stack.name}.lock"


def write_lock(path: Path, doc: dict[str, Any]) -> None:
    """Write atomically (fsynced): a crash leaves the old lock or the new one, never half of one.

    Temps a killed writer left beside it go first (only ones untouched for 10 minutes: a lock is
    written in well under a second, so an older temp belongs to no running writer)."""
    clean_stale_temps(Path(path).parent, older_than_s=600)
    atomic_write_json(path, doc, indent=1, sort_keys=True)


def read_lock(path: Path, *, stack: Stack | None = None) -> dict[str, Any]:
    """Read a lock and check its shape, hash and provenance; BadInput (exit 2) names the file and key.

    Nothing is written or downloaded before this passes, so a filename with '../' or a URL on an
    unknown host is refused before fetch touches the disk. `stack` (when given) adds its index's host
    to the allowed ones."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"no lock file {path}", hint=f"run `speclock lock --stack {path.stem}`")
    doc = read_json(path, what="lock file", expect=dict, hint=RELOCK)
    if doc.get("schema") != LOCK_SCHEMA:
        raise BadInput(f"{path}: schema is {str(doc.get('schema'))[:80]!r}, expected {LOCK_SCHEMA!r}", hint=RELOCK)
    for key, types in (("stack", str), ("stack_sha256", str), ("packages", list), ("assets", list),
                       ("base", dict), ("lock_sha256", str)):
        if key not in doc:
            raise BadInput(f"{path}: key '{key}' is missing", hint=RELOCK)
        expect(doc[key], types, key, path=path, hint=RELOCK)
    for key, types in (("excluded", list), ("stack_data", dict), ("python", dict), ("resolver", dict),
                       ("kernel_base", dict), ("source_date_epoch", int)):
        if key in doc:
            expect(doc[key], types, key, path=path, hint=RELOCK)
    plain_name(doc["stack"], what="stack", source=path)
    for key in ENTRY_LISTS:
        for i, entry in enumerate(doc.get(key, [])):
            check_entry_shape(entry, f"{key}[{i}]", path)
    check_base(doc["base"], "base", path)
    if "kernel_base" in doc:
        check_base(doc["kernel_base"], "kernel_base", path)
    # The hash first (it names corruption and hand edits as such), then what a recomputed hash cannot hide.
    expected = canonical_sha256({k: v for k, v in doc.items() if k != "lock_sha256"})
    if expected != doc["lock_sha256"]:
        raise BadInput(f"{path}: content does not match its lock_sha256 (edited by hand, or corrupted)",
                       hint=RELOCK)
    hosts, declared = allowed_sources(path, stack)
    for key in ENTRY_LISTS:
        for i, entry in enumerate(doc.get(key, [])):
            check_entry(entry, f"{key}[{i}]", path, hosts, declared)
    return doc


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    return [] if old == new else [f"{prefix}: lock has {old!r}, stack says {new!r}"]


def _base_diffs(stack: Stack, doc: dict[str, Any]) -> list[str]:
    """The lock's base recipes against what the stack gives (they are not covered by stack_sha256)."""
    out = []
    wanted = {"base": None}
    if "kernel_base" in doc or stack.kernels:
        wanted["kernel_base"] = list(stack.data.get("kernels", {}).get("builder_packages") or [])
    for key, extra in wanted.items():
        have = doc.get(key)
        if not isinstance(have, dict):
            out.append(f"{key}: missing from the lock")
            continue
        if stack.base["kind"] == "image":
            out += _diff({"kind": have.get("kind"), "ref": have.get("ref")}, {"kind": "image", "ref": stack.base["ref"]}, key)
            continue
        rec = have.get("recipe") or {}
        out += _diff(rec, baseimage.recipe(stack, rec.get("source_date_epoch", 0), extra), f"{key}.recipe")
    return out


def check_lock(stack: Stack, doc: dict[str, Any]) -> list[str]:
    """What differs between the stack file and what its lock was made from (empty = in sync)."""
    if doc["stack_sha256"] == stack.source_sha256:
        return _base_diffs(stack, doc)  # same stack: the recipes must be the ones it gives
    return _diff(pinned_view(doc.get("stack_data", {})), pinned_view(stack.data)) or ["stack content hash differs"]


def lock_summary(doc: dict[str, Any]) -> str:
    total = sum(1 for _ in doc["packages"])
    return f"{doc['stack']}: {total} packages, {len(doc['assets'])} data wheels, base {doc['base'].get('sha256', doc['base'].get('ref', ''))[:19]}, lock {doc['lock_sha256'][:12]}"

