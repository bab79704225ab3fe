"""The reference speculative decoder on the real target: lossless, consistent counters, real acceptance."""

from __future__ import annotations

import os
import sys

import pytest
import train_support

from speclock.core.errors import CheckFailed

N_TOKENS = 24


def _prompts(tok, n):
    from speclock.spec.prompts import chat_prompt_ids

    texts = [
        "Write a short poem about the sea.",
        "What is 17 times 23? Explain step by step.",
        "List three uses of a paperclip.",
    ][:n]
    return [chat_prompt_ids(tok, t) for t in texts]


@pytest.mark.slow
def test_speculative_output_equals_plain_greedy_with_any_drafter():
    """Lossless: same tokens as greedy decoding, with an untrained drafter and with the trained one."""
    from speclock.drafter.counters import SpecCounters, check_counters
    from speclock.drafter.manifest import load_drafter
    from speclock.drafter.reference import eos_ids, greedy_generate, speculative_generate

    model, tok = train_support.target_model("float32")
    stop = eos_ids(model, tok)
    trained, manifest = load_drafter(train_support.COMMITTED_DRAFTER, model, "cpu")
    for drafter, layers in ((train_support.random_drafter(model), [2, 15, 27]), (trained, manifest["aux_layers_after"])):
        counters = SpecCounters(k=3)
        for ids in _prompts(tok, 2):
            plain = greedy_generate(model, ids, N_TOKENS, stop)
            spec = speculative_generate(model, drafter, layers, ids, 3, N_TOKENS, stop, counters)
            assert spec == plain
        check_counters(counters.metrics())
    assert counters.num_accepted_tokens > 0  # the trained drafter is accepted at least sometimes


@pytest.mark.slow
def test_counters_add_up_over_a_run():
    from speclock.drafter.counters import check_counters
    from speclock.drafter.manifest import load_drafter
    from speclock.drafter.reference import run_reference

    model, tok = train_support.target_model("float32")
    drafter, manifest = load_drafter(train_support.COMMITTED_DRAFTER, model, "cpu")
    run = run_reference(model, tok, drafter, manifest["aux_layers_after"], _prompts(tok, 2), 3, 16)
    m = run.metrics
    check_counters(m)
    assert m["num_drafts"] >= 1
    # every verification step yields accepted + 1 tokens; drafts past max_tokens are counted, like vLLM
    assert sum(map(len, run.outputs)) <= m["num_drafts"] + m["num_accepted_tokens"] + len(run.outputs)
    assert m["mean_acceptance_length"] == pytest.approx(1 + m["num_accepted_tokens"] / m["num_drafts"])


def test_committed_manifest_follows_the_contract():
    from speclock.drafter.manifest import drafter_sha256, lookup_reference
    from speclock.drafter.models import read_drafter_manifest

    m = read_drafter_manifest(train_support.COMMITTED_DRAFTER, required=True, strict_schema=True)
    assert m["schema"] == "speclock.drafter/v1"
    assert set(m["target"]) >= {"name", "sha256", "architecture", "num_hidden_layers", "hidden_size", "vocab_size"}
    assert m["engine_layer_ids"]["vllm"] == m["aux_layers_after"]
    assert m["engine_layer_ids"]["sglang"] == [k - 1 for k in m["aux_layers_after"]]
    cfg = train_support.read_json(train_support.COMMITTED_DRAFTER / "config.json")
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == m["engine_layer_ids"]["vllm"]
    assert cfg["draft_vocab_size"] == m["draft_vocab_size"]
    assert (train_support.COMMITTED_DRAFTER / "model.safetensors").stat().st_size < 25 * 2**20
    for max_tokens in (64, 256):
        key = next(r["key"] for r in m["reference"] if r["key"]["max_tokens"] == max_tokens)
        assert key["num_prompts"] == 80 and key["k"] == 3
        assert key["drafter_sha256"] == drafter_sha256(train_support.COMMITTED_DRAFTER)
        assert lookup_reference(m, key)["num_drafts"] > 0


def test_manifest_of_another_target_is_refused(tmp_path):
    from speclock.drafter.manifest import check_manifest_matches_target
    from speclock.drafter.models import read_drafter_manifest

    target = train_support.real_target()
    m = read_drafter_manifest(train_support.COMMITTED_DRAFTER, required=True, strict_schema=True)
    check_manifest_matches_target(m, target)  # the real pair matches
    other = dict(m, target=dict(m["target"], sha256="0" * 64))
    with pytest.raises(CheckFailed, match="trained on target"):
        check_manifest_matches_target(other, target)


def test_target_without_chat_template_is_refused(tmp_path):
    from speclock.core.errors import BadInput
    from speclock.train.pipeline import load_target_model
    from speclock.train.settings import Settings

    target = train_support.real_target()
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in target.iterdir():
        if f.name != "chat_template.jinja":
            (bare / f.name).symlink_to(f)
    tc = train_support.read_json(target / "tokenizer_config.json")
    tc.pop("chat_template", None)
    (bare / "tokenizer_config.json").unlink()
    (bare / "tokenizer_config.json").write_text(__import__("json").dumps(tc))
    with pytest.raises(BadInput, match="no chat template"):
        load_target_model(Settings(work=tmp_path / "w", target=bare), "cpu")


def test_reference_cli_json_is_parseable_and_progress_goes_to_stderr(tmp_path):
    """`speclock train reference --json` on the real pair: stdout is one JSON document (progress
    lines go to stderr), and the counters it reports are consistent."""
    import json as _json
    import subprocess

    from speclock.drafter.counters import check_counters

    target = train_support.real_target()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        _json.dumps({"prompt": "Name three primary colours."}) + "\n" + _json.dumps({"prompt": "What is 12 times 7?"}) + "\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "speclock",
            "train",
            "reference",
            "--drafter",
            str(train_support.COMMITTED_DRAFTER),
            "--target",
            str(target),
            "--prompts",
            str(prompts),
            "-n",
            "2",
            "-k",
            "3",
            "--max-tokens",
            "8",
            "--device",
            "cpu",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(train_support.ROOT / "src")},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = _json.loads(r.stdout)
    (res,) = out["reference"]
    check_counters(res["metrics"])
    assert res["key"]["num_prompts"] == 2 and res["key"]["max_tokens"] == 8 and res["metrics"]["num_drafts"] > 0
    assert "reference worker 0: 2/2 prompts" in r.stderr and "mean acceptance length" in r.stderr
