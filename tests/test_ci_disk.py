"""scripts/ci_disk.sh, run by .ci/run before the suite: it clears earlier test runs' temporary folders and refuses to
start a run that would die of a full disk half-way (CI once failed that way: ENOSPC in most tests of one run)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ci_disk.sh"


def _run(tmp_path: Path, need: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        SPECLOCK_CI_MIN_FREE_GB=need,
        SPECLOCK_CI_PYTEST_TMP=str(tmp_path / "pytest-of-ci"),
        SPECLOCK_CI_PRUNE_IMAGES="0",  # never touch this machine's image stores from a test
        SPECLOCK_CACHE=str(tmp_path / "cache"),
        TMPDIR=str(tmp_path),
        SPECLOCK_CI_STORES=str(tmp_path / "stores"),  # not this machine's image stores: du over them takes seconds
    )
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)


def _basetemp(root: Path, n: int, age_s: float) -> Path:
    d = root / f"pytest-{n}"
    (d / "popen-gw0").mkdir(parents=True)
    (d / "popen-gw0" / "image.tar").write_bytes(b"x" * 1024)
    t = time.time() - age_s
    os.utime(d, (t, t))
    return d


def test_old_test_runs_go_and_a_running_one_stays(tmp_path):
    root = tmp_path / "pytest-of-ci"
    old, running = _basetemp(root, 7, age_s=3 * 3600), _basetemp(root, 8, age_s=10)
    proc = _run(tmp_path, need="0")
    assert proc.returncode == 0, proc.stderr
    assert not old.exists() and running.is_dir()
    assert "1 temporary folder(s) of earlier test runs" in proc.stdout


def test_too_little_space_refuses_to_start_and_says_what_to_do(tmp_path):
    (tmp_path / "cache" / "envs").mkdir(parents=True)
    proc = _run(tmp_path, need="999999")  # no disk here has a petabyte free
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "it needs 999999 GB" in proc.stderr
    assert "biggest folders" in proc.stderr and "what to do:" in proc.stderr


def test_a_threshold_that_is_not_a_number_is_refused(tmp_path):
    proc = _run(tmp_path, need="20GB")
    assert proc.returncode == 2
    assert "SPECLOCK_CI_MIN_FREE_GB=20GB is not a whole number" in proc.stderr
