"""Lock files (`locks/<stack>.lock`): where they are, writing one, reading one with its checks, and
comparing it with its stack.

A lock is data (JSON) made by spec.resolve; code never hard-codes a version.

What a lock's checks prove, and what they do not:
- `lock_sha256` is a plain sha256 of the lock's content. It detects corruption and accidental
  hand edits. It proves NOTHING about authenticity: anyone can edit a lock and recompute it.
- Authenticity comes from `read_lock`'s provenance checks plus `speclock lock --check` against
  the (reviewed) stack file: every entry's filename is a plain file name equal to the basename of
  its URL, a wheel's name and version match the entry's, the URL is https on PyPI's hosts or on
  the host of an index a stack file names, and each sha256 is 64 hex digits. read_lock still reads a
  file:// url (tests' tiny locks use them), but `lock --check` fails on one (`local_entries`): a
  committed lock names index URLs, a local copy only as mirror_url. `lock --check` then says whether the lock was made from the
  stack as it is. A crafted lock can pass all of this only by naming real files on allowed indexes
  with their hashes - so a lock diff in a pull request still needs review (which versions, which
  indexes); the checks make sure that what the diff shows is what fetch downloads and installs.

Targets. A lock holds one resolved package set per target (a Python version x a machine):
- the IMAGE target (python.version, python.platforms = the base's manylinux tags) is the lock's
  top-level `packages` / `excluded` / `assets`, exactly as before: every reader of those keeps working;
- each host target of the stack's python.host_targets ('3.12-x86_64') is an entry of `targets`:
  {"3.12-x86_64": {"python": "3.12", "machine": "x86_64", "platforms": [...], "packages": [...],
  "excluded": [...], "assets": [...]}}, entries of the same shape and the same provenance checks.
  A lock without host targets has no `targets` key (existing locks keep their bytes and their hash).
Models (docs/lock.md): a stack with target.path (or an absolute draft.path) gets `models`, the folder's identity
(spec.lock_models; hashed with the rest, so a different model is a different lock); `lock --check` names a changed file.
Pruning (docs/prune.md). A stack with a [prune] section gets a `prune` record ({"packages": normalized names, sorted;
"paths": the globs as declared}) and, per target, a `pruned` list: the entries of the pruned packages, resolved
(version and sha256 known) but never downloaded or installed, like `excluded`. A stack without [prune] has neither
key. `lock --check` compares the record with the stack's [prune] (`prune_diffs`).
MACHINE_PLATFORMS is the one place that maps a machine to the wheel platform tags its targets accept.
`target_lock(doc, key)` gives the lock as that target sees it (its packages as `packages`), which is
what a host environment carries as its lock.json.
The document's types (LockDoc, LockEntry, ...) are in spec/lock_types.py; this module re-exports the ones others import.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, cast

from speclock.core.docmodel import DocModel, validate
from speclock.core.errors import BadInput
from speclock.core.files import absent, atomic_write_json, clean_stale_temps, plain_name, read_json
from speclock.core.layout import REPO_ROOT
from speclock.core.names import normalize
from speclock.spec import baseimage
from speclock.spec.lock_models import check_models, model_diffs
from speclock.spec.lock_types import ENTRY_LISTS, LOCK_SCHEMA, HostTarget, LockFile, LockPython
from speclock.spec.lock_types import LockDoc as LockDoc
from speclock.spec.lock_types import LockEntry as LockEntry
from speclock.spec.lock_types import PruneRecord as PruneRecord
from speclock.spec.lock_types import TargetView as TargetView
from speclock.spec.provenance import RELOCK, allowed_sources, check_base, check_entry
from speclock.spec.stack import Stack, canonical_sha256, pinned_view

# The one map from a machine to the wheel platform tags a host target of that machine accepts (newest
# first). Adding a machine (e.g. riscv64) is a row here plus the machine in spec.validate's host_targets
# pattern; aarch64 (GH200, GB200) is already a row. glibc 2.34 is the ceiling (RHEL/Rocky 9 HPC nodes,
# Ubuntu 22.04+; vLLM needs llguidance's manylinux_2_31 wheel); host-env checks the host's glibc per wheel.
HOST_GLIBC_MAX = 34
MACHINE_PLATFORMS: dict[str, tuple[str, ...]] = {
    machine: tuple(f"manylinux_2_{n}_{machine}" for n in range(HOST_GLIBC_MAX, 16, -1))
    + (f"manylinux2014_{machine}", f"linux_{machine}")
    for machine in ("x86_64", "aarch64")
}
# The lock file's model (spec.lock_types.LockFile) at work: read_lock validates against it, `speclock schemas` writes
# schemas/lock.schema.json from it. Unknown keys are refused (why: spec.lock_types).
LOCK = DocModel(
    LockFile,
    LOCK_SCHEMA,
    "lock.schema.json",
    "speclock lock file",
    "refuse",
    RELOCK,
    wording="path",  # read_lock's messages before its model: "packages[0] is string ('torch'), where object ... belongs"
    refuse_why="a lock is the build's input, and a key an older speclock skipped would be a part of the image it did not build",
)
# The key of the image's own target (the lock's top-level packages) where a command takes a target name.
IMAGE_TARGET = "image"
TARGET_KEY = re.compile(r"(3\.\d+)-([a-z0-9_]+)")
_PLATFORM_TAG = re.compile(r"[a-z0-9_]+")


def split_target(key: str, *, source: str = "python.host_targets") -> tuple[str, str]:
    """('3.12', 'x86_64') from '3.12-x86_64'; BadInput for a malformed key or a machine MACHINE_PLATFORMS lacks."""
    m = TARGET_KEY.fullmatch(key) if isinstance(key, str) else None
    if not m:
        raise BadInput(f"{source}: {str(key)[:80]!r} is not a target '<python>-<machine>'", hint="e.g. '3.12-x86_64'")
    if m[2] not in MACHINE_PLATFORMS:
        raise BadInput(
            f"{source}: machine {m[2]!r} of target {key!r} has no wheel platform tags in speclock",
            hint=f"known machines: {', '.join(MACHINE_PLATFORMS)} (speclock.spec.lock.MACHINE_PLATFORMS)",
        )
    return m[1], m[2]


def machine_platforms(machine: str) -> list[str]:
    return list(MACHINE_PLATFORMS[machine])


def finish_lock(doc: LockDoc) -> LockDoc:
    """Set (or replace) the document's lock_sha256: the sha256 of everything else in it (a new dict, keys in order)."""
    out = doc.copy()
    out.pop("lock_sha256", None)
    out["lock_sha256"] = canonical_sha256(out)
    return out


