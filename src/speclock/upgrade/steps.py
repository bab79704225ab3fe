"""The upgrade's steps (lock, patches, build, doctor and smoke in the image, gate, soak in the image) and their result."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from speclock.build import records, wheelhouse
from speclock.build.builders import get_builder
from speclock.build.context import context_dir, context_lock, context_name, stage_context
from speclock.build.fetch import fetch as fetch_wheels
from speclock.build.image import build_image, selfcheck_image
from speclock.build.inputs import image_tag, inputs_hash
from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import absent, read_json
from speclock.core.heartbeat import Progress
from speclock.core.layout import REPO_ROOT
from speclock.core.names import normalize
from speclock.patches.series import check_series, load_series
from speclock.patches.trees import WheelTree
from speclock.spec.lock import LockDoc, read_lock
from speclock.spec.stack import Stack
from speclock.upgrade.candidate import Candidate
from speclock.upgrade.candidate_lock import changes_text, current_lock, lock_candidate, lock_changes
from speclock.upgrade.record import DoctorRow, SoakStepRecord, Step, UpgradeImage, UpgradeMetrics, UpgradeRecord
from speclock.upgrade.soak import DEFAULT_SOAK_S, Runner, image_runner, run_soak_step
from speclock.verify.gate import baseline_path, run_gate
from speclock.verify.profiles import report_profile, resolve_profile
from speclock.verify.report import load_report
from speclock.verify.report_types import CheckRecord, SmokeReport
from speclock.verify.selfcheck import env_args
from speclock.verify.selfcheck_record import SELFCHECK_FILE, read_selfcheck
from speclock.verify.smoke.inputs import SPEED_KEYS, SmokeOptions
from speclock.verify.soak import DEFAULT_MAX_DRIFT

UPGRADE_SCHEMA = "speclock.upgrade/v1"
T = TypeVar("T")


def default_baseline(stack: Stack, root: Path | None = None, profile: str = "quick") -> Path:
    return baseline_path((root or REPO_ROOT) / "baselines", stack.name, stack.engine["package"], stack.engine["version"], profile)


def choose_profile(stack: Stack, requested: str, baseline: Path | None) -> str:
    """The smoke profile the upgrade runs: an explicit --baseline's own; `auto` = full (256 tokens, per-position
    drift: the engines' own CI standard) where the current version has a full baseline, else quick."""
    if baseline is not None:
        got = report_profile(load_report(baseline))
        if requested not in ("auto", got):
            raise BadInput(
                f"--profile {requested}, but the --baseline {baseline} was measured with profile {got}",
                hint=f"pass --profile {got}, or a baseline of profile {requested}",
            )
        return got
    if requested != "auto":
        return requested
    return "full" if default_baseline(stack, profile="full").is_file() else "quick"


def require_baseline(stack: Stack, baseline: Path | None, profile: str = "quick") -> Path:
    path = baseline or default_baseline(stack, profile=profile)
    if absent(path):  # a folder or a FIFO there is not "does not exist": load_report names it
        raise BadInput(
            f"no baseline report for the current lock of stack {stack.name} "
            f"({stack.engine['package']} {stack.engine['version']}): {path} does not exist",
            hint=f"an upgrade is judged against the current image's measured acceptance: run "
            f"`speclock smoke --stack {stack.name} --profile {profile}` in the current image (build-image's "
            f"self-check writes a quick report.json) and commit that report as {path}, or pass "
            f"--baseline REPORT",
        )

    load_report(path)  # a broken baseline is bad input too, before any build starts
    return path


def engine_wheel(lock: LockDoc, package: str) -> Path:
    for pkg in lock["packages"]:
        if pkg["name"] == normalize(package):
            return wheelhouse.entry_path(pkg)
    raise BadInput(f"lock of stack {lock['stack']} has no {package}", hint="re-create the lock")


