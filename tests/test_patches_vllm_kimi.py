"""The real case: Kimi-K2.5 + EAGLE-3 on vLLM 0.17.1, the newest release that cannot do it out of the box.

Against the real wheels (downloaded once into the host cache, never installed): the series applies
to 0.17.1 and reports every patch "upstream" (retirable) on 0.18.0's successor 0.33.0. Against the
real installed vLLM 0.17.1 (a cached engine env; slow the first time): the engine's own registry
resolves KimiK25ForConditionalGeneration and the engine's own supports_eagle3() is False on it
before patching and True after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from speclock.patches.series import check_series, load_series
from speclock.patches.trees import WheelTree
from speclock.patches.wheels import fetch_wheel
from speclock.spec.stack import load_stack

SRC = Path(__file__).resolve().parents[1] / "src"
STACK = "vllm-kimi-0.17.1"


@pytest.fixture(scope="module")
def series():
    return load_series(load_stack(STACK))


def test_series_applies_to_vllm_0_17_1_wheel(series):
    results = check_series(series, WheelTree(fetch_wheel("vllm", "0.17.1")), "0.17.1")
    assert [(r.patch.name, r.state, r.in_range) for r in results] == [
        ("0001-deepseek-v2-eagle3-interface.patch", "applies", True),
        ("0002-kimi-k25-outer-class-eagle3.patch", "applies", True),
        ("0003-eagle3-target-whitelist-deepseek-kimi.patch", "applies", True),
    ]
    # Without the patches, every static probe fails on 0.17.1: the probes can tell.
    assert not any(p["passed"] for r in results for p in r.probes_before)


def test_same_series_is_upstream_and_retirable_on_vllm_0_33_0(series):
    results = check_series(series, WheelTree(fetch_wheel("vllm", "0.33.0")), "0.33.0")
    assert [r.state for r in results] == ["upstream", "upstream", "upstream"]
    assert all(r.as_json()["retirable"] and not r.in_range for r in results)
    assert "KimiK25ForConditionalGeneration" in results[1].reason


def test_patches_check_cli_on_0_33_0_exits_0_and_says_retirable():
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.run(
        [sys.executable, "-m", "speclock", "patches", "check", "--stack", STACK, "--engine-version", "0.33.0", "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["engine_version"] == "0.33.0"
    assert {p["state"] for p in report["patches"]} == {"upstream"}


def test_unknown_engine_version_is_bad_input():
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.run(
        [sys.executable, "-m", "speclock", "patches", "check", "--stack", STACK, "--engine-version", "0.17.99"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2 and "0.17.99" in proc.stderr
