"""The cpu-vllm stack's real host environment (`speclock host-env`, ~70 s on 2 cores, built once for this module)
judged by doctor inside it, as an image is: it passes, because host-env carried out the image's plan ([prune] too).
Then the faults doctor must name: a pruned package installed after all ([prune].packages), and a stack with
kernels.build whose environment has no kernel library (kernels.build / --kernels)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tinywheels import ROOT, make_wheel

pytestmark = pytest.mark.slow  # a real engine environment (1.8 GB of wheels installed)

ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"))


@pytest.fixture(scope="module")
def cpu_env(tmp_path_factory) -> Path:
    """DIR of `speclock host-env --stack cpu-vllm` (the wheels fetched first: verified, a no-op when present)."""
    fetch = subprocess.run(
        [sys.executable, "-m", "speclock", "fetch", "--stack", "cpu-vllm"], capture_output=True, text=True, env=ENV, timeout=900
    )
    assert fetch.returncode == 0, fetch.stderr[-2000:]
    dest = tmp_path_factory.mktemp("hostenv") / "cpu-vllm"
    proc = subprocess.run(
        [sys.executable, "-m", "speclock", "host-env", "--stack", "cpu-vllm", "--dest", str(dest), "--json"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "speclock prune:" in proc.stderr  # the image's [prune] hook ran (its summary line)
    return dest


def doctor(env: Path, *args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [str(env / "bin" / "speclock"), "doctor", "--json", *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(env)},
        timeout=600,
    )
    return proc.returncode, json.loads(proc.stdout)


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_doctor_passes_in_the_cpu_vllm_host_environment(cpu_env):
    rc, report = doctor(cpu_env)
    by = checks(report)
    assert rc == 0, {n: (c["status"], c["reason"]) for n, c in by.items() if c["status"] == "fail"}
    assert by["pruned"]["status"] == "pass", by["pruned"]["reason"]
    assert "nothing matches [prune].paths (*/tests)" in by["pruned"]["reason"]
    site = next(cpu_env.glob("lib/python3*/site-packages"))
    assert not list(site.glob("*/tests"))  # what the image's venv step removes
    record = json.loads((cpu_env / "speclock" / "host-env.json").read_text())
    assert record["pruned_from_host"] == [] and record["kernels"] is None


def test_a_pruned_package_installed_after_all_fails_naming_the_key(cpu_env, tmp_path):
    wheel = make_wheel(tmp_path, "opencv-python-headless", "5.1.0.95")
    pip = [sys.executable, "-m", "pip", "--python", str(cpu_env / "bin" / "python")]
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True, capture_output=True)
    try:
        rc, report = doctor(cpu_env, "--only", "pruned")
    finally:
        subprocess.run([*pip, "uninstall", "-y", "-q", "opencv-python-headless"], check=True, capture_output=True)
    pruned = checks(report)["pruned"]
    assert rc == 1 and pruned["status"] == "fail", pruned
    assert "opencv-python-headless pruned by [prune].packages of stacks/cpu-vllm.toml" in pruned["reason"]
