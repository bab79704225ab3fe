"""Doctor's sglang-jit check and the SGLang adapter's CUDA_HOME (issue #25 item 4), and the SGLang arch rules.

Real parts: tvm_ffi 0.1.11, SGLang 0.5.15's own jit_kernel sources and the lock's CUDA 13 wheels (nvcc, nvvm, crt,
runtime, cccl), all from the committed lock's wheels (hash-checked cache), installed into a temp site-packages;
g++ on this machine. No system nvcc: PATH leaves /usr/local/bin out and CUDA_HOME points nowhere, as in the image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from speclock.core.errors import CheckFailed
from speclock.engines import sglang as sglang_engine
from speclock.patches.wheels import fetch_wheel
from speclock.spec.stack import load_stack
from speclock.verify.doctor import DoctorOptions, doctor_main
from speclock.verify.doctor.archs import sglang_off_path
from speclock.verify.doctor.context import Context
from speclock.verify.doctor.jit_needs import check_sglang_jit

STACK = "sglang-0.5.15-torch2.11-cu130"
CUDA_WHEELS = [
    ("nvidia-cuda-nvcc", "13.2.86"),
    ("nvidia-nvvm", "13.2.86"),
    ("nvidia-cuda-crt", "13.5.37"),
    ("nvidia-cuda-runtime", "13.0.96"),
    ("nvidia-cuda-cccl", "13.3.5.0.6"),
]


def _site(tmp: Path, name: str, wheels: list[tuple[str, str]]) -> Path:
    site = tmp / name
    paths = [str(fetch_wheel(p, v, log=lambda *_: None)) for p, v in [("apache-tvm-ffi", "0.1.11"), *wheels]]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), *paths],
        check=True,
        capture_output=True,
        env=dict(os.environ, PIP_CONSTRAINT=""),
    )
    with zipfile.ZipFile(fetch_wheel("sglang", "0.5.15", log=lambda *_: None)) as z:  # only its JIT sources
        z.extractall(site, [n for n in z.namelist() if n.startswith("sglang/jit_kernel/")])
    return site


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sglang-jit")
    return {"bare": _site(tmp, "bare", []), "wheels": _site(tmp, "wheels", CUDA_WHEELS)}


@pytest.fixture
def image_env(monkeypatch, tmp_path):
    """The image's limits: no nvcc on PATH, CUDA_HOME nowhere; the speclock cache (adapter's CUDA_HOME) in tmp."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    monkeypatch.setenv("CUDA_HOME", "/nonexistent-cuda")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    assert shutil.which("nvcc") is None


def ctx_of(site: Path, stack=None) -> Context:
    return Context(stack or load_stack(STACK), sys.executable, "test", site, None, None, None)


def test_no_nvcc_fails_naming_python_extra_and_engine_env(sites, image_env):
    res = check_sglang_jit(ctx_of(sites["bare"]))
    assert res.status == "fail", res.reason
    assert "no nvcc at /nonexistent-cuda/bin/nvcc" in res.reason
    assert "nvidia-cuda-nvcc" in res.reason and "python.extra" in res.reason and "engine.env CUDA_HOME" in res.reason
    assert "nvcc: not found" in " ".join(res.details["output_tail"])  # the GPU run's failure, reproduced


def test_no_nvcc_is_exit_1_from_doctor(sites, image_env, capsys):
    with pytest.raises(CheckFailed) as err:
        doctor_main(DoctorOptions(stack=STACK, python=sys.executable, site_packages=str(sites["bare"]), only="sglang-jit"))
    assert err.value.exit_code == 1
    assert "FAIL  sglang-jit" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("g++", path="/usr/bin:/bin") is None, reason="no g++ on this machine")
def test_lock_wheels_build_sglang_rope_and_base_without_gxx_fails(sites, image_env, tmp_path):
    res = check_sglang_jit(ctx_of(sites["wheels"]))
    # Built for real with the wheels through the adapter's CUDA_HOME; the committed base has g++ -> pass
    assert res.details["built"] is True and res.details["source"].endswith("rope.cuh"), res.details
    assert res.details["adapter_env"]["CUDA_HOME"] == res.details["cuda_home"]
    assert res.status == "pass", res.reason
    text = Path(load_stack(STACK).path).read_text().replace('"gcc", "g++", ', '"gcc", ', 1)
    assert '"g++"' not in text.split("[python]")[0]
    (tmp_path / f"{STACK}.toml").write_text(text)
    res = check_sglang_jit(ctx_of(sites["wheels"], load_stack(tmp_path / f"{STACK}.toml")))
    assert res.status == "fail" and '"g++" to base.packages' in res.reason, res.reason


