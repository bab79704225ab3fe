"""Building the CUDA kernels: arch validation, exact -gencode targets checked with cuobjdump, clean failures."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem  # noqa: E402
from speclock.kernels import build  # noqa: E402

ALL_ARCHS = ["sm_90a", "sm_100a", "sm_103a", "sm_120a"]


def _real_nvcc() -> str:
    try:
        nvcc = build.find_nvcc()
    except EnvironmentProblem:
        pytest.skip("no nvcc on this machine (CI has CUDA 13.0's at /usr/local/bin/nvcc)")
    return nvcc


def test_unknown_arch_names_gpu_archs():
    with pytest.raises(BadInput) as err:
        build.validate_archs(["sm_90a", "sm_42"], (13, 0))
    assert "gpu.archs" in str(err.value) and "sm_42" in str(err.value)


@pytest.mark.parametrize(
    "arch,cuda,need",
    [("sm_100a", (12, 4), "12.8"), ("sm_120a", (12, 6), "12.8"), ("sm_103a", (12, 8), "12.9"), ("sm_90a", (11, 8), "12.0")],
)
def test_cuda_too_old_names_gpu_cuda(arch, cuda, need):
    with pytest.raises(BadInput) as err:
        build.validate_archs([arch], cuda)
    assert "gpu.cuda" in str(err.value) and need in str(err.value) and arch in str(err.value)


def test_arch_nvcc_does_not_know_names_gpu_archs():
    with pytest.raises(BadInput) as err:
        build.validate_archs(["sm_90a", "sm_120a"], (13, 0), nvcc_archs={"sm_80", "sm_90", "sm_100"})
    assert "gpu.archs" in str(err.value) and "sm_120a" in str(err.value) and "does not know" in str(err.value)


def test_new_enough_archs_pass_and_gencode_is_exact():
    assert build.validate_archs(ALL_ARCHS + ["sm_90a"], (13, 0), nvcc_archs={"sm_90", "sm_100", "sm_103", "sm_120"}) == ALL_ARCHS
    assert build.gencode_flags(["sm_90a", "sm_103a"]) == [
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_103a,code=sm_103a",
    ]


def test_cpu_stack_asking_for_kernels_is_refused():
    from speclock.spec.stack import load_stack

    with pytest.raises(BadInput) as err:
        build.archs_for_stack(load_stack("cpu-vllm"))
    assert "gpu.cuda" in str(err.value) and "kernels.build" in str(err.value)


def _fake_nvcc(tmp_path: Path, release="13.0", compile_rc=1) -> str:
    script = tmp_path / "nvcc"
    script.write_text(
        "#!/bin/sh\n"
        f"case \"$1\" in --version) echo 'Cuda compilation tools, release {release}, V{release}.1';;\n"
        "  --list-gpu-code) echo 'sm_90 sm_100 sm_103 sm_120';;\n"
        f"  *) echo 'ptxas fatal: simulated failure' >&2; exit {compile_rc};;\nesac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_failed_compile_leaves_nothing_behind(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(CheckFailed) as err:
        build.build_fp8_library(["sm_90a"], out, nvcc=_fake_nvcc(tmp_path), progress=lambda m: None)
    assert "simulated failure" in str(err.value)
    assert list(out.iterdir()) == []  # no library, no manifest, no temp folder


def test_nvcc_of_another_major_release_than_the_stack(tmp_path):
    with pytest.raises(EnvironmentProblem) as err:
        build.build_fp8_library(
            ["sm_90a"], tmp_path / "o", nvcc=_fake_nvcc(tmp_path, "13.0"), cuda="12.9", progress=lambda m: None
        )
    assert "gpu.cuda" in str(err.value) and "12.9" in str(err.value)


def test_nvcc_too_old_for_an_arch(tmp_path):
    with pytest.raises(BadInput) as err:
        build.build_fp8_library(["sm_103a"], tmp_path / "o", nvcc=_fake_nvcc(tmp_path, "12.8"), progress=lambda m: None)
    assert "sm_103a" in str(err.value) and "12.9" in str(err.value)


def test_cli_exit_codes(tmp_path, capsys):
    assert build.main(["--archs", "sm_42", "--out", str(tmp_path)]) == 2
    assert "gpu.archs" in capsys.readouterr().err
    assert build.main(["--stack", "cpu-vllm", "--out", str(tmp_path)]) == 2
    assert "CPU stack" in capsys.readouterr().err


@pytest.mark.slow
def test_build_for_four_archs_and_check_cubins(tmp_path):
    """The real nvcc 13.0 compiles exactly sm_90a/100a/103a/120a (no GPU needed); cuobjdump agrees."""
    _real_nvcc()
    if not build.find_cuobjdump():
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump, or triton, which carries one)")
    out = tmp_path / "k"
    man = build.build_fp8_library(ALL_ARCHS, out, progress=lambda m: None)
    assert man["archs"] == ALL_ARCHS and man["abi"] == build.ABI_VERSION
    assert json.loads((out / build.MANIFEST).read_text()) == man
    assert sorted(build.check_library(out, ALL_ARCHS)) == sorted(ALL_ARCHS)
    assert sorted(p.name for p in out.iterdir()) == sorted([build.FP8_LIBRARY, build.MANIFEST])
    with pytest.raises(CheckFailed):  # the check really compares
        build.check_library(out, ["sm_90a"])
    # the C ABI is there (the library loads and answers without a GPU)
    import ctypes

    lib = ctypes.CDLL(str(out / build.FP8_LIBRARY))
    assert lib.speclock_fp8_abi_version() == build.ABI_VERSION


def test_stack_cuda_too_old_is_reported_before_the_nvcc_mismatch(tmp_path):
    with pytest.raises(BadInput) as err:
        build.build_fp8_library(
            ["sm_100a"], tmp_path / "o", nvcc=_fake_nvcc(tmp_path, "13.0"), cuda="12.4", progress=lambda m: None
        )
    assert "gpu.cuda" in str(err.value) and "12.8" in str(err.value)


@pytest.mark.slow
def test_two_builds_give_the_same_library(tmp_path):
    """Reproducible images need a reproducible library: nvcc's PID-named temp files must not leak into it."""
    nvcc = _real_nvcc()
    first = build.build_fp8_library(["sm_90a"], tmp_path / "a", nvcc=nvcc, progress=lambda m: None)
    second = build.build_fp8_library(["sm_90a"], tmp_path / "b", nvcc=nvcc, progress=lambda m: None)
    assert first["library_sha256"] == second["library_sha256"]
