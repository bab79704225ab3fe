"""Counts, ports, addresses and repository paths are refused where they are given (exit 2, the key or option
named), before any engine starts: a k of a million or a port of 70000 would otherwise reach a printed command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EMPTY_SAFETENSORS

from speclock.core.layout import REPO_ROOT

STACK = REPO_ROOT / "stacks" / "cpu-vllm.toml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "speclock", *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def stack_with(tmp_path: Path, old: str, new: str) -> Path:
    text = STACK.read_text()
    assert old in text, old
    dest = tmp_path / "cpu-vllm.toml"
    dest.write_text(text.replace(old, new, 1))
    return dest


@pytest.mark.parametrize(
    "option,value,words",
    [
        ("-k", "1000000", "from 1 to 16"),
        ("-k", "0", "from 1 to 16"),
        ("--port", "70000", "from 1 to 65535"),
        ("--port", "0", "from 1 to 65535"),
        ("--host", "", "is not an address"),
        ("--host", "a b", "is not an address"),
    ],
)
def test_serve_refuses_counts_ports_and_addresses_no_server_could_use(option, value, words):
    r = cli("serve", "--print-command", option, value)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and r.stdout == ""


@pytest.mark.parametrize(
    "old,new,key",
    [
        ('path = "models/smollm2-135m-eagle3"', 'path = "../../../../etc"', "draft.path"),
        ('path = "models/smollm2-135m-eagle3"', 'path = "/etc"', "draft.path"),
        ("num_speculative_tokens = 3", "num_speculative_tokens = 100000", "smoke.num_speculative_tokens"),
        ("num_prompts = 80", "num_prompts = 1000000000000000", "smoke.num_prompts"),
        ("max_tokens = 64", "max_tokens = 10000000", "smoke.max_tokens"),
    ],
)
def test_stack_check_refuses_paths_out_of_the_repository_and_counts_out_of_range(tmp_path, old, new, key):
    r = cli("stack", "check", str(stack_with(tmp_path, old, new)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"key '{key}'" in r.stderr and "valid" not in r.stdout


def test_stack_check_refuses_a_serving_k_no_engine_accepts(tmp_path):
    text = STACK.read_text()
    dest = tmp_path / "cpu-vllm.toml"
    dest.write_text(
        text + "\n[serve]\nnum_speculative_tokens = 1000000000\n"
        if "[serve]" not in text
        else text.replace("[serve]\n", "[serve]\nnum_speculative_tokens = 1000000000\n", 1)
    )
    r = cli("stack", "check", str(dest))
    assert r.returncode == 2 and "key 'serve.num_speculative_tokens'" in r.stderr, r.stderr


def test_the_committed_stacks_stay_within_the_bounds():
    for stack in sorted((REPO_ROOT / "stacks").glob("*.toml")):
        r = cli("stack", "check", str(stack))
        assert r.returncode == 0, (stack, r.stderr)


@pytest.mark.parametrize("files,words", [((), "has a config.json but no weights"), (("model.safetensors",), "has no tokenizer")])
def test_smoke_refuses_a_target_without_weights_or_tokenizer_before_any_engine_starts(tmp_path, files, words):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text((REPO_ROOT / "models/smollm2-135m-eagle3/config.json").read_text())
    for name in files:
        (target / name).write_bytes(EMPTY_SAFETENSORS)
    r = cli(
        "smoke", "--target", str(target), "--draft", str(REPO_ROOT / "models/smollm2-135m-eagle3"), "--out", str(tmp_path / "out")
    )
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and str(target) in r.stderr
    assert "starting" not in r.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "option,value", [("--num-prompts", "1000000000000000"), ("--max-tokens", "10000000"), ("--concurrency", "100000000")]
)
def test_smoke_bounds_its_counts_at_parse(option, value, tmp_path):
    r = cli("smoke", option, value, "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and option in r.stderr and "is not allowed" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
