"""The static generator against transformers, its sampling mode, and prompts written by the target."""

from __future__ import annotations

import json

import pytest
import train_support


def _prompts(tok, texts):
    from speclock.spec.prompts import chat_prompt_ids

    return [chat_prompt_ids(tok, t) for t in texts]


TEXTS = ["Name three primary colours.", "Write a haiku about rain, please.", "What is 12 times 7?"]


def test_static_generator_greedy_equals_transformers_generate():
    import torch

    from speclock.train.fastgen import StaticLlamaGenerator

    model, tok = train_support.target_model()
    prompts = _prompts(tok, TEXTS)
    gen = StaticLlamaGenerator(model, tok, batch_size=2, max_prompt_tokens=96, max_new_tokens=12)
    ours = gen.generate(prompts)  # two batches: one full, one padded with a repeated row
    for p, got in zip(prompts, ours, strict=True):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p) :].tolist()
        stop = set(gen.stop)
        cut = next((i + 1 for i, t in enumerate(ref) if t in stop), len(ref))
        assert got == ref[:cut]


def test_sampling_is_seeded_varied_and_min_p_near_one_is_greedy():
    import torch

    from speclock.core.errors import BadInput
    from speclock.train.fastgen import StaticLlamaGenerator

    model, tok = train_support.target_model()
    prompt = _prompts(tok, ["Tell me something about the sea."])[0]
    greedy = StaticLlamaGenerator(model, tok, 4, 64, 10).generate([prompt])[0]
    sampler = StaticLlamaGenerator(model, tok, 4, 64, 10, temperature=1.5)
    torch.manual_seed(3)
    a = sampler.generate([prompt] * 4)
    torch.manual_seed(3)
    b = sampler.generate([prompt] * 4)
    assert a == b  # the draw follows torch's seed
    assert len({tuple(r) for r in a}) > 1  # rows of one batch draw independently
    # min-p keeps only tokens within min_p of the top probability: near 1, that is the argmax.
    sharp = StaticLlamaGenerator(model, tok, 4, 64, 10, temperature=1.0, min_p=0.999)
    assert sharp.generate([prompt])[0] == greedy
    with pytest.raises(BadInput, match="min_p"):
        StaticLlamaGenerator(model, tok, 4, 64, 10, temperature=1.0, min_p=1.0)
    with pytest.raises(BadInput, match="temperature"):
        StaticLlamaGenerator(model, tok, 4, 64, 10, temperature=-1.0)


def test_user_turn_prefix_ends_where_the_user_text_starts():
    from speclock.train.selfprompt import user_turn_prefix

    _, tok = train_support.target_model()
    prefix = user_turn_prefix(tok)
    text = tok.decode(prefix)
    assert text.endswith("<|im_start|>user\n")
    assert "<|im_start|>system" in text  # SmolLM2's template adds its default system prompt
    full = tok.apply_chat_template([{"role": "user", "content": "hello there"}], tokenize=False)
    assert full.startswith(text)


def test_acceptable_requests():
    from speclock.train.selfprompt import acceptable

    assert acceptable("Can you write a short poem about autumn leaves?")
    assert not acceptable("hi")  # too short
    assert not acceptable("one two")  # fewer than three words
    assert not acceptable("the " * 40)  # a loop
    assert not acceptable("word " * 600)  # too long


def test_self_prompts_are_distinct_and_a_rerun_adds_to_the_file(tmp_path):
    from speclock.train.prompt_sources import load_prompt_records
    from speclock.train.selfprompt import synthesize_prompts

    model, tok = train_support.target_model()
    out = tmp_path / "self.jsonl"
    first = synthesize_prompts(model, tok, out, 3, batch_size=4, max_new_tokens=48, log=lambda m: None)
    assert first["prompts"] == 3 and first["new"] == 3
    before = out.read_text().splitlines()
    with open(out, "a") as f:
        f.write('{"id": "self:99", "conversa')  # killed mid-write
    second = synthesize_prompts(model, tok, out, 5, batch_size=4, max_new_tokens=48, log=lambda m: None)
    assert second["prompts"] == 5 and second["new"] == 2
    lines = out.read_text().splitlines()
    assert lines[:3] == before  # kept as they were, the torn line gone
    recs = [json.loads(x) for x in lines]
    ids = [r["id"] for r in recs]
    assert ids == [f"self:{i}" for i in range(5)]
    texts = [r["conversations"][0]["value"] for r in recs]
    assert len({" ".join(t.lower().split()) for t in texts}) == 5
    # the file is a prompt source like any chat JSONL
    assert [r["prompt"] for r in load_prompt_records(str(out), None)] == texts


def test_a_foreign_file_is_refused_with_its_line(tmp_path):
    from speclock.core.errors import BadInput
    from speclock.train.selfprompt import synthesize_prompts

    model, tok = train_support.target_model()
    out = tmp_path / "self.jsonl"
    out.write_text(
        '{"id": "self:0", "conversations": [{"from": "human", "value": "Write a limerick about a cat."}]}\n'
        '{"prompt": "not one of ours"}\n'
    )
    with pytest.raises(BadInput, match=r"self.jsonl:2: not a self-prompt record"):
        synthesize_prompts(model, tok, out, 4, batch_size=2, max_new_tokens=8, log=lambda m: None)
    with pytest.raises(BadInput, match="-n must be positive"):
        synthesize_prompts(model, tok, tmp_path / "x.jsonl", 0, log=lambda m: None)