def _lock_python(doc: LockDoc) -> LockPython:
    """The lock's `python`; an empty one for a lock without it (made before it was recorded)."""
    return doc.get("python") or {"version": "", "platforms": []}


def image_machine(doc: LockDoc) -> str:
    """The machine of the image target, from its platform tags (locks before targets: x86_64)."""
    platforms = _lock_python(doc).get("platforms") or []
    for machine in MACHINE_PLATFORMS:
        if platforms and all(str(p).endswith("_" + machine) for p in platforms):
            return machine
    return "x86_64"


def lock_targets(doc: LockDoc) -> dict[str, TargetView]:
    """Every target of a read lock: {'image': {...}, '3.12-x86_64': {...}}, each with python, machine,
    platforms, packages, excluded, assets (the image's from the top-level keys)."""
    py = _lock_python(doc)
    out: dict[str, TargetView] = {
        IMAGE_TARGET: {
            "python": py.get("version", ""),
            "machine": image_machine(doc),
            "platforms": list(py.get("platforms") or []),
            "packages": doc["packages"],
            "excluded": doc.get("excluded", []),
            "assets": doc["assets"],
            "pruned": doc.get("pruned", []),
        }
    }
    for key, target in (doc.get("targets") or {}).items():
        out[key] = {"excluded": [], "assets": [], "pruned": [], **target}
    return out


def target_names(doc: LockDoc) -> str:
    """'image (3.11-x86_64), 3.12-x86_64': how messages name a lock's targets."""
    targets = lock_targets(doc)
    image = targets[IMAGE_TARGET]
    return ", ".join([f"{IMAGE_TARGET} ({image['python']}-{image['machine']})", *[k for k in targets if k != IMAGE_TARGET]])


def lock_target(doc: LockDoc, key: str) -> TargetView:
    """One target of a read lock by key ('image' or '3.12-x86_64'); BadInput naming the targets it has."""
    targets = lock_targets(doc)
    if key not in targets:
        raise BadInput(
            f"the lock of stack {doc['stack']} has no target {key!r}; it has: {target_names(doc)}",
            hint=f"add '{key}' to python.host_targets in stacks/{doc['stack']}.toml and run "
            f"`speclock lock --stack {doc['stack']}`",
        )
    return targets[key]


