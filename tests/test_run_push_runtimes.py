"""run-image under docker and podman, with and without GPUs; push-image's refusals, its digest (read back
with skopeo, checked against the registry's own HTTP answer) and the GPU-host commands it prints.

The argv tests run nothing. The real ones use real podman, docker, buildah, skopeo and a local registry:
the hardening is compared inside running containers under both runtimes, a built CPU image runs under
podman, and pushes use tiny images (FROM scratch) so they take seconds. No GPU here: GPU runs are
checked up to the point where the runtime needs one (and must say so)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
from fuzz_support import run_cli
from helpers import DOCKER, LocalRegistry, copy_repo, speclock

from speclock.build import runtimes
from speclock.build.records import write_record
from speclock.build.runtimes import (
    HARDENED,
    PODMAN_AS_DOCKER,
    RUN_USER,
    Gpus,
    gpu_host_commands,
    gpu_host_serve_commands,
    parse_gpus,
    run_argv,
)
from speclock.core.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
REF = "localhost/speclock-cpu-vllm:0123456789abcdef"

# --- argv: each runtime x each --gpus value ---------------------------------------------------------

GPU_ARGS = {
    ("docker", "none"): [],
    ("docker", "all"): ["--gpus", "all"],
    ("docker", "2"): ["--gpus", "2"],
    ("docker", "device=1,3"): ["--gpus", '"device=1,3"'],  # docker reads --gpus as CSV: the list is quoted
    ("podman", "none"): [],
    ("podman", "all"): ["--device", "nvidia.com/gpu=all"],
    ("podman", "2"): ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"],
    ("podman", "device=1,3"): ["--device", "nvidia.com/gpu=1", "--device", "nvidia.com/gpu=3"],
}


@pytest.mark.parametrize("runtime, gpus", sorted(GPU_ARGS))
def test_the_run_command_for_each_runtime_and_gpus_value(runtime, gpus):
    cmd = run_argv(runtime, REF, ["doctor"], gpus=parse_gpus(gpus), cli=[runtime])
    own = PODMAN_AS_DOCKER if runtime == "podman" else []
    assert cmd == [runtime, "run", "--rm", *HARDENED, *own, *GPU_ARGS[runtime, gpus], REF, "doctor"]


def test_the_hardening_is_the_same_under_both_runtimes():
    docker = run_argv("docker", REF, [], cli=["docker"])
    podman = run_argv("podman", REF, [], cli=["podman"])
    assert docker[3 : 3 + len(HARDENED)] == podman[3 : 3 + len(HARDENED)] == HARDENED
    for flag in ("--read-only", "--network", "--cap-drop", "no-new-privileges", "--tmpfs", "--user"):
        assert flag in HARDENED
    assert HARDENED[HARDENED.index("--user") + 1] == RUN_USER
    # podman's only additions turn off podman defaults that docker does not have
    assert podman[3 + len(HARDENED) : -1] == PODMAN_AS_DOCKER and docker[3 + len(HARDENED) : -1] == []


def test_the_run_user_is_the_containerfiles_user():
    users = re.findall(r"^USER (\S+)", (ROOT / "containers" / "Containerfile").read_text(), flags=re.M)
    assert users and users[-1] == RUN_USER


def test_env_mounts_and_extra_args_come_after_the_hardening():
    cmd = run_argv(
        "podman",
        REF,
        ["smoke"],
        gpus=parse_gpus("all"),
        name="n",
        env={"A": "1"},
        mounts={"/h": "/out"},
        extra=["--memory", "8g"],
        limits=["--ulimit", "nofile=9:9"],
        cli=["podman"],
    )
    tail = cmd[cmd.index("nvidia.com/gpu=all") + 1 :]
    assert tail == ["--ulimit", "nofile=9:9", "--memory", "8g", "-e", "A=1", "-v", "/h:/out", REF, "smoke"]


@pytest.mark.parametrize("value", ["", "gpu", "1,2", "-1", "device=", "device=0,0", "device=a", "all,none"])
def test_a_bad_gpus_value_is_bad_input_naming_the_option(value):
    with pytest.raises(BadInput) as err:
        parse_gpus(value)
    assert "--gpus" in err.value.message and "device=" in err.value.hint


def test_gpus_zero_is_none():
    assert parse_gpus("0").none and parse_gpus("none").none and not parse_gpus("all").none


def test_the_default_gpus_follow_the_stack():
    from speclock.spec.stack import load_stack

    assert runtimes.default_gpus(load_stack("cpu-vllm").is_gpu) == "none"
    assert runtimes.default_gpus(load_stack("vllm-cu130").is_gpu) == "all"


def test_run_image_rejects_a_bad_gpus_value_with_exit_2():
    code, _out, err = run_cli("run-image", "--gpus", "first")
    assert code == 2 and "--gpus 'first'" in err and "device=" in err


def test_the_printed_gpu_host_commands_are_run_images_own_commands():
    by_digest = "registry.example/speclock-cpu-vllm@sha256:" + "a" * 64
    lines = gpu_host_commands(by_digest, parse_gpus("all"))
    for runtime in ("docker", "podman"):
        argv = shlex.split(lines[runtime])
        assert argv == run_argv(runtime, by_digest, [], gpus=Gpus(all=True), cli=[runtime])
        assert argv[-1] == by_digest and " ".join(HARDENED) in lines[runtime]
    assert "--gpus all" in lines["docker"] and "--device nvidia.com/gpu=all" in lines["podman"]


def test_the_printed_serve_commands_publish_the_port_and_keep_the_rest_of_the_hardening():
    by_digest = "registry.example/speclock-vllm-cu130@sha256:" + "b" * 64
    lines = gpu_host_serve_commands(by_digest, 8000, parse_gpus("all"))
    for runtime in ("docker", "podman"):
        argv = shlex.split(lines[runtime])
        assert argv[-6:] == [by_digest, "serve", "--host", "0.0.0.0", "--port", "8000"]
        assert "--network" not in argv and argv[argv.index("-p") + 1] == "8000:8000"
        hardened_but_network = [a for a in HARDENED if a not in ("--network", "none")]
        assert all(a in argv for a in hardened_but_network) and "--read-only" in argv


# --- push-image refuses a dirty build (no registry is contacted) -----------------------------------


def record(tag: str, builder: str, *, dirty: str | None, revision: str, verdict: str | None = "pass") -> dict:
    labels = {"org.opencontainers.image.revision": revision}
    if dirty is not None:
        labels["io.speclock.dirty"] = dirty
    rec = {
        "stack": "cpu-vllm",
        "tag": tag,
        "ref": f"localhost/speclock-cpu-vllm:{tag}",
        "builder": builder,
        "image_id": "sha256:" + "1" * 64,
        "labels": labels,
    }
    if verdict:
        rec["selfcheck"] = {"verdict": verdict, "exit_code": 0, "outputs": "/nowhere"}
    return rec


@pytest.mark.parametrize("dirty, revision", [("true", "0123abc+dirty"), (None, "0123abc+dirty")])
def test_push_refuses_a_dirty_build_without_force(tmp_path, monkeypatch, dirty, revision):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path))
    write_record("cpu-vllm", record("dirtytag", "buildah", dirty=dirty, revision=revision))
    # 127.0.0.1:9 refuses connections: reaching it would be exit 3, not this refusal
    code, out, err = run_cli("push-image", "--stack", "cpu-vllm", "--tag", "dirtytag", "--registry", "127.0.0.1:9")
    assert code == 1, err
    assert "refusing to push localhost/speclock-cpu-vllm:dirtytag" in err and "uncommitted edits" in err
    assert "0123abc+dirty" in err and "commit the edits" in err and "--force" in err and "self-check" not in err


def test_push_names_both_reasons_when_both_hold(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path))
    write_record("cpu-vllm", record("bothtag", "buildah", dirty="true", revision="r+dirty", verdict=None))
    code, _out, err = run_cli("push-image", "--stack", "cpu-vllm", "--tag", "bothtag", "--registry", "127.0.0.1:9")
    assert code == 1 and "self-check did not run" in err and "uncommitted edits" in err


def test_a_clean_build_is_not_refused_for_dirt(tmp_path, monkeypatch):
    from speclock.build.push import refusals

    for rev in ("0123abc", "unknown", "uncommitted"):
        assert refusals(record("t", "buildah", dirty="false", revision=rev), "cpu-vllm", "buildah") == []


# --- real runs --------------------------------------------------------------------------------------

BASE_REF = "localhost/speclock-base:" + json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())["base"]["sha256"][:16]


@pytest.fixture(scope="module")
def base_in_both_stores():
    """The locked base imported into docker's and buildah's (podman's) stores as build-image imports it, whatever ran
    before: a fresh CI machine may run this file before any image build (a skip there hid these checks)."""
    from speclock.build.builders import get_builder
    from speclock.build.image import ensure_base_image
    from speclock.spec.lock import lock_path, read_lock
    from speclock.spec.stack import load_stack

    stack = load_stack("cpu-vllm")
    lock = read_lock(lock_path(stack), stack=stack)
    for name in ("docker", "buildah"):
        assert ensure_base_image(stack, lock, get_builder(name), progress=lambda m: None) == BASE_REF
    return BASE_REF


# What a hardened container sees of itself; the same script under docker and podman.
PROBE = (
    "id -u; id -g; "
    "touch /probe 2>/dev/null && echo root-writable || echo root-read-only; "
    "touch /tmp/probe && echo tmp-writable; "
    "touch /var/tmp/probe 2>/dev/null && echo var-tmp-writable || echo var-tmp-read-only; "
    "touch /run/probe 2>/dev/null && echo run-writable || echo run-read-only; "
    "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status; "
    "ls /sys/class/net | tr '\\n' ' '; echo; "
    "awk '$2==\"/dev/shm\"{print \"shm\", $4}' /proc/mounts | grep -o 'shm .*size=[0-9a-z]*'"
)


def have(tool: str, *args: str) -> bool:
    try:
        return subprocess.run([tool, *args], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def probe(runtime: str, ref: str) -> list[str]:
    limits = runtimes.podman_limit_args() if runtime == "podman" else []
    cmd = run_argv(runtime, ref, ["-c", PROBE], entrypoint="/bin/sh", limits=limits)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stderr}"
    return proc.stdout.split("\n")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.buildah
def test_the_hardening_holds_alike_inside_docker_and_podman_containers(base_in_both_stores):
    """The locked base image (imported into both stores by the fixture) under each runtime with run-image's argv."""
    assert have(DOCKER, "image", "inspect", BASE_REF) and have("podman", "image", "exists", BASE_REF)
    seen = {rt: probe(rt, BASE_REF) for rt in ("docker", "podman")}
    assert seen["docker"] == seen["podman"], seen
    out = seen["podman"]
    assert out[:6] == ["10001", "10001", "root-read-only", "tmp-writable", "var-tmp-read-only", "run-read-only"]
    caps = dict(line.split(":\t") for line in out[6:10])
    assert caps == {"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1"}
    assert out[10].split() == ["lo"]  # --network none: loopback only
    assert out[11] == "shm rw,nosuid,nodev,noexec,relatime,size=524288k"


@pytest.fixture(scope="session")
def cpu_build():
    """A CPU-stack image buildah built: the newest recorded cpu-vllm build still in buildah's store (what
    test_image's builds leave), else one built now. A build after a Containerfile change rebuilds the venv
    layer (about 14 GB on disk while it builds, 2.5 min): reusing one keeps this test at seconds."""
    from speclock.build.records import read_record, records_dir

    for path in sorted(records_dir("cpu-vllm").glob("*.buildah.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        if path.name.startswith("latest."):
            continue
        try:
            rec = read_record("cpu-vllm", "buildah", path.name.split(".")[0])
        except Exception:
            continue
        if have("buildah", "--storage-driver", "overlay", "inspect", "--type", "image", rec["ref"]):
            return rec
    repo = copy_repo(Path(tempfile.mkdtemp(prefix="speclock-test-repo-")))
    return json.loads(speclock(repo, "build-image", "--builder", "buildah", "--skip-selfcheck", "--json").stdout)


@pytest.mark.slow
@pytest.mark.buildah
def test_a_built_cpu_image_runs_under_podman(cpu_build):
    """buildah builds into containers-storage, which podman reads: no copy, `--gpus none`, the hardened argv."""
    proc = speclock(ROOT, "run-image", "--runtime", "podman", "--gpus", "none", "--tag", cpu_build["tag"], "--", "--version")
    assert proc.stdout.strip() == "speclock 0.1.0"
    assert f"running {cpu_build['ref']} under podman (--gpus none)" in proc.stderr
    assert "copying" not in proc.stderr  # podman read buildah's store


@pytest.mark.slow
@pytest.mark.buildah
def test_a_gpu_run_under_podman_without_a_cdi_spec_is_an_environment_problem(cpu_build):
    if runtimes.cdi_gpu_specs():
        pytest.skip("this host has a CDI spec for nvidia.com/gpu")
    proc = speclock(ROOT, "run-image", "--runtime", "podman", "--gpus", "all", "--tag", cpu_build["tag"], check=False)
    assert proc.returncode == 3
    assert "needs a CDI spec for nvidia.com/gpu" in proc.stderr and "nvidia-ctk cdi generate" in proc.stderr
    assert "--gpus none" in proc.stderr


@pytest.mark.slow
@pytest.mark.docker
def test_a_gpu_run_under_docker_without_the_toolkit_is_an_environment_problem(base_in_both_stores):
    if runtimes.shutil.which("nvidia-container-runtime-hook"):
        pytest.skip("this host has the NVIDIA Container Toolkit")
    from speclock.build.run import run_image

    proc = run_image(BASE_REF, [], runtime="docker", gpus=parse_gpus("all"), capture_output=True, timeout=60)
    assert proc.returncode == 125 and "could not select device driver" in proc.stderr
    err = runtimes.gpu_failure("docker", proc.returncode, parse_gpus("all"), "all")
    assert err is not None and err.exit_code == 3 and "NVIDIA Container Toolkit" in err.hint and "--gpus none" in err.hint


# --- real pushes of tiny images to a local registry -------------------------------------------------


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = LocalRegistry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


def tiny_image(builder: str, tag: str, tmp: Path) -> str:
    """A FROM-scratch image with one small file, as localhost/speclock-cpu-vllm:<tag> in the builder's store."""
    ref = f"localhost/speclock-cpu-vllm:{tag}"
    (tmp / "f").write_text(f"{tag}\n")
    (tmp / "Containerfile").write_text("FROM scratch\nCOPY f /f\n")
    cmd = (
        [DOCKER, "build", "-q"]
        if builder == "docker"
        else ["buildah", "--storage-driver", "overlay", "build", "-q", "--format", "oci"]
    )
    subprocess.run([*cmd, "-t", ref, "-f", str(tmp / "Containerfile"), str(tmp)], check=True, capture_output=True)
    return ref


def served_digest(registry: LocalRegistry, repo: str, tag: str) -> str:
    """The registry's own answer (distribution's HTTP API), and the sha256 of the manifest bytes it serves."""
    req = urllib.request.Request(
        f"http://{registry.address}/v2/{repo}/manifests/{tag}",
        headers={
            "Accept": ", ".join(
                ["application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"]
            )
        },
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
        header = resp.headers["Docker-Content-Digest"]
    assert header == "sha256:" + hashlib.sha256(body).hexdigest()
    return header


@pytest.mark.slow
@pytest.mark.registry
@pytest.mark.docker
@pytest.mark.buildah
@pytest.mark.parametrize("builder", ["buildah", "docker"])
def test_the_pushed_digest_is_the_one_the_registry_serves(builder, registry, tmp_path, monkeypatch):
    tag = f"h3push{builder}"
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    ref = tiny_image(builder, tag, tmp_path)
    try:
        write_record("cpu-vllm", record(tag, builder, dirty="false", revision="0123abc"))
        code, out, err = run_cli(
            "push-image", "--stack", "cpu-vllm", "--tag", tag, "--builder", builder, "--registry", registry.address, "--json"
        )
        assert code == 0, err
        result = json.loads(out)
        assert result["digest"] == served_digest(registry, "speclock-cpu-vllm", tag)
        assert result["by_digest"] == f"{registry.address}/speclock-cpu-vllm@{result['digest']}"
        for runtime in ("docker", "podman"):
            assert shlex.split(result["run"][runtime]) == run_argv(
                runtime, result["by_digest"], [], gpus=Gpus(all=True), cli=[runtime]
            )
        # the plain output prints the same two lines
        code, out, err = run_cli(
            "push-image", "--stack", "cpu-vllm", "--tag", tag, "--builder", builder, "--registry", registry.address
        )
        assert code == 0 and f"digest {result['digest']}" in out
        assert result["run"]["docker"] in out and result["run"]["podman"] in out
    finally:
        subprocess.run([DOCKER, "rmi", "-f", ref, f"{registry.address}/speclock-cpu-vllm:{tag}"], capture_output=True)
        subprocess.run(["buildah", "--storage-driver", "overlay", "rmi", "-f", ref], capture_output=True)


@pytest.mark.slow
@pytest.mark.registry
@pytest.mark.buildah
def test_a_dirty_build_is_pushed_with_force_and_a_warning(registry, tmp_path, monkeypatch):
    tag = "h3pushdirty"
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    ref = tiny_image("buildah", tag, tmp_path)
    try:
        write_record("cpu-vllm", record(tag, "buildah", dirty="true", revision="0123abc+dirty"))
        code, out, err = run_cli(
            "push-image",
            "--stack",
            "cpu-vllm",
            "--tag",
            tag,
            "--registry",
            registry.address,
            "--force",
            "--gpus",
            "device=1",
            "--json",
        )
        assert code == 0, err
        assert "warning: pushed with --force although it was built from uncommitted edits" in err
        result = json.loads(out)
        assert result["digest"] == served_digest(registry, "speclock-cpu-vllm", tag)
        assert "--gpus '\"device=1\"'" in result["run"]["docker"] and "--device nvidia.com/gpu=1" in result["run"]["podman"]
    finally:
        subprocess.run(["buildah", "--storage-driver", "overlay", "rmi", "-f", ref], capture_output=True)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.buildah
def test_a_docker_build_is_copied_into_podmans_store_once(tmp_path):
    tag = "h3dockertopodman"
    ref = tiny_image("docker", tag, tmp_path)
    try:
        subprocess.run(["podman", "rmi", "-f", ref], capture_output=True)
        rec = record(tag, "docker", dirty="false", revision="r")
        assert runtimes.ensure_in_podman(rec) == ref
        assert have("podman", "image", "exists", ref)
        docker_id = subprocess.run(
            [DOCKER, "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True, check=True
        ).stdout.strip()
        podman_id = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert docker_id == "sha256:" + podman_id  # the same image config: nothing rebuilt on the way
    finally:
        subprocess.run([DOCKER, "rmi", "-f", ref], capture_output=True)
        subprocess.run(["podman", "rmi", "-f", ref], capture_output=True)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.buildah
@pytest.mark.parametrize("builder_name", ["buildah", "docker"])
def test_a_dirty_builds_labels_reach_the_image_verbatim(builder_name, tmp_path):
    """labels_for's whole vocabulary (a +dirty revision) through each real builder, read back from the image."""
    from speclock.build.builders import get_builder
    from speclock.build.labels import labels_for
    from speclock.spec.lock import read_lock
    from speclock.spec.stack import load_stack

    builder = get_builder(builder_name)
    labels = labels_for(
        load_stack("cpu-vllm"), read_lock(ROOT / "locks" / "cpu-vllm.lock"), "h3labels", "0" * 64, "0123abc+dirty"
    )
    assert labels["io.speclock.dirty"] == "true"
    (tmp_path / "f").write_text("x\n")
    (tmp_path / "Containerfile").write_text("FROM scratch AS runtime\nCOPY f /f\n")
    ref = f"localhost/speclock-cpu-vllm:h3labels{builder_name}"
    try:
        builder.build(
            containerfile=tmp_path / "Containerfile",
            context=tmp_path,
            tag=ref,
            build_args={},
            labels=labels,
            target="runtime",
            no_cache=False,
            timestamp=0,
        )
        assert builder.labels(ref) == labels
    finally:
        builder.remove(ref)
