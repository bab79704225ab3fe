"""Speed in the verdict (issue #25): the batch-1 speedup against min_speedup and against the baseline's, with a
WARN where its interval straddles the limit; reports whose speed figures disagree with their own runs are refused."""

import json
import re
import xml.etree.ElementTree as ET

import pytest
from smoke_faults import sample_report, with_speed, write_stack

from speclock.core.errors import BadInput
from speclock.spec.stack import load_stack
from speclock.verify.gate import evaluate, run_gate
from speclock.verify.report import human_table, validate_report

FLOORS = {"min_mean_acceptance_length": 2.0, "min_speedup": 1.1, "max_speedup_drop": 0.10}


def speed(report):
    return [c for c in evaluate(report, FLOORS) if c.kind == "speed"]


def test_a_batch1_speedup_clearly_above_min_speedup_passes():
    (c,) = speed(with_speed(sample_report(), [500, 510, 505], [620, 615, 625], [495, 500, 505]))
    assert c.status == "PASS" and c.value == pytest.approx(620 / 502.5, abs=1e-3)


def test_a_batch1_speedup_below_min_speedup_fails_naming_the_key():
    # the README's CPU run: 0.66x, which smoke used to call PASS
    (c,) = speed(with_speed(sample_report(), [30, 31, 30], [20, 20.5, 19.8], [30, 29, 31]))
    assert c.status == "FAIL" and "smoke.thresholds.min_speedup" in c.reason() and "0.66" in c.reason()


def test_a_spread_across_min_speedup_warns_never_passes_or_fails():
    # plain drifted from 500 to 570 tok/s while the drafted engine ran: 1.21 against before, 1.06 against after
    (c,) = speed(with_speed(sample_report(), [500, 500, 500], [605, 605, 605], [570, 570, 570]))
    assert c.status == "WARN" and c.ok
    assert "straddles smoke.thresholds.min_speedup" in c.detail and "spread" in c.detail


def test_speed_not_measured_fails_where_the_stack_asks_for_it():
    # a smoke of today with speed_repeats = 0 writes the section as null
    off = {"baseline_tok_s": None, "spec_tok_s": None, "speedup": None, "measured_at": None, "batch1": None}
    unmeasured = sample_report(created="2026-12-07T13:00:00Z", throughput=off)
    (c,) = speed(unmeasured)
    assert c.status == "FAIL" and "not measured" in c.detail and "throughput.batch1" in c.detail
    assert not [c for c in evaluate(unmeasured, {}) if c.kind == "speed"], "min_speedup 0: not checked"
    # a report with the section missing is held to the rule too, unless it was written before smoke measured speed
    bare = sample_report(created="2026-12-07T13:00:00Z", throughput={"baseline_tok_s": None, "spec_tok_s": None, "speedup": None})
    (c,) = speed(bare)
    assert c.status == "FAIL"


def test_a_report_from_before_speed_was_measured_warns_what_it_cannot_show():
    """Issue #40 item 3: the committed H200 report and vllm-0.26.0 baseline (2026-12-05) predate batch-1 speed; they
    are judged with a WARN naming the date, not failed for a section they could not have."""
    old = sample_report(created="2026-12-05T05:16:03Z", throughput={"baseline_tok_s": 1.0, "spec_tok_s": 1.0, "speedup": 1.0})
    (c,) = speed(old)
    assert c.status == "WARN" and "before smoke measured speed at batch 1 (2026-12-06T18:49:01Z)" in c.detail


@pytest.mark.parametrize(
    "report",
    ["baselines/vllm-0.26.0-torch2.11-cu130/vllm-0.26.0.json", "docs/gpu-runs/2026-12-05-h200/with-compiler/report.json"],
)
def test_the_committed_reports_of_2026_12_05_are_gated_not_refused(report):
    """They were refused ("came from a run without [a GPU]"): they predate gpu.name, and their gpu.arch sm_90a says a
    GPU was visible. Gated now: PASS with a WARN for the unnamed GPU and for each speed they could not measure."""
    from speclock.core.layout import REPO_ROOT
    from speclock.verify.gate import run_gate

    result = run_gate(REPO_ROOT / report, baseline="none", stack="vllm-0.26.0-torch2.11-cu130")
    assert result.ok, result.to_json()["failures"]
    assert any(w.startswith("the report names no GPU") for w in result.warnings)
    assert any("before smoke measured speed at batch 1" in w for w in result.warnings)
    assert any("before smoke measured speed under load" in w for w in result.warnings)