def target_lock(doc: LockDoc, key: str) -> LockDoc:
    """The lock as one target sees it: that target's packages, excluded and assets as the top-level ones, its
    Python and platforms as `python`, no `targets`; `target` and `lock_from` (the full lock's sha256) say where
    it comes from. A valid lock of its own (re-hashed), so every lock reader takes it as it is."""
    t = lock_target(doc, key)
    out = doc.copy()
    out.pop("targets", None)
    out.pop("lock_sha256", None)
    out.update(
        {
            "python": {"version": t["python"], "platforms": t["platforms"]},
            "packages": t["packages"],
            "excluded": t["excluded"],
            "assets": t["assets"],
            "target": key,
            "lock_from": doc["lock_sha256"],
        }
    )
    if t["pruned"] or "pruned" in doc:
        out["pruned"] = t["pruned"]
    return finish_lock(out)


def locks_dir(root: Path | None = None) -> Path:
    return (root or REPO_ROOT) / "locks"


def lock_path(stack: Stack, root: Path | None = None) -> Path:
    return locks_dir(root) / f"{stack.name}.lock"


def write_lock(path: Path, doc: LockDoc) -> None:
    """Write atomically (fsynced): a crash leaves the old lock or the new one, never half of one.

    Temps a killed writer left beside it go first (only ones untouched for 10 minutes: a lock is
    written in well under a second, so an older temp belongs to no running writer)."""
    clean_stale_temps(Path(path).parent, older_than_s=600)
    atomic_write_json(path, doc, indent=1, sort_keys=True)


def read_lock(path: Path, *, stack: Stack | None = None) -> LockDoc:
    """Read a lock and check its shape, hash and provenance; BadInput (exit 2) names the file and key.

    Nothing is written or downloaded before this passes, so a filename with '../' or a URL on an
    unknown host is refused before fetch touches the disk. `stack` (when given) adds its index's host
    to the allowed ones."""
    path = Path(path)
    if absent(path):  # a link loop or a FIFO is not "no lock file": read_json names it
        raise BadInput(f"no lock file {path}", hint=f"run `speclock lock --stack {path.stem}`")
    data = read_json(path, what="lock file", expect=dict, hint=RELOCK)
    if data.get("schema") != LOCK_SCHEMA:  # another document, or another version of this one: its own model
        raise BadInput(f"{path}: schema is {str(data.get('schema'))[:80]!r}, expected {LOCK_SCHEMA!r}", hint=RELOCK)
    validate(LOCK, data, str(path))  # every key of its JSON type (the model, LockFile); an unknown key is refused
    doc = cast(LockFile, data)
    plain_name(doc["stack"], what="stack", source=path)
    for tkey, target in (doc.get("targets") or {}).items():
        _check_target(tkey, target, path)
    check_base(doc["base"], "base", path)
    if "kernel_base" in doc:
        check_base(doc["kernel_base"], "kernel_base", path)
    if "models" in doc:
        check_models(doc["models"], path)
    # The hash first (it names corruption and hand edits as such), then what a recomputed hash cannot hide.
    expected = canonical_sha256({k: v for k, v in doc.items() if k != "lock_sha256"})
    if expected != doc["lock_sha256"]:
        raise BadInput(f"{path}: content does not match its lock_sha256 (edited by hand, or corrupted)", hint=RELOCK)
    hosts, declared = allowed_sources(path, stack)
    for entry, where in _all_entries(doc):
        check_entry(entry, where, path, hosts, declared)
    return cast(LockDoc, doc)  # a LockFile is a LockDoc whose lock_sha256 is there


def _check_target(key: str, target: HostTarget, path: Path) -> None:
    """A host target's rules: its key names a known machine, python/machine agree with it, platform tags of it."""
    where = f"targets.{key[:40]}"
    python, machine = split_target(key, source=f"{path}: targets")
    for field, want in (("python", python), ("machine", machine)):
        have = target["python"] if field == "python" else target["machine"]
        if have != want:
            raise BadInput(f"{path}: {where}.{field} is {have[:40]!r}, the key says {want!r}", hint=RELOCK)
    for i, tag in enumerate(target["platforms"]):
        if not (_PLATFORM_TAG.fullmatch(tag) and tag.endswith("_" + machine)):
            raise BadInput(f"{path}: {where}.platforms[{i}] {tag[:80]!r} is not a wheel platform tag of {machine}", hint=RELOCK)


def _all_entries(doc: LockFile) -> Iterator[tuple[LockEntry, str]]:
    """(entry, where) for every package entry of every target."""
    for key in ENTRY_LISTS:
        for i, entry in enumerate(doc.get(key, [])):
            yield entry, f"{key}[{i}]"
    for tkey, target in (doc.get("targets") or {}).items():
        for key in ENTRY_LISTS:
            for i, entry in enumerate(target.get(key, [])):
                yield entry, f"targets.{tkey}.{key}[{i}]"