def test_mix_draws_from_each_source_and_records_it(tmp_path):
    from speclock.core.errors import BadInput
    from speclock.train.prompt_sources import load_prompt_records, mix_prompt_files

    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"id": f"a:{i}", "prompt": f"question a{i}"}) + "\n" for i in range(4)))
    b.write_text("".join(json.dumps({"id": f"b:{i}", "prompt": f"question b{i}"}) + "\n" for i in range(10)))
    out = tmp_path / "mix.jsonl"
    res = mix_prompt_files([(a, 0), (b, 3)], out, seed=1, notes={"a.jsonl": "all of them"})
    recs = load_prompt_records(str(out), None)
    assert res["per_source"] == {"a.jsonl": 4, "b.jsonl": 3} and len(recs) == 7
    assert [r["id"] for r in recs[:4]] == [f"a:{i}" for i in range(4)]
    again = tmp_path / "mix2.jsonl"
    mix_prompt_files([(a, 0), (b, 3)], again, seed=1)
    assert [r["id"] for r in load_prompt_records(str(again), None)] == [r["id"] for r in recs]  # seeded
    side = json.loads((tmp_path / "mix.jsonl.sources.json").read_text())
    assert side["prompts"] == 7 and side["notes"] == {"a.jsonl": "all of them"}
    with pytest.raises(BadInput, match="share ids"):
        mix_prompt_files([(a, 0), (a, 0)], tmp_path / "bad.jsonl")
    assert not (tmp_path / "bad.jsonl").exists()


def test_generate_with_self_prompts_regenerates_the_mix_and_reruns_keep_it(tmp_path):
    from speclock.train.data import read_done
    from speclock.train.pipeline import stage_generate
    from speclock.train.settings import quick_settings

    model, tok = train_support.target_model()
    s = quick_settings(
        tmp_path,
        target=train_support.real_target(),
        num_prompts=2,
        self_prompts=2,
        max_new_tokens=4,
        gen_batch=4,
        max_prompt_tokens=2048,
    )
    first = stage_generate(s, model, tok, "cpu")
    done = read_done(tmp_path / "responses.jsonl")
    assert sorted(k.split(":")[0] for k in done) == ["self", "self", "sharegpt", "sharegpt"]
    assert first["self_prompts"]["prompts"] == 2
    side = json.loads((tmp_path / "prompts-mix.jsonl.sources.json").read_text())
    assert side["per_source"] == {"self-prompts.jsonl": 2, "sharegpt": 2}
    mix = (tmp_path / "prompts-mix.jsonl").read_text()
    again = stage_generate(s, model, tok, "cpu")  # nothing new: same requests, same mix, no new responses
    assert (tmp_path / "prompts-mix.jsonl").read_text() == mix
    assert again["new_this_run"] == 0 and again["self_prompts"]["new"] == 0


def test_user_turn_end_is_the_templates_closing_token():
    from speclock.train.selfprompt import user_turn_end

    _, tok = train_support.target_model()
    assert tok.convert_ids_to_tokens(user_turn_end(tok)) == ["<|im_end|>"]


def test_mix_drops_mtbench_questions_and_counts_them(tmp_path):
    """MT-Bench stays out of training: a prompt equal to a judged question (any turn, any case/punctuation/spacing),
    or containing a long one, is dropped before the draw and counted per source in the sources record."""
    from speclock.spec.prompts import load_prompts
    from speclock.train.prompt_sources import judged_prompt_texts, load_prompt_records, mix_prompt_files

    judged = judged_prompt_texts()
    first = load_prompts(None, 2)
    assert len(judged) >= 150  # 80 questions x 2 turns (a few second turns repeat)
    a = tmp_path / "a.jsonl"
    rows = [
        {"id": "a:0", "prompt": first[0].upper().replace(" ", "   ") + "!!"},  # same words, other case/spacing
        {"id": "a:1", "prompt": "Please help: " + first[1]},  # contains a long judged question
        {"id": "a:2", "prompt": "Rewrite your previous response. Start every sentence with the letter A."},  # a 2nd turn
        {"id": "a:3", "prompt": "Write a haiku about autumn leaves."},
        {"id": "a:4", "prompt": "How do I sort a list in Python?"},
    ]
    a.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "mix.jsonl"
    res = mix_prompt_files([(a, 0)], out, exclude=judged)
    assert [r["id"] for r in load_prompt_records(str(out), None)] == ["a:3", "a:4"]
    side = json.loads((tmp_path / "mix.jsonl.sources.json").read_text())
    assert res["excluded"] == side["excluded"] == {"a.jsonl": 3} and "normalised" in side["excluded_how"]
    # without the list nothing is dropped (the filter, not the data, removed them)
    assert mix_prompt_files([(a, 0)], tmp_path / "all.jsonl")["prompts"] == 5
