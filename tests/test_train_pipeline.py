"""The training pipeline end to end at toy scale on a CPU (`speclock train all --quick`), and resume."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

import train_support

pytestmark = pytest.mark.slow


def _cli(argv):
    from speclock.train import cli

    parser = argparse.ArgumentParser(prog="speclock")
    cli.add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("quick")
    target = train_support.real_target()
    assert _cli(["train", "all", "--quick", "--work", str(work), "--target", str(target)]) == 0
    return work, target


def test_quick_run_writes_both_engine_formats_with_manifest(quick_run):
    work, _ = quick_run
    summary = json.loads((work / "run-summary.json").read_text())
    assert set(summary["stages"]) >= {"generate", "extract", "fit", "export", "reference"}
    vllm_cfg = json.loads((work / "export" / "vllm" / "config.json").read_text())
    sgl_cfg = json.loads((work / "export" / "sglang" / "config.json").read_text())
    assert vllm_cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert sgl_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    m = json.loads((work / "export" / "vllm" / "speclock-manifest.json").read_text())
    assert m["aux_layers_after"] == [2, 15, 27] and m["training"]["steps"] > 0
    assert m["data"]["sequences"] > 0 and m["data"]["hidden_bytes_per_token"] == 4613
    assert m["reference"] and m["reference"][0]["key"]["max_tokens"] == 16
    from safetensors import safe_open

    with safe_open(str(work / "export" / "vllm" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= names
    assert f"embed_tokens" not in " ".join(names)


def test_extraction_rerun_adds_nothing(quick_run):
    from speclock.train.extract import load_index

    work, target = quick_run
    before = load_index(work / "hidden")
    assert _cli(["train", "extract", "--quick", "--work", str(work), "--target", str(target)]) == 0
    after = load_index(work / "hidden")
    assert after["tokens"] == before["tokens"] and after["last_run"]["new_tokens"] == 0
    assert before["aux_layers_after"] == [2, 15, 27]


def test_generation_resumes_after_interruption_without_loss_or_duplicates(quick_run, tmp_path):
    from speclock.train.data import read_done
    from speclock.train.pipeline import load_target_model, quick_settings, stage_generate

    _, target = quick_run
    s = quick_settings(tmp_path, target=target, num_prompts=3, max_new_tokens=4, gen_batch=2, max_prompt_tokens=512)
    model, tok = load_target_model(s, "cpu")
    stage_generate(s, model, tok, "cpu")
    path = tmp_path / "responses.jsonl"
    first = read_done(path)
    with open(path, "a") as f:
        f.write('{"id": "torn", "prompt_ids": [1, 2')  # the run was killed mid-write
    stage_generate(replace(s, num_prompts=5), model, tok, "cpu")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    ids = [r["id"] for r in lines]
    assert len(ids) == len(set(ids))
    assert len(first) == 3 and len(read_done(path)) == 5
    for k, rec in first.items():
        assert read_done(path)[k] == rec


def test_training_resumed_from_a_checkpoint_equals_an_uninterrupted_run(quick_run, tmp_path):
    import torch
    from speclock.train.extract import load_shards
    from speclock.train.fit import train_drafter
    from speclock.train.pipeline import load_target_model, quick_settings

    work, target = quick_run
    s = quick_settings(tmp_path, target=target)
    model, _ = load_target_model(s, "cpu")
    data = load_shards(work / "hidden")
    straight, full = train_drafter(data, model, replace(s.fit, max_steps=0), tmp_path / "a", "cpu", log=lambda m: None)
    assert full["steps"] >= 2
    half = full["steps"] // 2
    _, first = train_drafter(data, model, replace(s.fit, max_steps=half), tmp_path / "b", "cpu", log=lambda m: None)
    assert first["steps"] == half  # "interrupted" here, checkpointed
    resumed, summary = train_drafter(data, model, replace(s.fit, max_steps=0), tmp_path / "b", "cpu", log=lambda m: None)
    assert summary["steps"] == full["steps"]
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name
