"""The kernel builder stage of GPU images: what build-image stages for a stack with kernels.build
(and does not stage for a CPU stack), the errors for bad input, and doctor's kernels check.

Staging uses the committed locks with an empty placeholder file per wheel (staging links files;
it never reads them), so these run in CI without the ~5-10 GB of GPU wheels. The real GPU image
build runs only with SPECLOCK_TEST_GPU_IMAGES=1 (too big for CI)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DOCKER, ROOT, speclock

from speclock.build import containerfile, context
from speclock.core.errors import BadInput
from speclock.core.layout import IMAGE
from speclock.spec.lock import read_lock
from speclock.spec.resolve import KERNEL_TOOLCHAIN, check_kernel_toolchain
from speclock.spec.stack import load_stack
from speclock.verify import doctor

GPU_STACKS = ("vllm-cu130", "sglang-cu130", "vllm-0.26.0-torch2.11-cu130")
NVCC = shutil.which("nvcc")


def stages(text: str) -> dict[str, dict]:
    """Containerfile text -> {stage: {"from": parent, "body": its instructions}}."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"FROM (\S+) AS (\S+)", line)
        if m:
            name = m[2]
            out[name] = {"from": m[1], "body": []}
        elif name and line.strip() and not line.startswith("#"):
            out[name]["body"].append(line)
    return out


def chain(st: dict, stage: str) -> list[str]:
    seen = [stage]
    while st[seen[-1]]["from"] in st:
        seen.append(st[seen[-1]]["from"])
    return seen


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """stage_context for a stack, with placeholder wheels in a private wheelhouse."""
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))

    def stage(name: str) -> tuple[Path, dict, dict]:
        stack = load_stack(name)
        lock = read_lock(ROOT / "locks" / f"{name}.lock")
        for pkg in lock["packages"] + lock["assets"]:
            entry = tmp_path / "cache" / "wheelhouse" / pkg["sha256"] / pkg["filename"]
            entry.parent.mkdir(parents=True, exist_ok=True)
            entry.touch()
        ctx = tmp_path / "ctx" / name
        context.stage_context(stack, lock, ctx)
        kernel_base = "localhost/speclock-kernel-base:x" if stack.kernels else None
        args = containerfile.build_args_for(stack, lock, ctx, "localhost/speclock-base:x", kernel_base)
        text = containerfile.staged_containerfile(ctx, with_kernels=bool(stack.kernels)).read_text()
        return ctx, args, stages(text)

    return stage


@pytest.mark.parametrize("name", GPU_STACKS)
def test_gpu_stack_stages_a_kernel_build_for_exactly_its_archs(staged, name):
    ctx, args, st = staged(name)
    stack = load_stack(name)
    # The kernel build reads gpu.archs from the staged copy of the stack: the same list.
    staged_stack = load_stack(ctx / "kernel-tools" / "stacks" / f"{name}.toml")
    assert staged_stack.gpu["archs"] == stack.gpu["archs"] and "sm_90a" in stack.gpu["archs"]
    kernels = st["kernels"]
    assert kernels["from"] == "${KERNEL_BASE_IMAGE}" and args["KERNEL_BASE_IMAGE"].startswith("localhost/speclock-kernel-base")
    run = " ".join(kernels["body"])
    assert 'speclock.kernels.build --stack "/ktools/stacks/$STACK_NAME.toml"' in run and "--check" in run
    assert "--require-hashes" in run and "-r /wheels/kernels.txt" in run
    # nvcc and cuobjdump come from the lock's wheels, pinned by hash.
    lock = read_lock(ROOT / "locks" / f"{name}.lock")
    by_name = {p["name"]: p for p in lock["packages"] + lock["assets"]}
    lines = (ctx / "wheels" / "kernels.txt").read_text().splitlines()
    assert [line.split("==")[0] for line in lines] == list(KERNEL_TOOLCHAIN)
    for line in lines:
        pin = by_name[line.split("==")[0]]
        assert line == f"{pin['name']}=={pin['version']} --hash=sha256:{pin['sha256']}"
    assert (ctx / "kernel-tools" / "speclock" / "kernels" / "csrc" / "fp8_pack.cu").is_file()


