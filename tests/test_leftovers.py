"""Nothing left behind by an engine (#40 item 9): its temp files and sockets go to a run folder that is removed also
when the engine fails, and an engine worker dies with its parent (tools: test_tool_env.py; invoke: test_tasks.py).

The engine cases use a fake engine (tests/fake_engine: the reference engine's start replaced in the worker) that
leaves what vLLM leaves in the temp folder, so no real engine start is paid for; tests/test_smoke_worker.py kills a
real smoke during vLLM's start."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import alive

from speclock.engines import EngineConfig, running
from speclock.verify.smoke.worker import WorkerDied, worker_session

ROOT = Path(__file__).resolve().parents[1]
FAKE_ENGINE = Path(__file__).resolve().parent / "fake_engine"


def gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture
def system_tmp(monkeypatch):
    """The temp folder every process here (and its children) uses: empty at the start; a short path, as /tmp is
    (a socket's path must fit in 108 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """Engine workers started from here run the fake engine; it reports where it wrote to the returned file."""
    out = tmp_path / "fake-engine.json"
    monkeypatch.syspath_prepend(str(FAKE_ENGINE))  # a worker's PYTHONPATH is its parent's sys.path
    monkeypatch.setenv("SPECLOCK_FAKE_ENGINE", str(out))
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    return out


def test_a_failed_engine_start_leaves_nothing_in_the_temp_folder(tmp_path, system_tmp, fake_engine, monkeypatch):
    monkeypatch.setenv("SPECLOCK_FAKE_ENGINE_MODE", "fail")
    with pytest.raises(WorkerDied, match="fake engine: refused to start"):
        with worker_session("reference", EngineConfig(target=tmp_path), "plain"):
            pass
    wrote = json.loads(fake_engine.read_text())
    run_folder = Path(wrote["tmp"])
    # the engine's files and socket went to a run folder in the temp folder, and that folder is gone with them
    assert run_folder.parent == system_tmp and run_folder.name.startswith("speclock-run-"), run_folder
    assert not run_folder.exists()
    assert list(system_tmp.iterdir()) == []
    assert gone(wrote["child"], 5), "a process the failed engine started is still running"


def test_an_engine_run_in_process_keeps_its_temp_files_in_a_run_folder_removed_after_a_failure(system_tmp):
    seen: dict[str, str] = {}

    class FailingEngine:
        NAME = "failing"

        @staticmethod
        def start(config):
            seen["tmp"] = tempfile.gettempdir()
            seen["rpc"] = os.environ.get("VLLM_RPC_BASE_PATH", "")
            Path(seen["tmp"], "vllm_dist_0123").write_text("store")
            raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        with running(FailingEngine, EngineConfig(target=system_tmp)):  # type: ignore[arg-type]
            pass
    assert Path(seen["tmp"]).parent == system_tmp and seen["rpc"] == seen["tmp"]
    assert list(system_tmp.iterdir()) == []
    assert "VLLM_RPC_BASE_PATH" not in os.environ and tempfile.gettempdir() == str(system_tmp)


PARENT = """
import json, sys, time
from pathlib import Path
from speclock.engines import EngineConfig
from speclock.verify.smoke.worker import WorkerSession, _config_doc

session = WorkerSession("reference", EngineConfig(target=Path(sys.argv[1])), "plain")
session.proc.stdin.write(json.dumps({"engine": "reference", "config": _config_doc(session.config)}) + "\\n")
session.proc.stdin.flush()
print(session.proc.pid, flush=True)
time.sleep(300)
"""


def test_an_engine_worker_dies_with_its_killed_parent(tmp_path, system_tmp, fake_engine, monkeypatch):
    monkeypatch.setenv("SPECLOCK_FAKE_ENGINE_MODE", "hang")  # an engine start that takes minutes
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAKE_ENGINE), str(ROOT / "src")]))
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        deadline = time.monotonic() + 60
        while not fake_engine.exists():
            assert time.monotonic() < deadline and parent.poll() is None, "the fake engine did not start"
            time.sleep(0.05)
        wrote = json.loads(fake_engine.read_text())
        assert wrote["pid"] == worker
        parent.kill()  # SIGKILL: the parent runs no cleanup
        parent.wait(10)
        assert gone(worker, 8), "the engine worker outlived its SIGKILLed parent"
        assert gone(wrote["child"], 2), "the engine's own process outlived the worker"
        assert not Path(wrote["tmp"]).exists(), "the run folder was left"
        assert list(system_tmp.iterdir()) == []
    finally:
        parent.kill()
        for pid in (json.loads(fake_engine.read_text()) if fake_engine.exists() else {"pid": 0, "child": 0}).values():
            if isinstance(pid, int) and pid and alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_an_engine_probe_leaves_nothing_in_the_temp_folder(system_tmp):
    # importing vLLM makes torch's default compile cache, an empty /tmp/torchinductor_<user> (#40)
    if importlib.util.find_spec("vllm") is None:  # not imported here: that would make the folder in this process
        pytest.skip("vllm is not installed")
    from speclock.patches.probes import engine_subprocess

    proc = engine_subprocess(["import", "vllm"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(system_tmp.iterdir()) == []
