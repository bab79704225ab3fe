"""One reader for every JSON text (issue #40, item 6): core/jsonread.py. Whatever it parses (a file, an engine's or a
registry's reply, a tool's output, an envelope's payload, a JSONL line) is capped at 64 MiB, may not repeat a key in
an object and nests at most MAX_DEPTH levels; a refusal of a user's file is exit 2 naming the file (and the line)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fuzz_support import run_cli

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import read_json
from speclock.core.jsonread import MAX_DEPTH, MAX_READ_BYTES, JSONRefused, loads, parse_json
from speclock.spec.pylock import read_pylock

SRC = Path(__file__).resolve().parents[1] / "src" / "speclock"
READER = SRC / "core" / "jsonread.py"
# Modules that may parse JSON themselves, each with why.
OWN_PARSER = {
    "drafter/gguf_convert.py": "self-contained: the image build runs it alone (tests/test_build_stage_packages.py); "
    "it reads back the config.json that transformers has just written",
}
PARSING = re.compile(r"\bjson\.loads?\(|\bfrom json import\b[^\n]*\bloads?\b|\bJSONDecoder\(|\bjson\.decoder\b")


def test_no_module_parses_json_outside_the_reader():
    stray = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if path == READER or rel in OWN_PARSER:
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if PARSING.search(line):
                stray.append(f"src/speclock/{rel}:{lineno}: {line.strip()}")
    assert not stray, "JSON parsed outside core/jsonread.py (use jsonread.loads or parse_json):\n" + "\n".join(stray)


def test_each_own_parser_still_parses_json():
    """An entry of OWN_PARSER whose module no longer parses JSON is removed, not kept as a standing exception."""
    for rel in OWN_PARSER:
        assert PARSING.search((SRC / rel).read_text()), rel


# --- the reader ---------------------------------------------------------------------------------


def test_a_key_twice_is_refused_naming_the_file_the_key_and_the_line(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('{\n  "a": {"k": 1},\n  "b": [{"x": 1,\n    "x": 2}]\n}\n')
    with pytest.raises(BadInput) as err:
        read_json(path)
    assert err.value.exit_code == 2
    assert err.value.message == f"{path}:4: the JSON file has the key 'x' twice in one object"


def test_the_same_key_in_two_objects_is_fine():
    assert loads('[{"a": 1}, {"a": 2, "b": {"a": 3}}]') == [{"a": 1}, {"a": 2, "b": {"a": 3}}]


@pytest.mark.parametrize("text", ["[" * 100_000, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), '{"a":' * 200 + "1" + "}" * 200])
def test_nesting_deeper_than_the_bound_is_refused_naming_the_file(tmp_path, text):
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(BadInput, match=rf"^{re.escape(str(path))}:1: the JSON file nests deeper than {MAX_DEPTH} levels"):
        read_json(path, expect=object)


def test_nesting_up_to_the_bound_and_brackets_inside_strings_are_read():
    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    deep_text = "[" * 500 + '\\"' + "{" * 500
    assert loads(json.dumps({"s": deep_text, "t": ["]]]}}}"]})) == {"s": deep_text, "t": ["]]]}}}"]}


def test_an_unterminated_string_full_of_escaped_quotes_is_refused_at_once():
    """The bracket scan skips strings in linear time: no backtracking over a crafted text."""
    with pytest.raises(json.JSONDecodeError):
        loads('"' + '\\"' * 2_000_000)


def test_text_over_the_cap_is_refused_whatever_its_source():
    big = '"' + "a" * MAX_READ_BYTES + '"'  # a valid JSON string, one MiB past the cap with its quotes
    with pytest.raises(JSONRefused, match="more than the 64 MiB"):
        loads(big)
    with pytest.raises(BadInput, match=r"^http://127\.0\.0\.1:8000/v1/models: the reply is 64\.0 MiB, more than the 64 MiB"):
        parse_json(big, "http://127.0.0.1:8000/v1/models", what="reply", expect=object)
    with pytest.raises(JSONRefused, match="more than the 64 MiB"):
        loads(big.encode())


def test_a_reply_that_is_not_user_input_keeps_its_callers_class():
    with pytest.raises(EnvironmentProblem) as err:
        parse_json(b'{"data": 1, "data": 2}', "http://127.0.0.1:8000/v1/models", what="reply", error=EnvironmentProblem)
    assert err.value.exit_code == 3
    assert err.value.message == "http://127.0.0.1:8000/v1/models (line 1): the reply has the key 'data' twice in one object"


def test_callers_that_catch_json_errors_catch_the_refusals_too():
    """JSONL readers and best-effort readers catch ValueError (json's own errors): the refusals are ValueErrors."""
    for text in ('{"a": 1, "a": 1}', "[" * 1000):
        with pytest.raises(ValueError):
            loads(text)


def test_nan_is_refused_where_json_is_strict():
    assert str(loads("NaN")) == "nan"  # a tool's output: as json reads it
    for text in ("NaN", "[1e999]", "-Infinity"):
        with pytest.raises(ValueError):
            loads(text, allow_nan=False)


# --- through the command line: exit 2 naming the file -----------------------------------------------

STACK = "cpu-vllm"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _record(cache: Path, text: str) -> Path:
    folder = cache / "images" / STACK
    folder.mkdir(parents=True)
    (folder / "latest.buildah.json").write_text(text)
    return folder / "latest.buildah.json"


def _valid_record() -> dict:
    return {
        "stack": STACK,
        "tag": "0123456789abcdef",
        "ref": f"localhost/speclock-{STACK}:0123456789abcdef",
        "builder": "buildah",
        "image_id": "sha256:" + "ab" * 32,
        "labels": {},
        "selfcheck": {"verdict": "pass", "exit_code": 0, "outputs": "/x"},
    }


def test_a_build_record_with_a_key_twice_is_exit_2_naming_the_file_and_line(cache):
    text = json.dumps(_valid_record(), indent=2)
    text = text.replace('  "builder": "buildah",', '  "builder": "buildah",\n  "ref": "localhost/other:tag",')
    path = _record(cache, text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "localhost/other" in t)
    code, _out, err = run_cli("push-image", "--stack", STACK, "--registry", "127.0.0.1:9")
    assert code == 2, err
    assert f"{path}:{line}: the build record has the key 'ref' twice in one object" in err


@pytest.mark.parametrize("nested", ["[" * 100_000, "[" * 200 + "]" * 200])
def test_a_deeply_nested_attestation_is_exit_2_naming_the_file(cache, tmp_path, nested):
    _record(cache, json.dumps(_valid_record()))
    envelope = tmp_path / "attestation.intoto.json"
    envelope.write_text(nested)
    code, _out, err = run_cli("push-image", "--stack", STACK, "--registry", "127.0.0.1:9", "--attestation", str(envelope))
    assert code == 2, err
    assert f"{envelope}:1: the DSSE envelope nests deeper than {MAX_DEPTH} levels" in err


def test_an_attestation_over_the_cap_is_refused_unread(cache, tmp_path):
    _record(cache, json.dumps(_valid_record()))
    envelope = tmp_path / "attestation.intoto.json"
    with open(envelope, "wb") as f:
        f.truncate(MAX_READ_BYTES + 1)  # sparse: nothing to read, a size to refuse
    code, _out, err = run_cli("push-image", "--stack", STACK, "--registry", "127.0.0.1:9", "--attestation", str(envelope))
    assert code == 2, err
    assert f"{envelope}: the --attestation file is 64.0 MiB, more than the 64 MiB such a file can be" in err


def test_a_pylock_over_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "pylock.x.toml"
    with open(path, "wb") as f:
        f.truncate(MAX_READ_BYTES + 1)
    with pytest.raises(BadInput, match=r"the pylock file is 64\.0 MiB, more than the 64 MiB"):
        read_pylock(path)