@pytest.mark.parametrize("name", GPU_STACKS)
def test_runtime_gets_only_the_library_and_no_cxx_compiler(staged, name):
    ctx, args, st = staged(name)
    # runtime grows from patched <- assets <- venv <- base; the kernel stage reaches it by one COPY of the library folder.
    assert chain(st, "runtime") == ["runtime", "patched", "assets", "venv", "base"]
    from_kernels = [instr for s in chain(st, "runtime") for instr in st[s]["body"] if "--from=kernels" in instr]
    assert from_kernels == [f"COPY --from=kernels {containerfile.KERNELS_IN_IMAGE} {containerfile.KERNELS_IN_IMAGE}"]
    assert containerfile.KERNELS_IN_IMAGE == str(Path("/opt/speclock") / "kernels")  # where fp8_cuda looks in an image
    for s in chain(st, "runtime"):
        text = " ".join(st[s]["body"])
        assert "kernels.txt" not in text and "g++" not in text and "apt-get" not in text, s
    # g++ (nvcc's host compiler) is in the builder base; the runtime base has a C compiler and the Python headers,
    # because Triton builds its launcher at run time (doctor's triton-build), and a C++ compiler only where the
    # engine compiles C++ at run time: SGLang's JIT kernels (doctor's sglang-jit, measured on the H100 2026-12-06).
    lock = read_lock(ROOT / "locks" / f"{name}.lock")
    assert "g++" in lock["kernel_base"]["recipe"]["packages"]
    assert {"gcc", "libc6-dev", "libpython3.11-dev"} <= set(lock["base"]["recipe"]["packages"])
    assert "clang" not in lock["base"]["recipe"]["packages"]
    if load_stack(name).engine["name"] == "sglang":
        assert "g++" in lock["base"]["recipe"]["packages"]
        assert lock["kernel_base"]["sha256"] == lock["base"]["sha256"]  # the same packages: one base
    else:
        assert "g++" not in lock["base"]["recipe"]["packages"]
        assert lock["kernel_base"]["sha256"] != lock["base"]["sha256"]


def test_cpu_stack_stages_no_kernel_build(staged):
    ctx, args, st = staged("cpu-vllm")
    assert "kernels" not in st
    assert not (ctx / "wheels" / "kernels.txt").exists() and not (ctx / "kernel-tools").exists()
    assert "KERNEL_BASE_IMAGE" not in args and "KERNELS_SHA256" not in args
    assert (ctx / "Containerfile").read_text().startswith(containerfile.CONTAINERFILE.read_text().rstrip("\n"))
    assert "kernel_base" not in read_lock(ROOT / "locks" / "cpu-vllm.lock")


def test_kernel_sources_hash_into_the_kernel_layer_only(staged):
    ctx, args, _ = staged("vllm-cu130")
    before = dict(args)
    src = ctx / "kernel-tools" / "speclock" / "kernels" / "csrc" / "fp8_pack.cu"
    src.write_text(src.read_text() + "\n// edit\n")
    after = containerfile.build_args_for(
        load_stack("vllm-cu130"),
        read_lock(ROOT / "locks" / "vllm-cu130.lock"),
        ctx,
        "localhost/speclock-base:x",
        "localhost/speclock-kernel-base:x",
    )
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"KERNELS_SHA256"}


def write_stack(tmp_path: Path, name: str, edit) -> Path:
    text = edit((ROOT / "stacks" / "vllm-cu130.toml").read_text().replace('name = "vllm-cu130"', f'name = "{name}"'))
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_kernels_without_a_host_compiler_name_builder_packages(tmp_path):
    path = write_stack(tmp_path, "nocc", lambda t: t.replace('builder_packages = ["g++"]\n', ""))
    with pytest.raises(BadInput) as err:
        load_stack(path)
    assert "kernels.builder_packages" in str(err.value) and "g++" in err.value.hint


def test_builder_packages_without_kernels_are_refused(tmp_path):
    path = write_stack(tmp_path, "nokernels", lambda t: t.replace('build = ["fp8-hidden-pack"]', "build = []"))
    with pytest.raises(BadInput) as err:
        load_stack(path)
    assert "kernels.builder_packages" in str(err.value) and "kernels.build is empty" in str(err.value)


def test_missing_nvcc_wheels_name_python_build_only():
    stack = load_stack("vllm-cu130")
    lock = read_lock(ROOT / "locks" / "vllm-cu130.lock")
    entries = [p for p in lock["packages"] if p["name"] not in ("nvidia-cuda-nvcc", "nvidia-nvvm")]
    with pytest.raises(BadInput) as err:
        check_kernel_toolchain(stack, entries)
    assert "nvidia-cuda-nvcc, nvidia-nvvm" in str(err.value) and "python.build_only" in err.value.hint


def test_nvcc_wheel_of_another_major_than_gpu_cuda_names_gpu_cuda():
    stack = load_stack("vllm-cu130")
    lock = read_lock(ROOT / "locks" / "vllm-cu130.lock")
    entries = [dict(p, version="12.9.86") if p["name"] == "nvidia-cuda-nvcc" else p for p in lock["packages"]]
    with pytest.raises(BadInput) as err:
        check_kernel_toolchain(stack, entries)
    assert "gpu.cuda" in str(err.value)


