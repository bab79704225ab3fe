"""A real upgrade end to end: candidate stack -> lock -> patch check -> image -> doctor + smoke in the
image -> gate against the committed baseline. The candidate feeds the drafter the wrong target layers
(docs/upgrade-example-fail/): it must build and stay lossless; doctor (statically: the layers the
patched engine will feed vs the drafter's) and the gate (measured: acceptance vs the baseline) stop it; and it must
leave stacks/, locks/ and baselines/ exactly as they were. Image layers and results are reused when
the same inputs were built before (content tags)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_upgrade_candidate import tree_hash

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_wrong_layers_candidate_is_stopped_by_the_gate_and_nothing_changes(tmp_path):
    before = tree_hash("stacks", "locks", "baselines")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speclock",
            "upgrade",
            "--stack",
            "cpu-vllm",
            "--candidate-stack",
            "docs/upgrade-example-fail/cpu-vllm.toml",
            "--out",
            str(tmp_path),
            "--json",
            "--profile",
            "quick",
        ],  # the quick profile reuses build-image's own self-check run
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=3000,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    steps = {s["name"]: s["status"] for s in doc["steps"]}
    assert steps == {
        "lock": "pass",
        "patches": "pass",
        "build": "pass",
        "doctor": "fail",
        "smoke": "pass",
        "gate": "fail",
        "soak": "skipped",
    }, doc
    assert doc["soak"] == {"status": "skipped", "detail": "an earlier step failed", "soak_s": 60.0, "max_drift": 0.05}
    doctor = next(s for s in doc["steps"] if s["name"] == "doctor")
    assert "aux-layers" in doctor["detail"] and "[3, 16, 28]" in doctor["detail"]
    assert (
        doc["after"]["captured_layers"] == [3, 16, 28]
        and doc["after"]["lossless"].split("/")[0] == doc["after"]["lossless"].split("/")[1]
    )
    assert doc["after"]["mean_acceptance_length"] < doc["before"]["mean_acceptance_length"]
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("## speclock upgrade: FAIL") and "acceptance length vs baseline" in summary
    assert (tmp_path / "junit.xml").is_file() and not doc["promoted"]
    assert tree_hash("stacks", "locks", "baselines") == before
