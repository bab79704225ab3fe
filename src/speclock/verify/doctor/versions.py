"""Doctor's version checks: every locked package has its locked version in the engine's Python (lock-versions).

The lock is read through its model (spec.lock_types.LockFile, validated by speclock.core.docmodel: the file and
the key path of what does not fit, exit 2), the host environment's record through its own (build.hostenv.record).
Neither is the full read_lock: doctor compares versions, fetch and build check hashes and provenance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from speclock.build.hostenv.host import version_matches
from speclock.build.hostenv.record import RECORD, read_record
from speclock.core.docmodel import validate
from speclock.core.errors import BadInput
from speclock.core.files import read_json
from speclock.core.layout import IMAGE, in_image
from speclock.core.names import normalize
from speclock.spec.lock import LOCK
from speclock.spec.lock_types import LockFile
from speclock.verify.doctor.context import Check, Context


def host_provided(ctx: Context) -> set[str]:
    """Packages a host environment took from the host (`speclock host-env --use-host-packages`): host-env checked
    their versions, not their hashes, and recorded them in $SPECLOCK_HOME/host-env.json. Empty in an image."""
    record_path = IMAGE.root / RECORD
    if not in_image() or not record_path.is_file() or Path(ctx.lock_path or "") != IMAGE.lock_file:
        return set()
    record = read_record(IMAGE.root.parent)  # IMAGE.root is DIR/speclock in a host environment
    return {normalize(r["name"]) for r in record["version_checked"]}


def read_doctor_lock(path: Path) -> LockFile:
    """The lock at `path`, validated against its model (LockFile); BadInput naming the file and the key path."""
    lock = read_json(path, what="lock", hint="fix or regenerate the file")
    if lock.get("schema") != "speclock.lock/v1":  # another document, or another version of this one
        raise BadInput(f"{path}: not a speclock.lock/v1 lock", hint=LOCK.hint)
    validate(LOCK, lock, str(path))
    return cast(LockFile, lock)


def check_lock(ctx: Context) -> Check:
    if not ctx.lock_path or not ctx.lock_path.is_file():
        return Check("lock-versions", "warn", f"no lock file at {ctx.lock_path}: versions not compared (run `speclock lock`)")
    lock = read_doctor_lock(Path(ctx.lock_path))
    answer = ctx.engine_answers.get("dists")
    if not answer or not answer["ok"]:
        return Check(
            "lock-versions",
            "fail",
            f"could not list the engine Python's packages: {(answer or {}).get('error', ctx.python_note)}",
        )
    have = {normalize(k): v for k, v in answer["result"].items()}
    excluded = {normalize(n["name"]) for n in lock.get("excluded", [])}
    wrong: list[str] = []
    missing: list[str] = []
    # A host's CUDA build of the locked release (2.11.0+cu130 for 2.11.0 on a CUDA 13.0 stack) is the locked one.
    from_host, cuda = host_provided(ctx), ctx.stack.gpu["cuda"]
    for pkg in lock["packages"]:
        name = normalize(pkg["name"])
        if name in excluded:
            continue
        if name not in have:
            missing.append(f"{pkg['name']}=={pkg['version']}")
        elif have[name] != pkg["version"] and not (name in from_host and version_matches(have[name], pkg["version"], cuda)):
            wrong.append(f"{pkg['name']} {have[name]} (lock: {pkg['version']})")
    n = len([p for p in lock["packages"] if normalize(p["name"]) not in excluded])
    if wrong or missing:
        parts = ([f"{len(wrong)} differ: " + ", ".join(wrong[:5])] if wrong else []) + (
            [f"{len(missing)} missing: " + ", ".join(missing[:5])] if missing else []
        )
        return Check("lock-versions", "fail", "; ".join(parts), {"differ": wrong, "missing": missing})
    note = f" ({len(from_host)} from the host, version-checked, not hash-checked)" if from_host else ""
    return Check(
        "lock-versions",
        "pass",
        f"all {n} locked packages have the locked version{note}",
        {"lock": str(ctx.lock_path), "from_host": sorted(from_host)},
    )


class LockVersions:
    name = "lock-versions"
    needs_engine = True

    def questions(self, ctx: Context) -> dict[str, list[Any]]:
        return {"dists": ["dists", []]}

    def run(self, ctx: Context) -> Check:
        return check_lock(ctx)