def check_patches(stack: Stack, lock: LockDoc) -> list[dict[str, Any]]:
    """The patch lifecycle against the candidate's own engine wheel (already fetched and verified)."""
    series = load_series(stack)
    if not series:
        return []
    results = check_series(series, WheelTree(engine_wheel(lock, stack.engine["package"])), stack.engine["version"])
    return [r.as_json() for r in results]


def find_built(stack: Stack, lock_file: Path, builder_name: str, *, progress: Progress) -> records.BuildRecord | None:
    """The build record of an image with exactly this candidate's inputs, if that image still exists.

    The tag comes the way build-image computes it: the context staged by build.context, hashed by build.inputs."""
    lock = read_lock(lock_file)
    with context_lock(context_name(stack, lock_file), progress):
        ctx = context_dir(stack, lock_file)
        fetch_wheels(lock, progress=lambda m: None)
        stage_context(stack, lock, ctx, lock_file=lock_file)
        tag = image_tag(inputs_hash(ctx, lock))
    record_file = records.records_dir(stack.name) / f"{tag}.{builder_name}.json"
    if not record_file.is_file():
        return None
    try:
        record = records.check_record(read_json(record_file, what="build record"), record_file, stack.name, builder_name, tag)
    except BadInput as err:  # a damaged record: build again, which writes a whole new one over it
        progress(f"  ignoring the damaged build record ({err.message}); building the candidate again")
        return None
    if not get_builder(builder_name).image_exists(record["ref"]):
        return None
    return record


def read_image_result(path: Path) -> dict[str, Any] | None:
    """A result the image wrote (doctor.json, smoke-exit.json); missing or damaged reads as no result."""
    if not path.is_file():
        return None
    try:
        return read_json(path, what="image result")
    except BadInput:
        return None


def speed_flags(speed: Mapping[str, int] | None) -> list[str]:
    """`--speed-prompts N ...` for the smoke in the image: upgrade's batch-1 speed overrides (speed_prompts, ...),
    written as selfcheck's own flags are for a host environment (verify.selfcheck.env_args)."""
    asked = speed or {}
    opts = SmokeOptions(**{key: asked.get(key) for key in SPEED_KEYS})  # type: ignore[arg-type]  # ints, by key
    return env_args(opts, "auto")


def check_in_image(
    stack: Stack,
    record: records.BuildRecord,
    profile: str,
    *,
    speed: Mapping[str, int] | None = None,
    progress: Progress,
) -> Path:
    """The image's own self-check (build-image's: doctor, smoke, gate; hardened) with the smoke `profile` and the
    batch-1 `speed` overrides, recorded with the build; returns the folder with its doctor.json, report.json and
    selfcheck.json."""
    args = ["--profile", profile, *speed_flags(speed)]
    return Path(selfcheck_image(stack, record, args=args, progress=lambda m: progress(f"  {m}"))["outputs"])


def _ran_as_asked(report: SmokeReport, stack: Stack, profile: str, speed: Mapping[str, int] | None) -> bool:
    """Whether a recorded smoke report is the run this upgrade asks for: the profile's prompts and tokens, and the
    batch-1 sizes (`speed` over the stack's smoke.speed_*). A shorter self-check of the same image (a test's
    `--num-prompts 8`, a user's) must not stand in for the upgrade's own."""
    asked = resolve_profile(stack, profile, source="--profile")
    prompts = report.get("prompts") or {}
    if prompts.get("count") != asked.num_prompts or report.get("max_tokens") != asked.max_tokens:
        return False
    want = {key: (speed or {}).get(key, stack.smoke[key]) for key in SPEED_KEYS}
    batch1 = (report.get("throughput") or {}).get("batch1")
    if not want["speed_repeats"]:
        return batch1 is None
    if batch1 is None:
        return False
    return (batch1.get("prompts"), batch1.get("max_tokens"), batch1.get("repeats")) == (
        min(want["speed_prompts"], asked.num_prompts),
        want["speed_max_tokens"],
        want["speed_repeats"],
    )


