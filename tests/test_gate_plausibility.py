"""The gate checks a report against what a run of its shape can produce (issue #26): the four forgeries that
passed on 2026-12-06, and each rule of speclock.verify.plausibility with a fault case that names the field.
Each starts from a real report of a healthy run (the cpu-vllm baseline) or the real H100 SGLang report."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from fuzz_support import assert_clean_refusal, run_cli

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"
GPU_REAL = ROOT / "docs" / "gpu-runs" / "2026-12-06-h100" / "sglang-selfcheck" / "report.json"


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECLOCK_IN_IMAGE", raising=False)


def real(path: Path = REAL) -> dict:
    return copy.deepcopy(json.loads(path.read_text()))


def gate(tmp_path: Path, doc: dict, *argv: str) -> tuple[int, str, str]:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc, indent=1))
    return run_cli("gate", str(path), "--baseline", "none", *argv)


def test_the_real_reports_still_pass_the_plausibility_rules(tmp_path):
    code, _, err = gate(tmp_path, real())
    assert code == 0, err
    code, _, err = gate(tmp_path, real(GPU_REAL))
    assert code == 1 and "min_speedup" in err + _, err  # judged (on speed), not refused


def test_a_cpu_report_relabelled_to_a_gpu_stack_is_refused_naming_gpu_name(tmp_path):
    doc = real()
    doc["stack"] = "vllm-cu130"
    doc["engine"].update(name="vllm", package="vllm", version="0.33.0", pinned_version="0.33.0")
    code, _, err = gate(tmp_path, doc)
    assert_clean_refusal(code, err, allowed=(2,), names="key 'gpu.name'")


def test_a_gpu_report_relabelled_to_the_cpu_stack_is_refused(tmp_path):
    doc = real()
    doc["gpu"] = {"arch": "sm_90a", "name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda": "13.0"}
    code, _, err = gate(tmp_path, doc)
    assert_clean_refusal(code, err, allowed=(2,), names="key 'gpu.name'")


def test_a_gpu_arch_the_stack_does_not_claim_is_refused(tmp_path):
    doc = real(GPU_REAL)
    doc["gpu"]["arch"] = "sm_80"
    code, _, err = gate(tmp_path, doc)
    assert_clean_refusal(code, err, allowed=(2,), names="key 'gpu.arch'")


def test_an_image_of_another_stack_is_refused(tmp_path):
    doc = real()
    doc["image"]["ref"] = "localhost/speclock-vllm-cu130:0f81bcbbf7e589a0"
    code, _, err = gate(tmp_path, doc)
    assert_clean_refusal(code, err, allowed=(2,), names="key 'image.ref'")


def test_more_drafts_than_prompts_times_tokens_allow_is_refused(tmp_path):
    doc = real()
    scale = 10  # every counter x10, the reference edited to match: self-consistent, yet impossible at 80 x 64
    m = doc["metrics"]
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        m[key] *= scale
    m["accepted_per_position"] = [a * scale for a in m["accepted_per_position"]]
    code, _, err = gate(tmp_path, doc)
    assert_clean_refusal(code, err, allowed=(2,), names="key 'metrics.num_drafts'")


def test_per_position_acceptance_that_rises_is_refused(tmp_path):
    doc = real()
    m = doc["metrics"]
    a, b, c = m["accepted_per_position"]
    m["accepted_per_position"] = [a, c, b]  # the same total, position 3 above position 2
    drafts = m["num_drafts"]
    m["acceptance_per_position"] = [x / drafts for x in m["accepted_per_position"]]
    code, _, err = gate(tmp_path, doc)
    assert_clean_refusal(code, err, allowed=(2,), names="key 'metrics.accepted_per_position[2]'")


def test_a_greedy_report_with_mismatches_relabelled_sampled_is_refused(tmp_path):
    doc = real()
    doc["lossless"]["mismatches"] = 3
    doc["profile"].update(name="sampled", temperature=1.0)
    doc["sampled"] = {"per_seed": [copy.deepcopy(doc["metrics"])]}  # one seed: per-seed counters that add up
    code, _, err = gate(tmp_path, doc)
    assert_clean_refusal(code, err, allowed=(2,), names="key 'profile.name'")
    assert "a sampled run compares no outputs" in err


def test_a_speedup_that_contradicts_its_own_tok_s_is_refused(tmp_path):
    doc = real()
    doc["throughput"].pop("batch1", None)
    doc["throughput"].pop("measured_at", None)
    doc["throughput"].update(baseline_tok_s=21689.0, spec_tok_s=14955.0, speedup=1.5)  # 0.69 by its own figures
    code, _, err = gate(tmp_path, doc, "--stack", str(_stack_without_speed_floor(tmp_path)))
    assert_clean_refusal(code, err, allowed=(2,), names="key 'throughput.speedup'")


def _stack_without_speed_floor(tmp_path: Path) -> Path:
    dest = tmp_path / "stacks" / "cpu-vllm.toml"
    dest.parent.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "stacks" / "cpu-vllm.toml").read_text()
    dest.write_text("".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith("min_speedup = ")))
    (tmp_path / "locks").mkdir(exist_ok=True)
    for lock in ("cpu-vllm.lock", "pylock.cpu-vllm.toml"):
        (tmp_path / "locks" / lock).write_bytes((ROOT / "locks" / lock).read_bytes())
    return dest
