"""Property-based fuzz of the runtime readers: drafter manifest and config, target config, recorded
reference results, prompt files, safetensors headers (issue #15).

The rule: a reader returns a value of the promised shape or raises BadInput naming the file (and
the key or line); any other exception is a defect. Full doctor runs import the engine and are slow,
so the readers are called directly; the CLI is fuzzed where a refusal happens before any engine
(doctor with the engine checks stubbed out, smoke with the tokenizer stubbed out).
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot
from helpers import EMPTY_SAFETENSORS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclock import engines
from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.drafter import models
from speclock.spec.prompts import load_prompts
from speclock.verify import doctor, smoke

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

TARGET_CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 30}
DRAFT_CFG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "num_hidden_layers": 1,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]},
}
KEY = {
    "target_sha256": "a" * 64,
    "drafter_sha256": "b" * 64,
    "prompts_sha256": "c" * 64,
    "num_prompts": 8,
    "k": 3,
    "max_tokens": 64,
}
METRICS = {
    "num_drafts": 10,
    "num_draft_tokens": 30,
    "num_accepted_tokens": 12,
    "accepted_per_position": [6, 4, 2],
    "acceptance_rate": 0.4,
    "mean_acceptance_length": 2.2,
}
MANIFEST = {
    "schema": "speclock.drafter/v1",
    "target": {"architecture": "LlamaForCausalLM", "num_hidden_layers": 30},
    "aux_layers_after": [2, 15, 27],
    "engine_layer_ids": {"vllm": [2, 15, 27]},
    "reference": [{"key": KEY, "metrics": METRICS}],
}

scalars = (
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12
)


def mutated(base: dict, paths: list[tuple]) -> st.SearchStrategy:
    """`base` with the value at one known key path replaced by random JSON (or the key dropped)."""

    def apply(path, value, drop):
        data = json.loads(json.dumps(base))
        node = data
        for part in path[:-1]:  # a missing object on the way is made (e.g. text_config in a plain config)
            node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
        if drop and isinstance(node, dict):
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
        return data

    return st.builds(apply, st.sampled_from(paths), json_values, st.booleans())


MANIFEST_PATHS = [
    ("schema",),
    ("target",),
    ("target", "architecture"),
    ("target", "num_hidden_layers"),
    ("aux_layers_after",),
    ("aux_layers_after", 1),
    ("engine_layer_ids",),
    ("engine_layer_ids", "vllm"),
    ("reference",),
    ("reference", 0),
    ("reference", 0, "key"),
    ("reference", 0, "key", "k"),
    ("reference", 0, "key", "num_prompts"),
    ("reference", 0, "key", "target_sha256"),
    ("reference", 0, "metrics"),
    ("reference", 0, "metrics", "mean_acceptance_length"),
    ("reference", 0, "metrics", "acceptance_rate"),
    ("reference", 0, "metrics", "accepted_per_position"),
    ("reference", 0, "metrics", "num_drafts"),
]
CONFIG_PATHS = [
    ("architectures",),
    ("architectures", 0),
    ("num_hidden_layers",),
    ("eagle_config",),
    ("eagle_config", "eagle_aux_hidden_state_layer_ids"),
    ("eagle_aux_hidden_state_layer_ids",),
    ("model_type",),
    ("text_config",),
    ("text_config", "num_hidden_layers"),
    ("text_config", "architectures"),
    ("text_config", "model_type"),
]

manifests = st.one_of(json_values, mutated(MANIFEST, MANIFEST_PATHS))
configs = st.one_of(json_values, mutated(DRAFT_CFG, CONFIG_PATHS))


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))


def folders(tmp_path: Path) -> tuple[Path, Path]:
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir(exist_ok=True)
    draft.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps(TARGET_CFG))
    (draft / "config.json").write_text(json.dumps(DRAFT_CFG))
    (draft / "speclock-manifest.json").write_text(json.dumps(MANIFEST))
    # smoke checks weights (whole: weights_check) and a tokenizer are there before it reads the rest (#26, #40)
    (target / "tokenizer.json").write_text("{}")
    for placeholder in (target / "model.safetensors", draft / "model.safetensors"):
        placeholder.write_bytes(EMPTY_SAFETENSORS)
    return target, draft


def put(path: Path, data) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def is_layer_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)


# ---------------------------------------------------------------- drafter manifest


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), manifests.map(lambda v: json.dumps(v).encode())))
def test_fuzz_drafter_manifest_reader_returns_a_checked_manifest_or_refuses_naming_it(tmp_path, data):
    _, draft = folders(tmp_path)
    path = put(draft / "speclock-manifest.json", data)
    try:
        manifest = doctor.load_manifest(draft)
    except BadInput as err:
        assert str(path) in str(err)
        return
    # Accepted: everything doctor and smoke read from it has its promised type.
    assert isinstance(manifest, dict) and is_layer_list(manifest["aux_layers_after"])
    for rec in manifest.get("reference") or []:
        assert isinstance(rec["key"], dict) and isinstance(rec["metrics"]["mean_acceptance_length"], (int, float))


@FUZZ
@given(data=mutated(MANIFEST, MANIFEST_PATHS))
def test_fuzz_recorded_references_refuse_or_match_only_the_exact_key(tmp_path, data):
    _, draft = folders(tmp_path)
    path = put(draft / "speclock-manifest.json", data)
    try:
        found = smoke.lookup_recorded(path, dict(KEY))
    except BadInput as err:
        assert str(path) in str(err)
        return
    if found is not None:  # a match is only ever the record with exactly this key, with checked metrics
        recs = [r for r in data["reference"] if json.dumps(r["key"], sort_keys=True) == json.dumps(KEY, sort_keys=True)]
        assert recs and found == recs[-1]["metrics"]
        assert isinstance(found["mean_acceptance_length"], (int, float)) and found["mean_acceptance_length"] >= 1


@FEW
@given(data=st.one_of(st.binary(max_size=120), manifests.map(lambda v: json.dumps(v).encode())))
def test_fuzz_doctor_cli_with_a_random_manifest_refuses_before_the_engine(tmp_path, monkeypatch, data):
    def no_engine(*_a, **_k):
        raise EnvironmentProblem("fuzz: the engine checks are not run here")

    monkeypatch.setattr(doctor.runner, "run_doctor", no_engine)  # looked up in the runner
    target, draft = folders(tmp_path)
    path = put(draft / "speclock-manifest.json", data)
    before = snapshot(tmp_path)
    code, _, err = run_cli("doctor", "--stack", "cpu-vllm", "--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2, 3))
    if code == 2:
        assert str(path) in err
    else:
        assert "fuzz: the engine checks" in err
    assert_nothing_written(before, snapshot(tmp_path), except_under=(tmp_path / "cache",))


# ---------------------------------------------------------------- drafter and target config


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), configs.map(lambda v: json.dumps(v).encode())))
def test_fuzz_drafter_config_reader_gives_layer_ids_or_refuses_naming_it(tmp_path, data):
    _, draft = folders(tmp_path)
    path = put(draft / "config.json", data)
    try:
        ids, source = engines.aux_layer_ids(draft, 30)
    except BadInput as err:
        assert str(path) in str(err)
        return
    assert is_layer_list(ids) and source in ("draft config", "engine default (2, N//2, N-3)")


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=200), st.one_of(json_values, mutated(TARGET_CFG, CONFIG_PATHS)).map(lambda v: json.dumps(v).encode())
    )
)
def test_fuzz_target_config_reader_gives_facts_or_refuses_naming_it(tmp_path, data):
    target, draft = folders(tmp_path)
    path = put(target / "config.json", data)
    ctx = doctor.Context(
        stack=None, python=None, python_note="", site_packages=None, lock_path=None, target_dir=target, draft_dir=draft
    )
    try:
        facts = doctor.target_facts(ctx, None)
    except BadInput as err:
        assert str(path) in str(err)
        return
    assert facts["arch"] is None or isinstance(facts["arch"], str)
    n = facts["num_hidden_layers"]
    assert n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0)


# ---------------------------------------------------------------- prompt files

prompt_lines = st.lists(
    st.one_of(
        json_values.map(json.dumps),
        st.text(max_size=20).filter(lambda s: "\n" not in s),
        st.just(json.dumps({"prompt": "a fine question"})),
    ),
    max_size=6,
)


@FUZZ
@given(lines=prompt_lines, raw=st.one_of(st.none(), st.binary(max_size=60)))
def test_fuzz_prompt_file_reader_gives_texts_or_refuses_naming_file_and_line(tmp_path, lines, raw):
    path = tmp_path / "p.jsonl"
    data = raw if raw is not None else "\n".join(lines).encode()
    path.write_bytes(data)
    try:
        texts = load_prompts(path)
    except BadInput as err:
        msg = str(err)
        assert str(path) in msg
        m = re.search(re.escape(str(path)) + r":(\d+):", msg)
        if m:  # the line named is a line of the file
            assert 1 <= int(m[1]) <= data.count(b"\n") + 1
        else:
            assert "holds no prompts" in msg
        return
    assert texts and all(isinstance(t, str) and t.strip() for t in texts)


@FEW
@given(lines=prompt_lines)
def test_fuzz_smoke_cli_with_random_prompt_lines(tmp_path, monkeypatch, lines):
    def stop(*_a, **_k):
        raise EnvironmentProblem("fuzz: stopped before the tokenizer")

    fake = types.ModuleType("transformers")
    fake.AutoTokenizer = types.SimpleNamespace(from_pretrained=stop)
    monkeypatch.setitem(sys.modules, "transformers", fake)
    target, draft = folders(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(lines))
    before = snapshot(tmp_path)
    code, _, err = run_cli("smoke", "--target", target, "--draft", draft, "--prompts", prompts, "--out", tmp_path / "out")
    assert_clean_refusal(code, err, allowed=(2, 3))
    if code == 2:
        assert str(prompts) in err
    else:
        assert "fuzz: stopped before the tokenizer" in err
    assert_nothing_written(before, snapshot(tmp_path), except_under=(tmp_path / "out", tmp_path / "cache"))
    assert not (tmp_path / "out" / "report.json").exists()


# ---------------------------------------------------------------- safetensors headers (target identity)


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=64), json_values.map(lambda v: len(json.dumps(v)).to_bytes(8, "little") + json.dumps(v).encode())
    )
)
def test_fuzz_safetensors_header_reader(tmp_path, data):
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    path = put(folder / "model.safetensors", data)
    try:
        digest = models.target_sha256(folder)
    except BadInput as err:
        assert str(path) in str(err)
        return
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