def local_entries(doc: LockDoc) -> list[tuple[str, LockEntry]]:
    """(where, entry) for every entry of every target whose url is a file:// URL (a file of one machine)."""
    out = []
    for tkey, target in lock_targets(doc).items():
        prefix = "" if tkey == IMAGE_TARGET else f"targets.{tkey}."
        for key in ENTRY_LISTS:
            for i, entry in enumerate(target[key]):
                if str(entry.get("url", "")).lower().startswith("file:"):
                    out.append((f"{prefix}{key}[{i}] ({entry.get('name')})", entry))
    return out


def portability_problems(doc: LockDoc, stack_name: str) -> list[str]:
    """What `lock --check` says of file:// URLs: one line per entry, naming it and the fix."""
    return [
        f"{where}.url {entry['url']} is a file on the machine that made the lock, which no other machine has; "
        f"run `speclock lock --stack {stack_name} --no-resolve` to record the URL of the index that serves it "
        "(the local copy stays as mirror_url), or lock again where its index is reachable"
        for where, entry in local_entries(doc)
    ]


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    return [] if old == new else [f"{prefix}: lock has {old!r}, stack says {new!r}"]


def _base_diffs(stack: Stack, doc: LockDoc) -> list[str]:
    """The lock's base recipes against what the stack gives (they are not covered by stack_sha256)."""
    out = []
    wanted: dict[Literal["base", "kernel_base"], list[str] | None] = {"base": None}
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
        rec = have.get("recipe")
        epoch = rec.get("source_date_epoch", 0) if rec else 0
        out += _diff(rec or {}, baseimage.recipe(stack, epoch, extra), f"{key}.recipe")
    return out


def check_lock(stack: Stack, doc: LockDoc) -> list[str]:
    """What differs between the stack file and what its lock was made from (empty = in sync)."""
    if doc["stack_sha256"] == stack.source_sha256:
        # same stack: the recipes must be the ones it gives, and the host targets the ones it names
        return _base_diffs(stack, doc) + _target_diffs(stack, doc) + prune_diffs(stack, doc) + model_diffs(stack, doc)
    return _diff(pinned_view(doc.get("stack_data", {})), pinned_view(stack.data)) or ["stack content hash differs"]


def prune_record(stack: Stack) -> PruneRecord:
    """What a lock records of the stack's [prune]: package names normalized and sorted, globs as declared."""
    return {"packages": sorted(normalize(n) for n in stack.prune["packages"]), "paths": list(stack.prune["paths"])}


def prune_diffs(stack: Stack, doc: LockDoc) -> list[str]:
    """The lock's prune record and pruned lists against the stack's [prune] (empty = in sync)."""
    want = prune_record(stack)
    have: PruneRecord = doc.get("prune") or {"packages": [], "paths": []}
    keys: tuple[Literal["packages", "paths"], ...] = ("packages", "paths")
    out = [
        f"prune.{key}: lock has {have.get(key, [])!r}, stack says {want[key]!r}" for key in keys if have.get(key, []) != want[key]
    ]
    for tkey, target in lock_targets(doc).items():
        installed = {normalize(e["name"]) for e in target["packages"]}
        pruned = {normalize(e["name"]) for e in target["pruned"]}
        for name in want["packages"]:
            if name in installed:
                out.append(f"prune.packages: {name} is pruned by the stack, but target {tkey} installs it")
        for name in sorted(pruned - set(want["packages"])):
            out.append(f"pruned: target {tkey} leaves out {name}, which the stack's [prune].packages does not name")
    return out


def _target_diffs(stack: Stack, doc: LockDoc) -> list[str]:
    have, want = sorted(doc.get("targets") or {}), sorted(stack.python["host_targets"])
    if "target" in doc:  # a host environment's lock.json (target_lock): one target, by design
        return []
    return [] if have == want else [f"python.host_targets: lock has {have!r}, stack says {want!r}"]


def lock_summary(doc: LockDoc) -> str:
    total = sum(1 for _ in doc["packages"])
    hosts = doc.get("targets") or {}
    extra = "".join(f", host target {k}: {len(t['packages'])} packages" for k, t in hosts.items())
    pruned = f" ({len(doc['pruned'])} pruned)" if doc.get("pruned") else ""
    return (
        f"{doc['stack']}: {total} packages{pruned}, {len(doc['assets'])} data wheels{extra}, "
        f"base {doc['base'].get('sha256', doc['base'].get('ref', ''))[:19]}, lock {doc['lock_sha256'][:12]}"
    )
