"""The GPU run's parts (benchmarks/gpu/make_parts.py, run.py, collect.py), on this machine: a file too big for one
part travels in pieces and is joined and sha256-checked on arrival, a damaged part is not staged, staging resumes
across calls, and collect.py writes whole files only. The device itself is not needed for any of this."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str, monkeypatch, state: Path):
    monkeypatch.setenv("SPECLOCK_GPU_STATE", str(state))
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", ROOT / "benchmarks" / "gpu" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wheel(folder: Path, name: str, size: int) -> tuple[str, Path]:
    data = bytes((i * 7 + len(name)) % 251 for i in range(size))
    digest = hashlib.sha256(data).hexdigest()
    path = folder / digest / name
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return f"{digest}/{name}", path


def parts_of(mp, files, carry: Path, limit: int) -> dict:
    """Parts as make_parts packs them (its pieces and write_part), with the manifest run.py reads."""
    rows = []
    for i, piece in enumerate(mp.pieces(files, limit)):
        name = f"part-{i:03d}.tar"
        rows.append(
            {
                "name": name,
                "sha256": mp.write_part(carry / name, [piece]),
                "bytes": (carry / name).stat().st_size,
                "members": [piece[0]],
            }
        )
    return {"schema": "speclock.gpu-parts/v1", "stacks": ["s"], "ready_after": {"s": len(rows)}, "repo_files": {}, "parts": rows}


def test_a_big_file_travels_in_pieces_and_is_joined_and_checked(tmp_path, monkeypatch):
    mp = load("make_parts", monkeypatch, tmp_path / "state")
    run = load("run", monkeypatch, tmp_path / "state")
    src, carry = tmp_path / "wheelhouse", tmp_path / "carry"
    carry.mkdir()
    big, small = wheel(src, "big-1.0-py3-none-any.whl", 2500), wheel(src, "small-1.0-py3-none-any.whl", 300)
    manifest = parts_of(mp, [big, small], carry, limit=1000)
    assert len(manifest["parts"]) == 4  # three pieces of the big one, the small one whole
    everything = sorted(carry.iterdir())
    # call 1 carries the first two parts: the big file waits for its last piece
    staging = tmp_path / "call"
    staging.mkdir()
    for part in everything[:2]:
        (staging / part.name).write_bytes(part.read_bytes())
    assert run.stage(manifest, staging) == {"part-000.tar", "part-001.tar"}
    assert not (run.WH / big[0]).exists()
    # call 2 carries the rest (a fresh tree: the earlier parts are gone, what was staged stays on the machine)
    for part in staging.iterdir():
        part.unlink()
    for part in everything[2:]:
        (staging / part.name).write_bytes(part.read_bytes())
    assert len(run.stage(manifest, staging)) == 4
    for rel, path in (big, small):
        assert (run.WH / rel).read_bytes() == path.read_bytes(), rel
    assert not any(p.is_file() for p in run.PIECES.rglob("*"))  # pieces removed once joined


def test_a_damaged_part_is_not_staged(tmp_path, monkeypatch, capsys):
    mp = load("make_parts", monkeypatch, tmp_path / "state")
    run = load("run", monkeypatch, tmp_path / "state")
    carry = tmp_path / "carry"
    carry.mkdir()
    manifest = parts_of(mp, [wheel(tmp_path / "wh", "a-1.0-py3-none-any.whl", 500)], carry, limit=1000)
    part = carry / "part-000.tar"
    data = bytearray(part.read_bytes())
    data[600] ^= 0xFF
    part.write_bytes(bytes(data))
    assert run.stage(manifest, carry) == set()
    assert "sha256 differs from the manifest" in capsys.readouterr().out


def test_collect_writes_whole_files_into_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_GPU_RUNS", str(tmp_path / "runs"))
    collect = load("collect", monkeypatch, tmp_path / "state")
    files_at = tmp_path / "files"
    (files_at / "2026-12-06-h100" / "phases").mkdir(parents=True)
    (files_at / "2026-12-06-h100" / "phases" / "machine.json").write_text(
        json.dumps({"phase": "machine", "exit": 0, "seconds": 9.0})
    )
    (files_at / "2026-12-06-h100" / "machine.txt").write_text("NVIDIA H100")
    copied = collect.collect(files_at)
    assert sorted(p.relative_to(tmp_path / "runs").as_posix() for p in copied) == [
        "2026-12-06-h100/machine.txt",
        "2026-12-06-h100/phases/machine.json",
    ]
    assert not [p for p in (tmp_path / "runs").rglob(".*tmp*")]


@pytest.mark.parametrize("stack", ["vllm-0.26.0-torch2.11-cu130", "sglang-0.5.15-torch2.11-cu130"])
def test_the_committed_manifest_covers_what_host_env_reads(stack, monkeypatch, tmp_path):
    # every file of the stack's host target (less the host's own CUDA stack) is in the committed parts
    mp = load("make_parts", monkeypatch, tmp_path / "state")
    manifest = json.loads((ROOT / "benchmarks/gpu/parts.json").read_text())
    members = {m.split(".piece-")[0] for p in manifest["parts"] for m in p["members"]}
    lock = json.loads((ROOT / "locks" / f"{stack}.lock").read_text())["targets"]["3.12-x86_64"]
    host = mp.host_patterns()
    from fnmatch import fnmatchcase

    from speclock.core.names import normalize
    from speclock.spec.resolve import KERNEL_TOOLCHAIN

    for entry in lock["packages"] + lock["assets"]:
        name = normalize(entry["name"])
        if name not in KERNEL_TOOLCHAIN and any(fnmatchcase(name, pat) for pat in host):
            continue
        assert f"{entry['sha256']}/{entry['filename']}" in members, entry["name"]
    assert stack in manifest["ready_after"]
