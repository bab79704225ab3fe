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
    assert {
        "fc.weight",
        "midlayer.self_attn.q_proj.weight",
        "midlayer.hidden_norm.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
    } <= names
    assert "embed_tokens" not in " ".join(names)


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
    from speclock.train.pipeline import load_target_model, stage_generate
    from speclock.train.settings import quick_settings

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
    from speclock.train.pipeline import load_target_model
    from speclock.train.settings import quick_settings

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
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


@pytest.mark.parametrize("store,bytes_per_token", [("fp8", 2897), ("fp8-all", 2325)])
def test_fp8_stores_hold_the_bf16_states_within_e4m3_precision(quick_run, tmp_path, store, bytes_per_token):
    import torch

    from speclock.core.errors import BadInput
    from speclock.drafter.models import target_sha256
    from speclock.train.data import read_done
    from speclock.train.extract import extract_hidden_states, gather_states, load_shards
    from speclock.train.pipeline import load_target_model
    from speclock.train.settings import quick_settings

    work, target = quick_run
    s = quick_settings(tmp_path, target=target)
    model, _ = load_target_model(s, "cpu")
    responses = list(read_done(work / "responses.jsonl").values())

    def extract(folder, kind):
        return extract_hidden_states(
            model,
            responses,
            tmp_path / folder,
            [2, 15, 27],
            target_sha256(target),
            s.fit.max_len,
            s.extract_batch_tokens,
            s.shard_tokens,
            log=lambda m: None,
            store=kind,
        )

    idx = extract("h", store)
    assert idx["store"] == store and idx["bytes_per_token"] == bytes_per_token
    extract("b", "bf16")  # the same pass in bf16, in this process (same numerics)
    ref, q = load_shards(tmp_path / "b"), load_shards(tmp_path / "h")
    assert torch.equal(ref["input_ids"], q["input_ids"]) and ref["spans"] == q["spans"]
    for name in ("aux", "final"):
        exact = gather_states(ref, name, ref["spans"]).float()
        got = gather_states(q, name, q["spans"]).float()
        if name == "final" and store == "fp8":
            assert torch.equal(exact, got)  # the labels' source stays bf16
            continue
        # e4m3 keeps 3 mantissa bits: every element within 1/16 of its own size, or of a tiny
        # fraction of its (token, layer) row's largest magnitude for the subnormal range.
        H = 576
        rows, rows_q = exact.view(-1, H), got.view(-1, H)
        amax = rows.abs().amax(-1, keepdim=True)
        assert ((rows - rows_q).abs() <= rows.abs() / 16 + amax * 2**-9 / 448 * 2).all(), name
        assert (rows - rows_q).abs().max() > 0  # really quantized
    with pytest.raises(BadInput, match="pass the same --hidden-store"):
        extract("h", "bf16")


def test_held_out_sequences_are_scored_per_training_step(quick_run, tmp_path):
    from speclock.train.extract import load_shards
    from speclock.train.fit import train_drafter
    from speclock.train.pipeline import load_target_model
    from speclock.train.settings import quick_settings

    work, target = quick_run
    s = quick_settings(tmp_path, target=target)
    model, _ = load_target_model(s, "cpu")
    data = load_shards(work / "hidden")
    _, summary = train_drafter(
        data, model, replace(s.fit, holdout_sequences=3, max_steps=4), tmp_path / "c", "cpu", log=lambda m: None
    )
    assert summary["holdout"]["sequences"] == 3
    assert len(summary["holdout"]["acc_per_step"]) == s.fit.ttt_steps
    assert all(0.0 <= a <= 1.0 for a in summary["holdout"]["acc_per_step"])
