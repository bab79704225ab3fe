"""The stack file's typed model (#38): spec.stack_types.StackDoc is the one source of the keys' types, allowed values,
defaults and JSON Schema. A bad value names the file and the key path (exit 2); an unknown key is refused, naming the
key and the file; the published schema is the one `speclock stack schema` prints, and every committed stack fits it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import test_stack
from fuzz_support import run_cli

from speclock.core.docmodel import schema_text
from speclock.core.errors import BadInput
from speclock.spec.schema import ARCH_MIN_CUDA, KNOWN_ENGINES, SCHEMA, STACK, json_schema
from speclock.spec.stack import load_stack
from speclock.spec.stack_types import Arch

# test_stack's bad stacks (edit, key, words): the same refusals, with pydantic and without
_BAD_STACKS = test_stack.test_bad_stack_names_file_and_key.pytestmark[0].args[1]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = (ROOT / "stacks" / "cpu-vllm.toml").read_text()


@pytest.fixture(params=["load_stack", "pydantic"])
def checker(request, monkeypatch):
    """Each refusal test runs as load_stack checks (the model's table, then pydantic's words for a stack at fault)
    and through pydantic alone."""
    if request.param == "pydantic":
        from speclock.spec import validate

        monkeypatch.setattr(validate, "check_types", validate.check_types_pydantic)
    return request.param


def _refused(tmp_path: Path, text: str) -> BadInput:
    path = tmp_path / "cpu-vllm.toml"
    path.write_text(text)
    with pytest.raises(BadInput) as err:
        load_stack(path)
    assert err.value.message.startswith(f"{path}: ") and err.value.exit_code == 2
    return err.value


# A bad value per kind of fault, and the words that name it (pydantic's: load_stack gives them for a stack at fault)
_BAD_VALUES = [
    (
        lambda t: t.replace("\nmax_tokens = 64", "\nmax_tokens = true"),
        "key 'smoke.max_tokens': expected integer, got boolean",
    ),
    (lambda t: t.replace("min_speedup = 0.9", 'min_speedup = "1"'), "key 'smoke.thresholds.min_speedup': expected number"),
    (
        lambda t: t.replace("[0.2, 0.05]", '[0.2, "x"]'),
        "key 'smoke.thresholds.min_acceptance_per_position[1]'",
    ),
    (
        lambda t: t.replace("[engine]\n", '[engine]\nk_per_batch_size = [[1, 8, "3"]]\n'),
        "key 'engine.k_per_batch_size[0][2]'",
    ),
    (lambda t: t.replace('kind = "debian-rootfs"', 'kind = "docker"'), "key 'base.kind': 'docker' is not allowed"),
    (lambda t: t + '\n[kernels]\nbuild = ["fp16-pack"]\n', "key 'kernels.build[0]': 'fp16-pack' is not allowed"),
    (lambda t: t.replace("settings = {", "settings = 3\nx = {"), "key 'engine.settings': expected object, got number (3)"),
    (lambda t: t.replace("schema = 1", "schema = true"), "key 'schema': expected 1, got boolean"),
]


@pytest.mark.parametrize("edit, message", _BAD_VALUES)
def test_a_bad_stack_value_names_the_file_and_the_key_path(tmp_path, checker, edit, message):
    assert message in _refused(tmp_path, edit(DEFAULT)).message


def test_an_unknown_key_is_refused_naming_it_and_what_the_section_takes(tmp_path, checker):
    err = _refused(tmp_path, DEFAULT.replace("min_speedup = 0.9", "min_speedupp = 0.9"))
    assert "key 'smoke.thresholds.min_speedupp': unknown key" in err.message
    assert "min_speedup" in err.hint and "max_reference_gap" in err.hint
    err = _refused(tmp_path, DEFAULT.replace("[engine]\n", "[engine]\nflavour = 1\n"))
    assert "key 'engine.flavour': unknown key" in err.message and "k_per_batch_size" in err.hint


def test_a_section_that_is_no_table_or_is_missing_says_so(tmp_path, checker):
    body = DEFAULT.split("[", 1)  # the top-level keys, then the sections
    err = _refused(tmp_path, body[0] + 'gpu = "none"\n[' + body[1])
    assert "key 'gpu': expected a table [gpu], got string ('none')" in err.message
    err = _refused(tmp_path, DEFAULT + "\n[engine_]\nx = 1\n")

    assert "key 'engine_': unknown section" in err.message and "sections base, python" in err.hint


def test_the_defaults_come_from_the_model_and_an_int_is_a_number(tmp_path, checker):
    stack = load_stack("cpu-vllm")
    for section, fields in SCHEMA.items():
        table = stack.data if not section else stack.data[section]
        for key, (_kind, required, default, _doc, _allowed) in fields.items():
            assert key in table, (section, key)
            if not required and section in ("serve", "patches"):  # cpu-vllm sets neither section: every default
                assert table[key] == default
    path = tmp_path / "cpu-vllm.toml"
    path.write_text(DEFAULT.replace("min_speedup = 0.9", "min_speedup = 1"))
    assert load_stack(path).thresholds["min_speedup"] == 1


def test_the_published_schema_is_what_stack_schema_prints_and_every_stack_fits_it():
    published = json.loads((ROOT / "schemas" / "stack.schema.json").read_text())
    assert published == json.loads(schema_text(STACK)) == json_schema()
    code, out, _ = run_cli("stack", "schema")
    assert code == 0 and json.loads(out) == published
    assert "$defs" not in json.dumps(published) and "$ref" not in json.dumps(published)
    for path in sorted((ROOT / "stacks").glob("*.toml")):
        jsonschema.validate(tomllib.loads(path.read_text()), published)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**tomllib.loads(DEFAULT), "turbo": {"x": 1}}, published)


def test_the_model_and_the_tables_that_name_values_agree():
    assert set(Arch.__args__) == set(ARCH_MIN_CUDA)
    assert json_schema()["properties"]["engine"]["properties"]["name"]["enum"] == list(KNOWN_ENGINES)
    assert SCHEMA["smoke"]["num_prompts"] == ("int", False, 80, "prompts per smoke run", None)
    assert SCHEMA["gpu"]["archs"][4] == list(ARCH_MIN_CUDA)


# ------------------------------------------- pydantic and the model's table: one model, two checks, the same answers
# load_stack checks through the table (spec.stack_plain: no pydantic import on every command's path); pydantic checks
# the same model (spec.schema.STACK). Both must agree on every committed stack and refuse every bad one alike.


def _through_pydantic(monkeypatch):
    from speclock.spec import validate

    monkeypatch.setattr(validate, "check_types", validate.check_types_pydantic)


def test_load_stack_does_not_import_pydantic():
    probe = "import sys\nfrom speclock.spec.stack import load_stack\nload_stack('stacks/cpu-vllm.toml')\nprint('pydantic' in sys.modules)\n"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.parametrize("edit, message", _BAD_VALUES)
def test_without_pydantic_the_table_refuses_every_bad_value_naming_its_key(tmp_path, monkeypatch, edit, message):
    from speclock.core.errors import EnvironmentProblem
    from speclock.spec import validate

    def no_pydantic(*_args, **_kw):
        raise EnvironmentProblem("pydantic is not installed here")

    monkeypatch.setattr(validate, "validate_model", no_pydantic)
    err = _refused(tmp_path, edit(DEFAULT))
    key = message.split("'")[1]  # the table names the key, not the index inside its list
    assert f"key '{key.split('[')[0]}" in err.message or "unknown key" in err.message, err.message


def test_through_pydantic_every_stack_reads_the_same(monkeypatch):
    stacks = sorted((ROOT / "stacks").glob("*.toml"))
    through_table = [load_stack(p) for p in stacks]
    _through_pydantic(monkeypatch)
    for path, stack in zip(stacks, through_table, strict=True):
        model = load_stack(path)
        assert model.data == stack.data and model.source_sha256 == stack.source_sha256, path.name


@pytest.mark.parametrize("edit, key, words", _BAD_STACKS)
def test_through_pydantic_a_bad_stack_is_refused_in_the_same_words(tmp_path, monkeypatch, edit, key, words):
    _through_pydantic(monkeypatch)
    err = _refused(tmp_path, edit(DEFAULT))
    assert f"'{key}'" in err.message and words in err.message


def test_without_pydantic_stack_check_runs_and_refuses_with_exit_2(tmp_path):
    probe = (
        "import sys\nsys.modules['pydantic'] = sys.modules['pydantic_core'] = sys.modules['typing_extensions'] = None\n"
        "from speclock.cli import main\nraise SystemExit(main(['stack', 'check', sys.argv[1]]))\n"
    )
    run = [sys.executable, "-c", probe]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    good = subprocess.run([*run, "cpu-vllm"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert good.returncode == 0 and "stack cpu-vllm" in good.stdout, good.stderr
    path = tmp_path / "cpu-vllm.toml"
    path.write_text(DEFAULT.replace("[engine]\n", "[engine]\nflavour = 1\n"))
    bad = subprocess.run([*run, str(path)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert bad.returncode == 2 and f"{path}: key 'engine.flavour': unknown key" in bad.stderr, bad.stderr