def test_a_gpu_stack_report_without_any_gpu_is_still_refused():
    from speclock.spec.stack import load_stack as load
    from speclock.verify.plausibility import check_against_stack

    report = sample_report(stack="vllm-0.26.0-torch2.11-cu130", gpu={"arch": None})
    with pytest.raises(BadInput, match="so this report came from a run without one"):
        check_against_stack(report, load("vllm-0.26.0-torch2.11-cu130"))


def test_a_speedup_drop_against_the_baseline_fails_naming_max_speedup_drop():
    base = with_speed(sample_report(), [500, 500, 500], [650, 650, 650], [500, 500, 500])  # 1.30
    now = with_speed(sample_report(), [500, 500, 500], [575, 575, 575], [500, 500, 500])  # 1.15: -11.5%
    (c,) = [c for c in evaluate(now, FLOORS, base) if c.name.startswith("speedup at batch 1 vs baseline")]
    assert c.status == "FAIL" and "smoke.thresholds.max_speedup_drop" in c.reason()
    same = with_speed(sample_report(), [500, 500, 500], [640, 640, 640], [500, 500, 500])
    (c,) = [c for c in evaluate(same, FLOORS, base) if c.name.startswith("speedup at batch 1 vs baseline")]
    assert c.status == "PASS"


def test_a_baseline_without_speed_is_no_speed_baseline_not_a_crash():
    now = with_speed(sample_report(), [500, 500, 500], [640, 640, 640], [500, 500, 500])
    old = sample_report(throughput={"baseline_tok_s": 100.0, "spec_tok_s": 60.0, "speedup": 0.6})  # before batch 1
    (c,) = [
        c
        for c in evaluate(now, FLOORS, old, baseline_source="b.json")
        if "vs baseline" in c.name and c.kind == "regression" and "speedup" in c.name
    ]
    assert c.status == "WARN" and c.detail.startswith("no speed baseline: b.json")


def test_a_speed_baseline_from_another_gpu_is_not_compared():
    base = with_speed(sample_report(), [500] * 3, [650] * 3, [500] * 3, name="NVIDIA H200")
    now = with_speed(sample_report(), [500] * 3, [500] * 3, [500] * 3, name="NVIDIA H100 80GB HBM3")
    (c,) = [c for c in evaluate(now, FLOORS, base) if c.name.startswith("speedup at batch 1 vs baseline")]
    assert c.status == "WARN" and "GPU NVIDIA H200 vs NVIDIA H100" in c.detail


def test_warnings_show_in_the_verdict_junit_markdown_and_table(tmp_path):
    report = with_speed(sample_report(), [500, 500, 500], [605, 605, 605], [570, 570, 570])
    rp = tmp_path / "report.json"
    rp.write_text(json.dumps(report))
    stack = write_stack(tmp_path, min_mean_acceptance_length=2.0, min_speedup=1.1)
    result = run_gate(rp, baseline="none", stack=str(stack), junit=tmp_path / "j.xml", md=tmp_path / "s.md")
    assert result.ok and any("straddles" in w for w in result.warnings)
    assert result.to_json()["verdict"] == "pass" and any("straddles" in w for w in result.to_json()["warnings"])
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert int(suite.get("failures")) == 0 and int(suite.get("skipped")) == 2  # no baseline + the speed WARN
    md = (tmp_path / "s.md").read_text()
    assert "PASS with WARN" in md and "| speedup at batch 1 (spec / plain tok/s) | **WARN** |" in md
    text = human_table(dict(report, warnings=["speedup at batch 1: straddles"]))
    assert "tok/s at batch 1" in text and "interval 1.06-1.21" in text and "WARN: speedup at batch 1" in text


@pytest.mark.parametrize("key", ["plain_tok_s_median", "spec_tok_s_median"])
def test_the_tok_s_medians_printed_with_the_verdict_are_checked(key):
    """A fuzz case: a report without a median was exit 3 (KeyError) where the verdict's line prints it."""
    report = with_speed(sample_report(), [500] * 3, [605] * 3, [570] * 3)
    report["throughput"]["batch1"][key] = 9999.0  # not what the runs give
    with pytest.raises(BadInput, match=f"throughput.batch1.{key}"):
        validate_report(report)
    del report["throughput"]["batch1"][key]
    with pytest.raises(BadInput, match=f"throughput.batch1.{key}"):
        validate_report(report)


