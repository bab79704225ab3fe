"""Bugs that typing train/, drafter/ and kernels/ (issue #27) brought to light: each test failed before its fix."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import train_support


def _tiny_target_config(**kw):
    cfg = dict(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=32,
        rms_norm_eps=1e-6,
        vocab_size=64,
        max_position_embeddings=64,
        rope_parameters={"rope_theta": 500.0, "rope_type": "default"},
    )
    cfg.update(kw)
    return SimpleNamespace(**cfg)


def test_drafter_config_takes_a_null_rope_theta_as_the_default():
    # drafter/eagle3.py DrafterConfig.from_target: float(None) raised TypeError for a config whose rope_theta is null.
    train_support.need("torch")
    from speclock.drafter.eagle3 import DrafterConfig

    assert DrafterConfig.from_target(_tiny_target_config(), 16).rope_theta == 500.0
    tcfg = _tiny_target_config(rope_parameters=None, rope_theta=None)
    assert DrafterConfig.from_target(tcfg, 16).rope_theta == 10000.0
    assert DrafterConfig.from_target(_tiny_target_config(rope_parameters=None), 16).rope_theta == 10000.0


def test_static_generator_takes_a_null_rope_theta_as_the_default():
    # train/fastgen.py StaticLlamaGenerator: the same float(None) for a target config whose rope_theta is null.
    train_support.need("torch", "transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from speclock.train.fastgen import StaticLlamaGenerator

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.config.rope_parameters = None
    model.config.rope_theta = None
    tok = SimpleNamespace(eos_token_id=1, pad_token_id=None)
    gen = StaticLlamaGenerator(model, tok, batch_size=1, max_prompt_tokens=4, max_new_tokens=2)
    assert gen.theta == 10000.0


def test_export_on_its_own_names_a_missing_hidden_state_index(tmp_path):
    # train/pipeline.py _load_trained returned None for the hidden-state index when hidden/ was gone (say, deleted
    # after fit to free its gigabytes); stage_export then failed with "'NoneType' object is not subscriptable".
    train_support.need("torch")
    import torch

    from speclock.core.errors import BadInput
    from speclock.drafter.eagle3 import DrafterConfig, Eagle3Drafter
    from speclock.train.pipeline import _load_trained
    from speclock.train.settings import Settings

    tcfg = _tiny_target_config()
    drafter = Eagle3Drafter(DrafterConfig.from_target(tcfg, 16))
    (tmp_path / "ckpt").mkdir()
    torch.save(
        {"drafter": drafter.state_dict(), "fit_config": {"draft_vocab_size": 16}, "vocab": list(range(16))},
        tmp_path / "ckpt" / "checkpoint.pt",
    )
    (tmp_path / "ckpt" / "fit-summary.json").write_text(json.dumps({"summary": {"steps": 1}, "history": []}))
    s = Settings(work=tmp_path)
    model = SimpleNamespace(config=tcfg)

    with pytest.raises(BadInput, match="hidden/index.json is missing"):
        _load_trained(s, model, "cpu")

    index = {"schema": "speclock.hidden/v1", "shards": [], "tokens": 0, "bytes_per_token": 1}
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "index.json").write_text(json.dumps(index))
    (loaded, summary), hidden_index = _load_trained(s, model, "cpu")
    assert isinstance(loaded, Eagle3Drafter)
    assert summary == {"steps": 1}
    assert hidden_index == index


def test_reference_speed_times_the_prompts_given_with_prompts(monkeypatch, tmp_path):
    """`speclock train reference --prompts FILE --speed N` timed the default MT-Bench prompts, not FILE."""
    from speclock.train import cli

    seen = {}
    monkeypatch.setattr(cli, "stage_reference", lambda *a, **kw: [])
    monkeypatch.setattr(cli, "measure_speed", lambda *a, **kw: seen.update(kw) or {"speedup": 1.0})
    monkeypatch.setattr(cli, "pick_device", lambda d: "cpu")
    args = SimpleNamespace(
        device="cpu",
        target=tmp_path,
        drafter=tmp_path,
        num_prompts=2,
        k=3,
        max_tokens=[16],
        record=None,
        prompts=str(tmp_path / "mine.jsonl"),
        dtype=None,
        workers=1,
        speed=2,
        json=True,
    )
    assert cli._reference(args) == 0
    assert seen["prompts_file"] == str(tmp_path / "mine.jsonl")
