"""Bring your own model, end to end on the CPU (#36 item 4): `speclock stack new` writes a vllm-cpu stack for the
converted SmolLM2 folder outside the repository (target.path, absolute: mounted at run time); its lock pins that
folder's identity; its image is built by the real builder (buildah) and holds no target; `run-image --model DIR`
mounts the folder read-only and the image's self-check passes; a copy of the folder with one weight changed is
refused (exit 2, naming the file) unless --allow-other-model; without --model it is exit 3 naming --model, from
run-image before any container starts and from the image itself before any engine starts.

The lock is `speclock lock --from-lock locks/cpu-vllm.lock`: cpu-vllm's packages carried (the same engine release
and pins, so the image shares the cpu-vllm image's venv layers: no resolve, no network, and the build reuses the
layer cache), the target's wheel left out and the folder's identity pinned. The image sizes, own-model against
baked-target, are printed for the record."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from helpers import SPEED, SPEED_FAILURE, copy_repo, failures_besides_speed, speclock
from smoke_faults import converted_target

from speclock.build.records import read_record
from speclock.build.run import run_image
from speclock.build.runtimes import podman_cli, podman_limit_args, run_argv
from speclock.core.errors import BadInput
from speclock.spec.lock import read_lock
from speclock.spec.stack import load_stack

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.buildah]

STACK = "own-vllm"


@pytest.fixture(scope="module")
def model():
    return converted_target().resolve()  # outside the repository: the host cache


@pytest.fixture(scope="module")
def repo(tmp_path_factory, model):
    root = copy_repo(tmp_path_factory.mktemp("own-repo"))
    new = speclock(root, "stack", "new", "--engine", "vllm-cpu", "--engine-version", "0.32.0", "--target", str(model),
                   "--draft", "models/smollm2-135m-eagle3", "--name", STACK, "--json")  # fmt: skip
    stack = load_stack(root / "stacks" / f"{STACK}.toml")
    assert stack.target["path"] == str(model), new.stdout
    # the committed cpu-vllm lock's packages, carried without a resolve; the folder's identity pinned
    speclock(root, "lock", "--stack", STACK, "--from-lock", "locks/cpu-vllm.lock")
    speclock(root, "lock", "--stack", STACK, "--check")  # in sync, model included
    assert read_lock(root / "locks" / f"{STACK}.lock")["models"]["target"]["identity"]  # pinned: on this host
    return root


@pytest.fixture(scope="module")
def built(repo):
    proc = speclock(repo, "build-image", "--stack", STACK, "--builder", "buildah", "--skip-selfcheck", "--json")
    return json.loads(proc.stdout)


def podman_sh(ref: str, script: str) -> str:
    cmd = run_argv("podman", ref, ["-c", script], entrypoint="/bin/sh", limits=podman_limit_args())  # run-image's own
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def image_size(ref: str) -> int:
    out = subprocess.run([*podman_cli(), "image", "inspect", "--format", "{{.Size}}", ref], capture_output=True, text=True)
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else -1


def test_the_image_holds_no_target_and_its_sbom_says_so(built):
    ref = built["ref"]
    out = podman_sh(ref, "ls -A /opt/speclock/target | wc -l; test -d /opt/speclock/target && echo is-a-folder")
    assert out.split() == ["0", "is-a-folder"]  # the mount point, empty
    sbom = json.loads(podman_sh(ref, "cat /opt/speclock/sbom.cdx.json"))
    target = next(c for c in sbom["components"] if c.get("bom-ref") == "model:target")
    props = {p["name"].rsplit(":", 1)[-1]: p["value"] for p in target.get("properties", [])}
    assert "not in the image" in props.get("note", ""), target
    own = image_size(ref)
    try:  # the baked-target image of the same lock, where this session (test_image.py) or an earlier one built it
        baked = image_size(read_record("cpu-vllm", "buildah")["ref"])
    except BadInput:
        baked = -1
    diff = f" (the target baked in adds {(baked - own) / 1e6:.0f} MB)" if baked > 0 else " (cpu-vllm is not built here)"
    print(f"\nimage sizes: own-model {ref} {own / 1e6:.0f} MB; baked-target cpu-vllm {baked / 1e6:.0f} MB{diff}")
    assert own > 0


def test_run_image_without_model_is_exit_3_naming_model_before_any_container(built, repo):
    proc = speclock(repo, "run-image", "--stack", STACK, "--runtime", "podman", check=False)
    assert proc.returncode == 3, proc.stderr
    assert "--model" in proc.stderr and "target.path" in proc.stderr
    assert "running " not in proc.stderr  # refused before the runtime was asked to start anything


def test_the_image_without_a_mount_refuses_before_any_engine_starts(built):
    proc = run_image(built["ref"], ["smoke", "--num-prompts", "1"], runtime="podman", capture_output=True, timeout=300)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 3, said[-2000:]
    assert "/opt/speclock/target" in said and "--model" in said and "docker run -v DIR:/opt/speclock/target:ro" in said
    doctor = run_image(built["ref"], ["doctor"], runtime="podman", capture_output=True, timeout=300)
    said = doctor.stdout + doctor.stderr
    assert doctor.returncode == 3 and "--model" in said, said[-2000:]  # doctor too, before a page of failing checks


def test_run_image_with_model_mounted_read_only_self_checks(built, repo, model, tmp_path):
    before = {p.name: p.stat().st_mtime_ns for p in model.iterdir()}
    out = tmp_path / "out"
    args = ["--num-prompts", "8", "--max-tokens", "32", "--baseline", "none", *SPEED]
    proc = speclock(
        repo,
        "run-image",
        "--stack",
        STACK,
        "--runtime",
        "podman",
        "--model",
        str(model),
        "--out",
        str(out),
        "--",
        "selfcheck",
        "--out",
        "/out",
        *args,
        check=False,
    )
    assert f"mounted read-only: {model.resolve()} -> /opt/speclock/target" in proc.stderr
    summary = json.loads((out / "selfcheck.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert summary["stages"]["doctor"]["exit_code"] == 0, summary
    assert report["run"]["completed"] and report["lossless"]["mismatches"] == 0 and report["metrics"]["num_drafts"] > 0
    # Everything but batch-1 speed must pass (a busy 2-core machine may fail that alone: helpers.SPEED_FAILURE)
    assert not failures_besides_speed(report["failures"]), report["failures"]
    gate = json.loads((out / "gate.json").read_text())
    assert all(SPEED_FAILURE in f for f in gate["failures"]), gate["failures"]
    assert proc.returncode == (0 if summary["verdict"] == "pass" else 1), proc.stderr[-2000:]
    print(f"\nown-model self-check: {summary['verdict']} (exit {proc.returncode})")
    # mounted read-only: nothing in the model's folder was written
    assert {p.name: p.stat().st_mtime_ns for p in model.iterdir()} == before


def test_a_different_model_mounted_is_refused_naming_the_file(built, repo, model, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(model, other)
    weights = other / "model.safetensors"
    with weights.open("r+b") as f:  # one byte of the last tensor's data: the header, sizes and config stay the same
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0x01]))
    os.chmod(other, 0o755)
    proc = speclock(repo, "run-image", "--stack", STACK, "--runtime", "podman", "--model", str(other), "--", "doctor",
                    check=False)  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    assert "model.safetensors" in said and "--allow-other-model" in said, said[-3000:]
    allowed = speclock(repo, "run-image", "--stack", STACK, "--runtime", "podman", "--model", str(other), "--",
                       "doctor", "--allow-other-model", check=False)  # fmt: skip
    said = allowed.stdout + allowed.stderr
    assert allowed.returncode == 0, said[-3000:]
    assert "model.safetensors" in said, said[-3000:]  # still named, as a WARN
