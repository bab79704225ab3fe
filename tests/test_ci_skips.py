"""In CI (CI=true) a skip is a failure unless the test lacks a GPU (tests/conftest.py): run on a throwaway test file with
the suite's conftest loaded as a plugin, once as CI and once as a developer's machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SAMPLE = """
import pytest

def test_lost_a_race():
    pytest.skip("the build finished before Ctrl-C arrived")

@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_needs_a_gpu():
    pass
"""


def _run(tmp_path: Path, ci: str | None) -> str:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(TESTS) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "conftest", "-p", "no:cacheprovider", "test_sample.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout + proc.stderr


def test_in_ci_a_skip_fails_unless_a_gpu_is_missing(tmp_path):
    out = _run(tmp_path, "true")
    assert "1 failed, 1 skipped" in out, out
    assert "skipped in CI (the build finished before Ctrl-C arrived)" in out, out


def test_outside_ci_skips_stay_skips(tmp_path):
    out = _run(tmp_path, None)
    assert "2 skipped" in out and "failed" not in out, out