def selfcheck_outputs(
    record: records.BuildRecord, profile: str, *, stack: Stack | None = None, speed: Mapping[str, int] | None = None
) -> Path | None:
    """The outputs of a self-check already recorded with this image, when they hold doctor and smoke results
    of the smoke `profile` (build-image's own self-check runs the stack's default, quick) and, given the `stack`,
    of the prompts, tokens and batch-1 sizes this upgrade asks for."""
    done = record.get("selfcheck")
    outputs = Path(done["outputs"]) if isinstance(done, dict) and isinstance(done.get("outputs"), str) else None
    if outputs and (outputs / "report.json").is_file() and (outputs / "doctor.json").is_file():
        try:
            report = load_report(outputs / "report.json")
        except BadInput:
            return None  # a damaged report: run the self-check again
        if report_profile(report) == profile and (stack is None or _ran_as_asked(report, stack, profile, speed)):
            return outputs
    return None


@dataclasses.dataclass
class UpgradeResult:
    candidate: Candidate
    baseline: Path
    steps: list[Step]
    before: SmokeReport | None = None  # the baseline report
    after: SmokeReport | None = None  # the candidate's report
    gate_checks: list[CheckRecord] = dataclasses.field(default_factory=list)
    image: UpgradeImage = dataclasses.field(default_factory=UpgradeImage)
    promoted: bool = False

    @property
    def ok(self) -> bool:
        return all(s.status in ("pass", "skipped") for s in self.steps) and any(
            s.name == "gate" and s.status == "pass" for s in self.steps
        )

    def failures(self) -> list[str]:
        out = []
        for s in self.steps:
            if s.status == "fail":
                out.append(f"{s.name}: {s.detail}")
        return out

    def to_json(self) -> UpgradeRecord:
        c = self.candidate
        return {
            "schema": UPGRADE_SCHEMA,
            "stack": c.stack.name,
            "verdict": "pass" if self.ok else "fail",
            "changes": {k: {"before": b, "after": a} for k, (b, a) in c.changes.items()},
            "candidate": {"folder": str(c.folder), "stack": str(c.stack.path), "lock": str(c.lock_file)},
            "baseline": str(self.baseline),
            "image": self.image,
            "steps": [s.to_json() for s in self.steps],
            "before": metrics_of(self.before),
            "after": metrics_of(self.after),
            "gate_checks": self.gate_checks,
            "soak": self.soak(),
            "failures": self.failures(),
            "promoted": self.promoted,
        }

    def soak(self) -> SoakStepRecord | None:
        """The soak step's result (asked seconds, drift limit, windows, drift, verdict), or None without the step."""
        step = next((s for s in self.steps if s.name == "soak"), None)
        return None if step is None else {"status": step.status, "detail": step.detail, **step.data}


def metrics_of(report: SmokeReport | None) -> UpgradeMetrics | None:
    """The numbers an upgrade compares, from a smoke report; per-position rates = accepted / drafts."""
    if not report:
        return None
    m, tp = report["metrics"], report["throughput"]
    drafts = m["num_drafts"]
    draft: Mapping[str, Any] = report.get("draft") or {}
    return {
        "engine": f"{report['engine'].get('package') or report['engine']['name']} {report['engine']['version']}",
        "image": report.get("image", {}).get("ref"),
        "mean_acceptance_length": m["mean_acceptance_length"],
        "acceptance_rate": m["acceptance_rate"],
        "per_position": [a / drafts if drafts else 0.0 for a in m["accepted_per_position"]],
        "num_drafts": drafts,
        "speedup": tp.get("speedup"),
        "spec_tok_s": tp.get("spec_tok_s"),
        "baseline_tok_s": tp.get("baseline_tok_s"),
        "lossless": f"{report['lossless']['checked'] - report['lossless']['mismatches']}/{report['lossless']['checked']}",
        "captured_layers": draft.get("captured_layers"),
        "aux_layer_ids": draft.get("aux_layer_ids"),
    }


