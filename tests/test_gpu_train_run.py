"""benchmarks/gpu/train_run.py, the GPU training runner, on this CPU: parts made by make_parts.py --files and staged
by run.py's code, and the phase logic over real calls (a part still missing, a phase done and skipped, a failed
phase held until --retry, a phase cut short by the call's time leaving nothing behind, settings fixed by the first
call). The whole toy chain (every phase, --quick) takes minutes and is run by hand: TRAINING.md."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "benchmarks/gpu/train_run.py"


@pytest.fixture
def toy(tmp_path):
    """Toy parts: the two data files the runner reads, and one file big enough to travel in pieces."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "sharegpt-all.jsonl.gz").write_bytes(b"\x1f\x8b" + os.urandom(300_000))  # split over parts
    (src / "question.jsonl").write_text('{"question_id": 1, "turns": ["Say hi.", "Again."]}\n')
    carry = tmp_path / "carry"
    manifest = tmp_path / "parts.json"
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks/gpu/make_parts.py"), "--files", str(src), "--out", str(carry)]
        + ["--manifest", str(manifest), "--part-bytes", "200000"],
        check=True,
        capture_output=True,
    )
    env = {
        **os.environ,
        "SPECLOCK_TRAIN_STATE": str(tmp_path / "state"),
        "TRAIN_RUN_MANIFEST": str(manifest),
        "OUT": str(tmp_path / "out"),
        "RUN_ID": "t",
        "PYTHONPATH": str(REPO / "src"),
    }
    return {"src": src, "carry": carry, "manifest": json.loads(manifest.read_text()), "env": env, "tmp": tmp_path}


def call(toy, *args: str, carry: Path | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(RUNNER), "--quick", "--device", "cpu", "--carry", str(carry or toy["carry"]), *args]
    return subprocess.run(argv, env=toy["env"], capture_output=True, text=True, timeout=120)


def test_parts_stage_across_calls_and_phases_resume_skip_and_hold(toy):
    state = toy["tmp"] / "state"
    parts = sorted(toy["carry"].glob("part-*.tar"))
    assert len(parts) >= 3 and len(toy["manifest"]["parts"]) == len(parts)
    # a call carrying one part stages it and runs nothing: the rest is still missing
    one = toy["tmp"] / "one"
    one.mkdir()
    shutil.copy(parts[0], one / parts[0].name)
    first = call(toy, "--python", sys.executable, carry=one)
    assert first.returncode == 0, first.stderr
    assert f"1 of {len(parts)} parts staged" in first.stdout and not (state / "done").exists()
    # a corrupt part is refused by its sha256, a later good copy is staged
    bad = toy["tmp"] / "bad"
    bad.mkdir()
    (bad / parts[1].name).write_bytes(b"x" + parts[1].read_bytes()[1:])
    assert "sha256 differs" in call(toy, "--only", "none", carry=bad).stdout
    # every part: the split file is joined and equals the original
    out = call(toy, "--only", "none")
    assert f"{len(parts)} of {len(parts)} parts staged" in out.stdout, out.stdout
    rel = toy["manifest"]["files"]["sharegpt-all.jsonl.gz"]
    joined = state / "wh" / rel
    assert joined.read_bytes() == (toy["src"] / "sharegpt-all.jsonl.gz").read_bytes()
    assert rel.split("/")[0] == hashlib.sha256(joined.read_bytes()).hexdigest()

    # env fails with an interpreter that lacks transformers: recorded, and held until --retry
    no_tf = shutil.which("python3", path="/usr/bin")
    lacks = subprocess.run([no_tf or "false", "-c", "import transformers"], capture_output=True).returncode != 0
    if no_tf and lacks:
        failed = call(toy, "--only", "env", "--python", no_tf)
        assert "env: exit 1" in failed.stdout and (state / "failed/env.json").is_file()
        held = call(toy, "--only", "env", "--python", sys.executable)
        assert "failed in an earlier call" in held.stdout and not (state / "done/env.json").exists()
        assert "env: starting" not in held.stdout
    done = call(toy, "--only", "env", "--python", sys.executable, "--retry", "env")
    assert "env: exit 0" in done.stdout, done.stdout
    assert (state / "done/env.json").is_file() and not (state / "failed/env.json").exists()
    again = call(toy, "--only", "env", "--python", sys.executable)
    assert "env: starting" not in again.stdout  # done: skipped

    # the first call fixed the settings: another scale on the same machine is refused (exit 2)
    other = call(toy, "--only", "none", "--epochs", "9")
    assert other.returncode == 2 and "other settings" in other.stderr and "epochs" in other.stderr

    # every call's results come back as one bundle (the device returns at most 8 files)
    assert sorted(p.name for p in (toy["tmp"] / "out").iterdir()) == ["t.results.tar.gz"]


def test_a_phase_cut_short_leaves_nothing_half_written(toy):
    """The target's conversion (GGUF -> HF folder, ~15 s with imports) gets a call with ~6 s left: the child is
    killed; the phase is neither done nor failed, no target folder exists, and the next call runs it again."""
    state = toy["tmp"] / "state"
    assert call(toy, "--only", "env", "--python", sys.executable).returncode == 0
    cut = call(toy, "--only", "target", "--python", sys.executable, "--budget-s", "21")
    assert cut.returncode == 0, cut.stderr
    assert "target: exit 124" in cut.stdout and "not done in this call" in cut.stdout, cut.stdout
    assert not (state / "done/target.json").exists() and not (state / "failed/target.json").exists()
    assert not (state / "work/target/config.json").exists()
    leftovers = [p.name for p in (state / "work").rglob("*")] if (state / "work").exists() else []
    assert not [n for n in leftovers if n.startswith("target") and n != "target"], leftovers