def test_doctor_kernels_check_skips_a_cpu_stack_and_host_runs(monkeypatch):
    monkeypatch.delenv("SPECLOCK_KERNELS_DIR", raising=False)
    ctx = doctor.Context(load_stack("cpu-vllm"), None, "", None, None, None, None)
    assert doctor.check_kernels(ctx).status == "skip"
    ctx = doctor.Context(load_stack("vllm-cu130"), None, "", None, None, None, None)
    res = doctor.check_kernels(ctx)
    if not IMAGE.lock_file.is_file():  # on a host: the library exists only in the image
        assert res.status == "skip" and "inside the image" in res.reason


def test_doctor_kernels_check_fails_when_the_image_has_no_library(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_KERNELS_DIR", str(tmp_path / "none"))
    res = doctor.check_kernels(doctor.Context(load_stack("vllm-cu130"), None, "", None, None, None, None))
    assert res.status == "fail" and "kernels stage" in res.reason


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_staged_kernel_tools_build_alone_and_doctor_reads_the_arch_coverage(staged, tmp_path, monkeypatch):
    """The build step's command, run on the staged kernel-tools folder only (as in the image), then doctor."""
    ctx, _, _ = staged("vllm-cu130")
    out = tmp_path / "kernels"
    env = dict(os.environ, PYTHONPATH=str(ctx / "kernel-tools"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speclock.kernels.build",
            "--stack",
            str(ctx / "kernel-tools" / "stacks" / "vllm-cu130.toml"),
            "--out",
            str(out),
            "--check",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(json.loads(proc.stdout)["cubins"]) == sorted(["sm_90a", "sm_100a", "sm_103a", "sm_120a"])
    monkeypatch.setenv("SPECLOCK_KERNELS_DIR", str(out))
    res = doctor.check_kernels(doctor.Context(load_stack("vllm-cu130"), None, "", None, None, None, None))
    assert res.status == "pass", res.reason
    assert {t: c["kind"] for t, c in res.details["rows"][0]["targets"].items()} == dict.fromkeys(
        ["sm_90a", "sm_100a", "sm_103a", "sm_120a"], "exact"
    )
    # A library that is not the one kernels.json describes fails.
    lib = out / "libspeclock_fp8.so"
    lib.write_bytes(lib.read_bytes() + b"\0")
    assert doctor.check_kernels(doctor.Context(load_stack("vllm-cu130"), None, "", None, None, None, None)).status == "fail"


@pytest.mark.skipif(
    os.environ.get("SPECLOCK_TEST_GPU_IMAGES") != "1",
    reason="builds a ~10 GB GPU image: the scheduled CI job's (.ci/scheduled-gpu-image sets SPECLOCK_TEST_GPU_IMAGES=1)",
)
@pytest.mark.parametrize("name", GPU_STACKS)
def test_gpu_image_builds_and_doctor_passes_inside_without_a_gpu(name):
    record = json.loads(speclock(ROOT, "build-image", "--stack", name, "--json", timeout=5400).stdout)
    assert record["selfcheck"]["verdict"] in ("pass", "smoke-skipped")
    assert record["selfcheck"]["doctor"]["checks"]["kernels"] == "pass"
    run = subprocess.run(
        [
            DOCKER,
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "/bin/sh",
            record["ref"],
            "-c",
            "ls /opt/speclock/kernels; command -v gcc g++ cc c++ || echo no-host-compiler",
        ],
        capture_output=True,
        text=True,
    )
    assert "libspeclock_fp8.so" in run.stdout and "kernels.json" in run.stdout and "no-host-compiler" in run.stdout


def test_engine_env_becomes_one_env_line_in_the_runtime_stage():
    """The stack's engine.env reaches the engine however it is started in the image (not only via speclock)."""
    plain = containerfile.containerfile_text(False)
    text = containerfile.containerfile_text(False, {"VLLM_USE_FLASHINFER_SAMPLER": "0", "B": 'a "q"'})
    assert containerfile.ENGINE_ENV_MARK in plain and containerfile.ENGINE_ENV_MARK not in text
    env_lines = [line for line in text.splitlines() if line.startswith("ENV B=")]
    assert env_lines == ['ENV B="a \\"q\\"" VLLM_USE_FLASHINFER_SAMPLER="0"']
    runtime = text[text.index("FROM patched AS runtime") :]
    assert env_lines[0] in runtime and runtime.index(env_lines[0]) < runtime.index("USER 10001")
