"""Typing of verify/ and upgrade/ (issue #27): the bugs the type checkers found there, and the typed documents
(the smoke report, the gate's result, upgrade.json) keeping their JSON shape."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import pytest

from speclock.core.errors import EnvironmentProblem
from speclock.spec.stack import load_stack
from speclock.upgrade import steps
from speclock.upgrade.candidate import write_candidate
from speclock.verify import cuda_arch
from speclock.verify.checks import Check
from speclock.verify.profiles import Profile, resolve_profile

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- find_cuobjdump (verify/cuda_arch.py)


def _cuobjdump_wheel(wheels: Path) -> Path:
    wheels.mkdir(parents=True)
    wheel = wheels / "nvidia_cuda_cuobjdump-13.0.0-py3-none-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("nvidia/cu13/bin/cuobjdump", "#!/bin/sh\n")
    return wheel


@pytest.fixture
def no_cuobjdump_around(tmp_path, monkeypatch):
    """A cache under tmp_path, and no cuobjdump on PATH, in SPECLOCK_CUOBJDUMP or on sys.path."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECLOCK_CACHE", str(cache))
    monkeypatch.delenv("SPECLOCK_CUOBJDUMP", raising=False)
    monkeypatch.setattr(cuda_arch.shutil, "which", lambda name: None)
    monkeypatch.setattr(cuda_arch.sys, "path", [])
    return cache


def test_find_cuobjdump_replaces_a_tools_folder_that_holds_no_cuobjdump(no_cuobjdump_around):
    """Real bug (mypy: find_cuobjdump returned `Path | None` where `Path` is promised): a tools folder left without
    its binary made find_cuobjdump return None, and its callers ran `[None, "--list-elf", ...]`."""
    cache = no_cuobjdump_around
    _cuobjdump_wheel(cache / "wheels")
    (cache / "tools" / "cuobjdump" / "nvidia").mkdir(parents=True)  # damaged: the binary is gone
    tool = cuda_arch.find_cuobjdump()
    assert isinstance(tool, Path) and tool.is_file()
    assert tool == cache / "tools" / "cuobjdump" / "nvidia" / "cu13" / "bin" / "cuobjdump"


def test_find_cuobjdump_unpacks_the_cached_wheel_into_an_empty_cache(no_cuobjdump_around):
    cache = no_cuobjdump_around
    _cuobjdump_wheel(cache / "wheels")
    tool = cuda_arch.find_cuobjdump()
    assert tool.is_file() and tool.is_relative_to(cache / "tools" / "cuobjdump")


def test_find_cuobjdump_never_returns_none(no_cuobjdump_around, monkeypatch):
    """Whatever is left in the tools folder, the answer is a cuobjdump or an environment problem (exit 3)."""
    _cuobjdump_wheel(no_cuobjdump_around / "wheels")
    monkeypatch.setattr(cuda_arch.os, "replace", lambda src, dst: None)  # the unpacked copy never lands
    with pytest.raises(EnvironmentProblem, match="holds no cuobjdump"):
        cuda_arch.find_cuobjdump()


# ---------------------------------------------------------------- run_upgrade's doctor step (upgrade/steps.py)


def test_a_doctor_json_without_a_list_of_checks_fails_the_doctor_step(tmp_path, monkeypatch):
    """mypy flagged iterating `checks` (it may be None) in run_upgrade; not a bug at run time (an isinstance test
    guards it), kept working: `checks: null` in the image's doctor.json is no check, and the step fails."""
    cand = write_candidate(load_stack("cpu-vllm"), {"engine": "0.31.0"}, root=tmp_path)
    outputs = tmp_path / "selfcheck"
    outputs.mkdir()
    (outputs / "doctor.json").write_text(json.dumps({"verdict": "fail", "checks": None, "error": "doctor crashed"}))
    record = {"ref": "localhost/speclock-cpu-vllm:t", "tag": "t", "builder": "docker", "image_id": "sha256:0"}
    monkeypatch.setattr(steps, "fetch_wheels", lambda lock, progress: {})
    monkeypatch.setattr(steps, "check_patches", lambda stack, lock: [])
    monkeypatch.setattr(steps, "find_built", lambda *args, **kwargs: record)
    monkeypatch.setattr(steps, "selfcheck_outputs", lambda rec, profile, **asked: outputs)
    baseline = steps.default_baseline(cand.current)
    res = steps.run_upgrade(cand, baseline, lock_doc={"lock_sha256": "0" * 64, "packages": []}, soak_s=0, progress=lambda m: None)
    by_name = {s.name: s for s in res.steps}
    assert by_name["doctor"].status == "fail" and by_name["doctor"].detail == "doctor crashed"
    assert by_name["doctor"].data == {"checks": []}
    assert by_name["smoke"].status == "fail"  # no report.json: the upgrade stops before the gate
    assert not res.ok and res.to_json()["steps"][3]["data"] == {"checks": []}


# ---------------------------------------------------------------- typed records keep their JSON shape


def test_a_check_as_json_is_its_fields_and_status():
    c = Check("mean acceptance length", False, 1.2, ">= 1.5", "drafter", "too low")
    assert c.to_json() == dict(dataclasses.asdict(c), status="FAIL")
    assert list(c.to_json()) == [f.name for f in dataclasses.fields(Check)] + ["status"]


def test_a_profile_as_a_report_records_it_has_every_field_in_order():
    prof = resolve_profile(load_stack("cpu-vllm"), "sampled")
    described = prof.describe()
    assert list(described) == [f.name for f in dataclasses.fields(Profile)]
    want = dataclasses.asdict(prof)
    want["seeds"] = list(prof.seeds)
    assert described == want and isinstance(described["seeds"], list)
    as_list = dataclasses.replace(prof, max_position_drift=(0.1, 0.2, 0.3))
    assert as_list.describe()["max_position_drift"] == [0.1, 0.2, 0.3]


def test_an_upgrade_step_as_json_is_a_deep_copy_of_its_fields():
    step = steps.Step("lock", "pass", "ok", 1.5, data={"lock_sha256": "a" * 64, "packages": 3})
    record = step.to_json()
    assert record == dataclasses.asdict(step)
    assert record["data"] is not step.data