def _doctor_row(check: dict[str, Any]) -> DoctorRow:
    return {"name": check.get("name"), "status": check.get("status"), "reason": check.get("reason")}


def _timed(step: Step, fn: Callable[[], T]) -> T:
    t0 = time.monotonic()
    try:
        return fn()
    finally:
        step.seconds = round(step.seconds + time.monotonic() - t0, 1)


def run_upgrade(
    cand: Candidate,
    baseline: Path,
    *,
    builder_name: str = "buildah",
    relock: bool = False,
    rebuild: bool = False,
    rerun_selfcheck: bool = False,
    lock_doc: LockDoc | None = None,
    soak_s: float = DEFAULT_SOAK_S,
    soak_max_drift: float = DEFAULT_MAX_DRIFT,
    soak_runner: Runner | None = None,
    profile: str = "quick",
    speed: Mapping[str, int] | None = None,
    progress: Progress = print,
) -> UpgradeResult:
    """Every step of the upgrade; a failed step stops the later ones and is reported, never raised,
    except bad input and environment problems found before anything was built. The soak runs in the
    candidate image (`soak_runner` runs its command elsewhere) only after everything else passed."""
    steps = {n: Step(n) for n in ("lock", "patches", "build", "doctor", "smoke", "gate", "soak")}
    result = UpgradeResult(cand, baseline, list(steps.values()), before=load_report(baseline))
    cand.out.mkdir(parents=True, exist_ok=True)

    progress(f"[1/6] lock: {', '.join(f'{k} {b} -> {a}' for k, (b, a) in cand.changes.items()) or 'no pin changed'}")
    current = current_lock(cand)
    if lock_doc is None:
        lock_doc = _timed(steps["lock"], lambda: lock_candidate(cand, current, relock=relock, progress=progress))
    steps["lock"].status, steps["lock"].detail = "pass", f"{cand.lock_file} (lock {lock_doc['lock_sha256'][:12]})"
    steps["lock"].data = {"lock_sha256": lock_doc["lock_sha256"], "packages": len(lock_doc["packages"])}
    if current is not None:  # what the image installs otherwise than the current one (the gate judges all of it)
        steps["lock"].data["changed"] = changed = lock_changes(current, lock_doc)
        steps["lock"].detail += f"; {changes_text(changed, limit=8)}"
        progress(f"  the candidate lock: {changes_text(changed)}")
    _timed(steps["lock"], lambda: fetch_wheels(lock_doc, progress=progress))

    progress("[2/6] patch lifecycle against the candidate engine wheel")
    patches = _timed(steps["patches"], lambda: check_patches(cand.stack, lock_doc))
    steps["patches"].data = {"results": patches}
    conflicts = [p for p in patches if p["state"] == "conflict"]
    if conflicts:
        steps["patches"].status = "fail"
        steps["patches"].detail = "; ".join(f"{p['patch']} conflicts: {p['reason'].splitlines()[0]}" for p in conflicts)
        return result
    steps["patches"].status = "pass"
    steps["patches"].detail = ", ".join(f"{p['patch']}: {p['state']}" for p in patches) or "the stack has no patches"

    progress(f"[3/6] candidate image ({builder_name})")
    t0 = time.monotonic()
    record = None if rebuild else find_built(cand.stack, cand.lock_file, builder_name, progress=progress)
    if record:
        steps["build"].detail = f"{record['ref']} (reused: an image with exactly these inputs exists)"
    else:
        try:
            record = build_image(cand.stack, builder_name=builder_name, lock_file=cand.lock_file, progress=progress)
        except CheckFailed as err:
            steps["build"].status, steps["build"].detail = "fail", f"the candidate image did not build: {err}"
            steps["build"].seconds = round(time.monotonic() - t0, 1)
            return result
        steps["build"].detail = f"{record['ref']} (built in {record['build_seconds']} s)"
    steps["build"].status, steps["build"].seconds = "pass", round(time.monotonic() - t0, 1)
    result.image = {"ref": record["ref"], "tag": record["tag"], "builder": record["builder"], "image_id": record.get("image_id")}

    progress("[4/6] doctor and smoke test in the candidate image (read-only, no network, non-root)")
    outputs = None if rerun_selfcheck else selfcheck_outputs(record, profile, stack=cand.stack, speed=speed)
    if outputs:
        progress(f"  reusing the doctor and smoke results of this exact image ({outputs}; --rerun-selfcheck runs them again)")
    else:
        outputs = _timed(steps["smoke"], lambda: check_in_image(cand.stack, record, profile, speed=speed, progress=progress))
    doctor = read_image_result(outputs / "doctor.json") or {}
    found = doctor.get("checks")
    # the image's output: no list of checks, or a damaged entry in it, is no check
    checks: list[dict[str, Any]] = [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []
    failed = [c for c in checks if c.get("status") == "fail"]
    if doctor.get("verdict") == "pass":
        steps["doctor"].status = "pass"
        warns = [str(c.get("name")) for c in checks if c.get("status") == "warn"]
        steps["doctor"].detail = f"{len(checks)} checks passed" + (f" (warnings: {', '.join(warns)})" if warns else "")
    else:
        steps["doctor"].status = "fail"
        steps["doctor"].detail = (
            "; ".join(f"{c.get('name')}: {c.get('reason')}" for c in failed)
            or str(doctor.get("error") or "")
            or f"no doctor result; see {outputs}"
        )
    steps["doctor"].data = {"checks": [_doctor_row(c) for c in checks]}
    report_path = outputs / "report.json"
    if report_path.is_file():
        result.after = load_report(report_path)
        run = result.after.get("run") or {"completed": True}
        if run.get("completed"):
            steps["smoke"].status = "pass"
            steps["smoke"].detail = (
                f"{result.after['prompts']['count']} prompts x {result.after.get('max_tokens')} tokens "
                f"ran with and without the drafter"
            )
        else:
            steps["smoke"].status = "fail"
            steps["smoke"].detail = f"the engine run did not complete: {run.get('error')}"
    else:
        steps["smoke"].status = "fail"
        try:  # through its model (verify.selfcheck_record); missing or damaged reads as no result
            smoke = read_selfcheck(outputs / SELFCHECK_FILE)["stages"].get("smoke") or {}
        except BadInput:
            smoke = {}
        steps["smoke"].detail = str(smoke.get("error") or smoke.get("note") or f"no report.json in {outputs}")
        return result

    progress(f"[5/6] gate: candidate report against the current baseline {baseline}")
    gate = _timed(
        steps["gate"],
        lambda: run_gate(
            report_path,
            baseline=str(baseline),
            stack=str(cand.stack.path),
            junit=cand.out / "gate-junit.xml",
            md=cand.out / "gate.md",
        ),
    )
    result.gate_checks = gate.to_json()["checks"]
    steps["gate"].status = "pass" if gate.ok else "fail"
    steps["gate"].detail = "every check passed" if gate.ok else "; ".join(gate.to_json()["failures"])

    if soak_s > 0 and any(steps[n].status == "fail" for n in ("doctor", "smoke", "gate")):
        steps["soak"].detail = "an earlier step failed"
        steps["soak"].data = {"soak_s": soak_s, "max_drift": soak_max_drift}
        return result
    progress(
        f"[6/6] soak: acceptance over {soak_s:g} s on one engine in the candidate image"
        if soak_s > 0
        else "[6/6] soak: skipped (--soak-s 0)"
    )
    run_soak_step(
        steps["soak"],
        soak_runner or image_runner(record),
        cand.out / "soak",
        soak_s=soak_s,
        max_drift=soak_max_drift,
        progress=progress,
    )
    return result
