"""Each engine of a smoke run lives in its own worker process: a worker that dies fails the smoke at once (report
written, the stage and the worker's end named), and Ctrl-C stops the smoke and its worker (exit 130).

The worker is killed while it is still starting the engine, so no engine start is paid for (a few seconds each)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import alive
from smoke_faults import converted_target, healthy_drafter, random_drafter

from speclock.cli import main

pytest.importorskip("vllm")


def workers_of(parent: int) -> list[int]:
    """PIDs of smoke engine workers whose parent is `parent`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if b"speclock.verify.smoke.worker" in cmd and int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
            found.append(int(entry))
    return found


def wait_for_worker(parent: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = workers_of(parent)
        if pids:
            return pids[0]
        time.sleep(0.05)
    raise AssertionError(f"no smoke worker of pid {parent} appeared in {timeout} s")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = converted_target()
    return target, healthy_drafter() or random_drafter(target, tmp_path_factory.mktemp("draft"))


def test_a_worker_that_dies_fails_the_smoke_fast_and_writes_the_report(models, tmp_path):
    target, draft = models
    killed: dict[str, float] = {}

    def kill_the_first_worker() -> None:
        pid = wait_for_worker(os.getpid())
        time.sleep(1.0)  # inside the engine's start (importing vLLM takes longer than this)
        os.kill(pid, signal.SIGKILL)
        killed["at"] = time.monotonic()

    t = threading.Thread(target=kill_the_first_worker, daemon=True)
    t.start()
    out = tmp_path / "out"
    code = main(
        [
            "smoke",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--num-prompts",
            "2",
            "--max-tokens",
            "8",
            "--speed-repeats",
            "0",
            "--out",
            str(out),
        ]
    )
    ended = time.monotonic()
    t.join(5)
    assert "at" in killed, "the worker was not killed"
    assert code == 1
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "fail" and report["run"]["completed"] is False
    assert report["run"]["stage"] == "plain (no drafter)"
    (failure,) = report["failures"]
    assert failure.startswith("engine failed during plain (no drafter)") and "exited with code -9" in failure, failure
    assert ended - killed["at"] < 15, f"the smoke took {ended - killed['at']:.1f} s to notice a dead worker"


def test_ctrl_c_stops_the_smoke_and_its_worker(models, tmp_path):
    target, draft = models
    # A shell's background job ignores SIGINT, and an ignored signal stays ignored in its children: restore it.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "speclock",
            "smoke",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--num-prompts",
            "2",
            "--max-tokens",
            "8",
            "--out",
            str(tmp_path / "out"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        worker = wait_for_worker(proc.pid)
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err[-2000:]
        assert time.monotonic() - sent < 15
        deadline = time.monotonic() + 5
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker), "the engine worker outlived the interrupted smoke"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_worker_keeps_engine_caches_under_speclocks_cache(tmp_path, monkeypatch):
    # a smoke on the host wrote vLLM's compile cache to ~/.cache/vllm (#26): the worker points every engine cache
    # it knows under speclock's, and a cache the user chose is kept
    from speclock.verify.smoke.worker import ENGINE_CACHES, worker_env

    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    env = worker_env({"PATH": "/usr/bin", "TRITON_CACHE_DIR": "/mine"})
    assert env["TRITON_CACHE_DIR"] == "/mine"
    for var in set(ENGINE_CACHES) - {"TRITON_CACHE_DIR"}:
        assert env[var].startswith(str(tmp_path / "cache" / "engine-cache")), var
    assert env["SPECLOCK_CACHE"] == str(tmp_path / "cache")
    assert "VLLM_CACHE_ROOT" in ENGINE_CACHES and "XDG_CACHE_HOME" in ENGINE_CACHES


@pytest.mark.slow  # vLLM's start up to its first files (about 30 s)
def test_a_killed_smoke_takes_its_worker_and_the_engines_temp_files_with_it(models, tmp_path):
    # #40: the worker of a SIGKILLed smoke ran on (and vLLM's sockets and vllm_dist_* stayed in /tmp)
    import shutil
    import tempfile

    from speclock.engines import descendants

    target, draft = models
    system_tmp = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))  # short: vLLM's socket paths must fit 108 bytes
    argv = ["smoke", "--target", str(target), "--draft", str(draft), "--num-prompts", "2", "--max-tokens", "8"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "speclock", *argv, "--out", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, TMPDIR=str(system_tmp)),
    )
    engine: set[int] = set()
    try:
        worker = wait_for_worker(proc.pid)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(not p.is_dir() for p in system_tmp.rglob("*")):
            time.sleep(0.1)  # until the engine has written a file or socket
        engine = descendants(worker) | {worker}
        run_folders = list(system_tmp.iterdir())
        assert [p.name.startswith("speclock-run-") for p in run_folders] == [True], run_folders
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 15
        while any(alive(p) for p in engine) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in engine if alive(p)], "the engine worker (or its engine) outlived the SIGKILLed smoke"
        assert list(system_tmp.iterdir()) == [], "the engine's temp files were left"
    finally:
        proc.kill()
        for pid in engine:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(system_tmp, ignore_errors=True)
