"""Losslessness up to numeric ties: divergences at a near-tie of the target are told apart from real ones."""

from __future__ import annotations

import pytest
import train_support

from speclock.verify import lossless


def fake_judge(margins):
    """A judge that answers from a table {(plain_tok, spec_tok): margin}; the plain token is the argmax."""

    def judge(prefix, a, b):
        m = margins[(a, b)]
        return {"margin": m, "float32_argmax": a, "tie": m <= lossless.TIE_MARGIN}

    return judge


def test_identical_outputs_have_no_mismatch_and_no_tie():
    out = lossless.compare([[1, 2, 3]], [[1, 2, 3]], [[9]], fake_judge({}))
    assert out["mismatches"] == 0 and out["numeric_ties"] == 0 and out["checked"] == 1


def test_a_divergence_at_a_tie_is_not_a_mismatch_but_a_clear_one_is():
    plain = [[1, 2, 3], [4, 5, 6], [7, 8]]
    spec = [[1, 2, 30], [4, 50, 6], [7, 8]]
    out = lossless.compare(plain, spec, [[0], [0], [0]], fake_judge({(3, 30): 0.05, (5, 50): 3.0}))
    assert out["numeric_ties"] == 1 and out["mismatches"] == 1
    assert out["first_ties"][0]["prompt"] == 0 and out["first_ties"][0]["position"] == 2
    assert out["first_mismatches"][0]["prompt"] == 1 and out["first_mismatches"][0]["margin"] == 3.0


def test_without_a_judge_every_divergence_counts():
    out = lossless.compare([[1, 2]], [[1, 3]])
    assert out["mismatches"] == 1 and out["numeric_ties"] == 0 and out["tie_check"] == "off"


def test_a_missing_output_is_a_mismatch():
    assert lossless.compare([[1], [2]], [[1]])["mismatches"] == 1


def test_a_target_too_large_for_the_cpu_judge_is_not_judged(tmp_path, monkeypatch):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 100)
    monkeypatch.setattr(lossless, "MAX_JUDGE_BYTES", 10)
    assert lossless.float32_judge(tmp_path, log=lambda m: None) is None


@pytest.mark.slow
def test_the_float32_judge_on_the_real_target_calls_a_clear_preference_a_mismatch():
    train_support.need("torch", "transformers")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from speclock.spec.prompts import chat_prompt_ids

    target = train_support.real_target()
    tok = AutoTokenizer.from_pretrained(target)
    prefix = chat_prompt_ids(tok, "Name the capital of France.")
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prefix])).logits[0, -1]
    best, worst = int(logits.argmax()), int(logits.argmin())
    judge = lossless.float32_judge(target, log=lambda m: None)
    clear = judge(prefix, best, worst)
    assert clear["float32_argmax"] == best and clear["margin"] > 5 and not clear["tie"]
    same = judge(prefix, best, best)
    assert same["margin"] == 0 and same["tie"]
    second = int(logits.topk(2).indices[1])
    gap = float(logits[best] - logits[second])
    assert judge(prefix, second, best)["tie"] == (gap <= lossless.TIE_MARGIN)