def test_an_edited_speed_interval_is_refused():
    report = with_speed(sample_report(), [500, 500, 500], [605, 605, 605], [570, 570, 570])
    validate_report(report)
    report["throughput"]["batch1"]["speedup_low"] = 1.15  # would turn the WARN into a PASS
    with pytest.raises(BadInput, match="throughput.batch1.speedup_low"):
        validate_report(report)
    report = with_speed(sample_report(), [500] * 3, [605] * 3, [570] * 3)
    report["throughput"]["speedup"] = 1.5
    with pytest.raises(BadInput, match="throughput.speedup"):
        validate_report(report)


@pytest.mark.parametrize("key,value", [("speed_repeats", 21), ("speed_prompts", 0), ("speed_max_tokens", 5000)])
def test_speed_settings_out_of_bounds_are_refused_naming_the_key(tmp_path, key, value):
    stack = write_stack(tmp_path)
    text = re.sub(rf"^{key} = .*$", "", stack.read_text(), flags=re.M)  # the stack may set it already
    stack.write_text(text.replace("[smoke]\n", f"[smoke]\n{key} = {value}\n", 1))
    with pytest.raises(BadInput, match=f"smoke.{key}"):
        load_stack(str(stack))


def test_gpu_stacks_ask_for_a_batch1_speedup():
    # a drafted deployment slower than plain fails on a GPU (vLLM 0.26.0 measured 1.02-1.10x on an H100)
    for name in ("vllm-0.26.0-torch2.11-cu130", "vllm-cu130", "sglang-0.5.15-torch2.11-cu130", "sglang-cu130"):
        assert load_stack(name).thresholds["min_speedup"] >= 1.0, name
    assert 0 < load_stack("cpu-vllm").thresholds["min_speedup"] < 1.0


def test_the_real_h100_sglang_run_slower_than_plain_fails_the_gate():
    # The first SGLang run on a GPU (H100, 2026-12-06): lossless, acceptance 2.009, yet 0.61x plain at batch 1.
    # The gate must refuse it on speed alone, naming the key, whatever else passes.
    from speclock.core.layout import REPO_ROOT
    from speclock.verify.gate import run_gate

    report = REPO_ROOT / "docs/gpu-runs/2026-12-06-h100/sglang-selfcheck/report.json"
    result = run_gate(report, baseline="none", stack="sglang-0.5.15-torch2.11-cu130")
    assert not result.ok
    failures = result.to_json()["failures"]
    assert "smoke.thresholds.min_speedup" in failures[0] and "0.613" in failures[0], failures
    assert len(failures) == 1, failures
    # the stack now also asks for speed under load (min_concurrent_speedup): this report predates that measurement,
    # so the gate says what it cannot show (a WARN), and does not fail it for a section it could not have
    assert any("before smoke measured speed under load" in w for w in result.warnings), result.warnings
    import json

    assert json.loads(report.read_text())["gpu"]["name"] == "NVIDIA H100 80GB HBM3"


# --- issue #39: the interval covers the spread of the plain AND the drafted runs; engines warm up until steady ---


def test_the_interval_covers_the_spread_of_the_drafted_runs_too():
    """Scripted timings: the plain medians agree (500 before, 500 after), the drafted runs do not (550-650). The
    interval of 2026-12-06 (plain medians only) was 1.20-1.20 and PASSed 1.1; over every run it is 1.058-1.354."""
    report = with_speed(sample_report(), [500, 520, 480], [600, 650, 550], [490, 510, 500])
    b1 = report["throughput"]["batch1"]
    assert b1["interval_method"] == "runs"
    assert b1["speedup"] == pytest.approx(600 / 500, abs=1e-4)
    assert b1["speedup_low"] == pytest.approx(550 / 520, abs=1e-4)
    assert b1["speedup_high"] == pytest.approx(650 / 480, abs=1e-4)
    assert b1["spread"] == pytest.approx((650 / 480 - 550 / 520) / 1.2, abs=1e-4)
    (c,) = speed(report)
    assert c.status == "WARN" and "interval 1.058-1.354" in c.detail
    # a clear case is still a clear PASS / FAIL
    (c,) = speed(with_speed(sample_report(), [500, 505, 495], [700, 690, 710], [500, 498, 502]))
    assert c.status == "PASS"
    (c,) = speed(with_speed(sample_report(), [500, 505, 495], [300, 290, 310], [500, 498, 502]))
    assert c.status == "FAIL"


