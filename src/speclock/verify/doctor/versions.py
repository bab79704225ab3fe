"""Doctor's version checks: every locked package has its locked version in the engine's Python (lock-versions)."""

from __future__ import annotations

from pathlib import Path

from speclock.build.hostenv.command import RECORD, read_record, version_matches
from speclock.core.errors import BadInput
from speclock.core.files import expect, read_json
from speclock.core.layout import IMAGE, in_image
from speclock.core.names import normalize
from speclock.verify.doctor.context import Check, Context


def host_provided(ctx: Context) -> set[str]:
    """Packages a host environment took from the host (`speclock host-env --use-host-packages`): host-env checked
    their versions, not their hashes, and recorded them in $SPECLOCK_HOME/host-env.json. Empty in an image."""
    record_path = IMAGE.root / RECORD
    if not in_image() or not record_path.is_file() or Path(ctx.lock_path or "") != IMAGE.lock_file:
        return set()
    record = read_record(IMAGE.root.parent)  # IMAGE.root is DIR/speclock in a host environment
    rows = expect(record.get("version_checked", []), list, "version_checked", path=record_path)
    return {normalize(r["name"]) for r in rows if isinstance(r, dict) and isinstance(r.get("name"), str)}


def check_lock(ctx: Context) -> Check:
    if not ctx.lock_path or not ctx.lock_path.is_file():
        return Check("lock-versions", "warn", f"no lock file at {ctx.lock_path}: versions not compared (run `speclock lock`)")
    hint = "regenerate it with `speclock lock`"
    lock = read_json(Path(ctx.lock_path), what="lock", hint="fix or regenerate the file")
    if lock.get("schema") != "speclock.lock/v1" or not isinstance(lock.get("packages"), list):
        raise BadInput(f"{ctx.lock_path}: not a speclock.lock/v1 lock", hint=hint)
    for i, pkg in enumerate(lock["packages"]):
        expect(pkg, dict, f"packages[{i}]", path=ctx.lock_path, hint=hint)
        expect(pkg.get("name"), str, f"packages[{i}].name", path=ctx.lock_path, hint=hint)
        expect(pkg.get("version"), str, f"packages[{i}].version", path=ctx.lock_path, hint=hint)
    for i, item in enumerate(expect(lock.get("excluded", []), list, "excluded", path=ctx.lock_path, hint=hint)):
        name = item.get("name") if isinstance(item, dict) else item
        expect(name, str, f"excluded[{i}]" + (".name" if isinstance(item, dict) else ""), path=ctx.lock_path, hint=hint)
    answer = ctx.engine_answers.get("dists")
    if not answer or not answer["ok"]:
        return Check(
            "lock-versions",
            "fail",
            f"could not list the engine Python's packages: {(answer or {}).get('error', ctx.python_note)}",
        )
    have = {normalize(k): v for k, v in answer["result"].items()}
    excluded = {normalize(n["name"] if isinstance(n, dict) else n) for n in lock.get("excluded", [])}
    wrong, missing = [], []
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

    def questions(self, ctx: Context) -> dict[str, list]:
        return {"dists": ["dists", []]}

    def run(self, ctx: Context) -> Check:
        return check_lock(ctx)