@pytest.mark.skipif(shutil.which("g++", path="/usr/bin:/bin") is None, reason="no g++ on this machine")
def test_cuda_wheels_split_between_the_env_and_the_host_still_build(tmp_path_factory, image_env, monkeypatch):
    # A host environment (host-env --use-host-packages) imports nvidia-cuda-runtime (cuda_runtime.h) from the host's
    # site-packages and nvcc from its own: the adapter's CUDA_HOME must hold both. With one tree the build failed
    # ("cuda_runtime.h: No such file or directory"; rehearsed on the CPU with the sglang-0.5.15 host env).
    tmp = tmp_path_factory.mktemp("split")
    env_site = _site(tmp, "env", [w for w in CUDA_WHEELS if w[0] != "nvidia-cuda-runtime"])
    host_site = _site(tmp, "host", [w for w in CUDA_WHEELS if w[0] == "nvidia-cuda-runtime"])
    assert not (env_site / "nvidia/cu13/include/cuda_runtime.h").exists()
    monkeypatch.setenv("PYTHONPATH", str(host_site))
    res = check_sglang_jit(ctx_of(env_site))
    assert res.status == "pass", res.reason
    home = Path(res.details["cuda_home"])
    assert (home / "include/cuda_runtime.h").resolve().is_relative_to(host_site.resolve())
    assert (home / "bin/nvcc").resolve().is_relative_to(env_site.resolve())
    assert (home / "lib64/libcudart.so").resolve().is_relative_to(host_site.resolve())


def test_missing_cccl_headers_name_the_build_only_move(sites, image_env, tmp_path):
    site = tmp_path / "nocccl"
    shutil.copytree(sites["wheels"], site, symlinks=True)
    shutil.rmtree(site / "nvidia" / "cu13" / "include" / "nv")
    shutil.rmtree(site / "nvidia" / "cu13" / "include" / "cccl")
    res = check_sglang_jit(ctx_of(site))
    assert res.status == "fail" and "nvidia-cuda-cccl from python.build_only to python.extra" in res.reason, res.reason


def test_adapter_cuda_home_links_the_wheels_and_keeps_a_real_toolkit(sites, tmp_path):
    env = sglang_engine.jit_env({"CUDA_HOME": "/nonexistent-cuda"}, search=[sites["wheels"]], into=tmp_path)
    home = Path(env["CUDA_HOME"])
    assert env["CUDA_PATH"] == env["CUDA_HOME"]  # cuda-python's pathfinder reads CUDA_PATH first
    assert (home / "bin" / "nvcc").is_file() and (home / "lib64" / "libcudart.so").resolve().name == "libcudart.so.13"
    assert sglang_engine.jit_env({"CUDA_HOME": str(home)}, search=[sites["wheels"]], into=tmp_path) == {}
    assert sglang_engine.jit_env({}, search=[sites["bare"]], into=tmp_path) == {}


def test_sglang_arch_gaps_off_the_serving_path():
    ctx = ctx_of(None)
    ctx.facts = {"arch": "LlamaForCausalLM"}
    off = sglang_off_path(ctx)
    # the five pairs gpu-archs reported on the H100 run: none is on this stack's serving path
    for lib, arch in [
        ("sgl_kernel/flash_ops.abi3.so", "sm_100a"),
        ("sgl_kernel/flash_ops.abi3.so", "sm_120a"),
        ("sgl_kernel/flashmla_ops.abi3.so", "sm_120a"),
        ("flashinfer_cubin", "sm_90a"),
        ("flashinfer_cubin", "sm_120a"),
    ]:
        assert off(lib, arch), (lib, arch)
    # where the stack does run them they stay checked
    assert off("sgl_kernel/flash_ops.abi3.so", "sm_90a") is None and off("flashinfer_cubin", "sm_100a") is None
    ctx.facts = {"arch": "DeepseekV3ForCausalLM"}
    assert sglang_off_path(ctx)("sgl_kernel/flashmla_ops.abi3.so", "sm_120a") is None


def test_sglang_drafter_backend_alone_leaves_the_target_on_the_default():
    """The SGLang stack names only speculative_draft_attention_backend = triton (measured faster on the H100,
    2026-12-07): the target still runs fa3 on Hopper, so FA3's library stays checked there."""
    from speclock.verify.doctor.archs import sglang_attention_backends

    ctx = ctx_of(None)
    assert ctx.stack.engine_settings_for("sm_90a").get("speculative_draft_attention_backend") == "triton"
    assert sglang_attention_backends(ctx, "sm_90a") == {"fa3", "triton"}
    assert sglang_attention_backends(ctx, "sm_120a") == {"triton"}  # gpu.arch_settings: all Triton there