def test_a_report_from_before_the_interval_method_keeps_its_medians_interval():
    """Committed reports (docs/gpu-runs, baselines) have no interval_method: they were bracketed by the plain
    medians, and are checked by that rule, not refused; an unknown method is refused naming the key."""
    from speclock.verify.speed import summarize_batch1

    old = with_speed(sample_report(), [500, 520, 480], [600, 650, 550], [490, 510, 500])
    runs = [[(t, 1.0) for t in x] for x in ([500, 520, 480], [600, 650, 550], [490, 510, 500])]
    b1 = summarize_batch1(*runs, prompts=4, max_tokens=64, method="medians")
    del b1["interval_method"]
    old["throughput"]["batch1"] = b1
    validate_report(old)
    assert (b1["speedup_low"], b1["speedup_high"]) == (1.2, 1.2)
    old["throughput"]["batch1"]["interval_method"] = "runs"  # the medians' interval passed off as the runs' one
    with pytest.raises(BadInput, match="throughput.batch1.speedup_low"):
        validate_report(old)
    old["throughput"]["batch1"]["interval_method"] = "guess"
    with pytest.raises(BadInput, match="throughput.batch1.interval_method"):
        validate_report(old)


def test_an_engine_warms_up_until_its_last_runs_agree():
    """The warm-up rule (docs/smoke.md): runs until the last `repeats` agree within 5% of their median; the cold
    runs before them are reported, not kept."""
    from speclock.verify.speed import warm_runs

    script = iter([(100, 2.0), (100, 1.4), (100, 1.0), (100, 1.01), (100, 0.99), (100, 5.0)])
    kept, warmup, steady = warm_runs(lambda: next(script), repeats=3)
    assert kept == [(100, 1.0), (100, 1.01), (100, 0.99)] and warmup == [(100, 2.0), (100, 1.4)] and steady
    # never settles: stops after repeats + 4 runs, keeps the last 3 and says so
    script = iter([(100, s) for s in (1.0, 1.5, 1.0, 1.5, 1.0, 1.5, 1.0, 1.5)])
    kept, warmup, steady = warm_runs(lambda: next(script), repeats=3)
    assert len(kept) == 3 and len(warmup) == 4 and not steady
    # steady from the start: no extra run
    script = iter([(100, 1.0)] * 3)
    kept, warmup, steady = warm_runs(lambda: next(script), repeats=3)
    assert len(kept) == 3 and warmup == [] and steady


def test_the_warm_up_runs_are_in_the_report_and_checked_for_shape():
    from speclock.verify.speed import summarize_batch1

    runs = [[(t, 1.0) for t in x] for x in ([500, 500, 500], [600, 600, 600], [500, 500, 500])]
    b1 = summarize_batch1(*runs, prompts=4, max_tokens=64, warmup=[[(300, 1.0)], [], []], steady_runs=[True, True, False])
    assert b1["warmup_tok_s"] == {"plain_before": [300.0], "spec": [], "plain_after": []}
    assert b1["steady"] == {"plain_before": True, "spec": True, "plain_after": False}
    report = with_speed(sample_report(), [500] * 3, [600] * 3, [500] * 3)
    report["throughput"]["batch1"] = b1
    validate_report(report)
    b1["steady"]["spec"] = "yes"
    with pytest.raises(BadInput, match="throughput.batch1.steady.spec"):
        validate_report(report)


# --- issue #39: speed under load (smoke.speed_concurrent), judged by min_concurrent_speedup ---


def with_loaded(report: dict, before, spec, after, requests: int = 80) -> dict:
    from speclock.verify.speed_load import summarize_loaded

    runs = [[(t, 1.0) for t in x] for x in (before, spec, after)]
    report["throughput"]["loaded"] = summarize_loaded(*runs, requests=requests, max_tokens=128, batches=6)
    return report


LOAD = {"min_speedup": 1.1, "min_concurrent_speedup": 1.0}


def test_a_deployment_slower_than_plain_under_load_fails_naming_min_concurrent_speedup():
    """Scripted timings of the H100 run of 2026-12-07 (vLLM 0.50x at 80 at once): batch 1 pays, load does not."""
    report = with_speed(sample_report(), [480] * 3, [700, 705, 695], [485] * 3)
    report = with_loaded(report, [20000, 20200, 19800], [10000, 10100, 9900], [20100, 19900, 20000])
    loaded = report["throughput"]["loaded"]
    assert loaded["speedup"] == pytest.approx(10000 / 20000, abs=1e-4)
    assert loaded["speedup_low"] == pytest.approx(9900 / 20200, abs=1e-4)
    assert loaded["speedup_high"] == pytest.approx(10100 / 19800, abs=1e-4)
    validate_report(report)
    (c,) = [c for c in evaluate(report, LOAD) if c.name.startswith("speedup with 80 requests at once")]
    assert c.status == "FAIL" and "smoke.thresholds.min_concurrent_speedup" in c.reason()
    assert "engine.k_per_batch_size" in c.detail
    (b1,) = [c for c in evaluate(report, LOAD) if c.name.startswith("speedup at batch 1 (")]
    assert b1.status == "PASS"  # each load judged on its own


def test_never_slower_under_load_passes_and_a_straddle_warns():
    report = with_speed(sample_report(), [480] * 3, [700] * 3, [485] * 3)
    with_loaded(report, [20000] * 3, [20500, 20600, 20400], [20100] * 3)  # k = 0 at large batches: ~1.02x
    (c,) = [c for c in evaluate(report, LOAD) if c.name.startswith("speedup with 80")]
    assert c.status == "PASS"
    with_loaded(report, [20000] * 3, [19500, 20500, 20000], [20000] * 3)
    (c,) = [c for c in evaluate(report, LOAD) if c.name.startswith("speedup with 80")]
    assert c.status == "WARN" and "straddles smoke.thresholds.min_concurrent_speedup" in c.detail


def test_a_floor_under_load_without_the_measurement_fails_as_not_measured():
    report = with_speed(sample_report(created="2026-12-07T13:00:00Z"), [480] * 3, [700] * 3, [485] * 3)
    (c,) = [c for c in evaluate(report, LOAD) if c.name.startswith("speedup under load")]
    assert c.status == "FAIL" and "not measured" in c.detail and "smoke.speed_concurrent" in c.detail
    assert not [c for c in evaluate(report, {"min_speedup": 1.1}) if "load" in c.name]  # 0: not judged


def test_edited_loaded_figures_are_refused():
    report = with_loaded(with_speed(sample_report(), [480] * 3, [700] * 3, [485] * 3), [100] * 3, [90] * 3, [100] * 3)
    report["throughput"]["loaded"]["speedup_low"] = 1.2
    with pytest.raises(BadInput, match="throughput.loaded.speedup_low"):
        validate_report(report)
    report = with_loaded(with_speed(sample_report(), [480] * 3, [700] * 3, [485] * 3), [100] * 3, [90] * 3, [100] * 3)
    report["throughput"]["loaded"]["requests"] = 7
    with pytest.raises(BadInput, match="throughput.loaded.requests"):
        validate_report(report)
    report["throughput"]["loaded"]["requests"] = "80"
    with pytest.raises(BadInput, match="throughput.loaded.requests"):
        validate_report(report)


def test_a_loaded_run_repeats_its_batch_until_it_is_long_enough_to_time():
    from speclock.verify.speed_load import loaded_runs

    # an H100 batch of 80 x 128 tokens takes ~0.4 s: a run is 8 of them (3.2 s), not one
    assert loaded_runs(lambda: (10240, 0.4)) == (81920, pytest.approx(3.2), 8)
    assert loaded_runs(lambda: (10240, 5.0)) == (10240, 5.0, 1)  # a CPU's batch is long enough alone


def test_the_table_shows_the_loaded_figures():
    report = with_loaded(with_speed(sample_report(), [480] * 3, [700] * 3, [485] * 3), [100] * 3, [90] * 3, [100] * 3)
    text = human_table(report)
    assert "tok/s, 80 at once, median of 3" in text and "runs of 6+ batches" in text
