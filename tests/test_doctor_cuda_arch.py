"""GPU-architecture coverage read with the real cuobjdump (PyPI's nvidia-cuda-cuobjdump).

Libraries: small ones compiled here with nvcc for a chosen arch list (so "missing arch" is known
for certain), and the real compiled extensions from the vllm 0.33.0 and sglang-kernel 0.4.10
wheels (taken from the wheels in the host cache; no install).
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from speclock.core.errors import BadInput
from speclock.patches.wheels import fetch_wheel
from speclock.verify import cuda_arch

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)
KERNEL = '__global__ void k(float* x){ x[threadIdx.x] *= 2.0f; }\nextern "C" void launch(float* x){ k<<<1,32>>>(x); }\n'


def compile_lib(tmp: Path, name: str, gencodes: list[str]) -> Path:
    if not NVCC:
        pytest.skip("nvcc is not installed on this machine")
    src = tmp / "k.cu"
    src.write_text(KERNEL)
    out = tmp / name
    cmd = [NVCC, "-shared", "-Xcompiler", "-fPIC", "-o", str(out), str(src)]
    for g in gencodes:
        cmd += ["-gencode", g]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def tool():
    return cuda_arch.find_cuobjdump()


def test_compiled_library_missing_an_arch_is_reported(tmp_path, tool):
    lib = compile_lib(tmp_path, "hopper_only.so", ["arch=compute_80,code=sm_80", "arch=compute_90a,code=sm_90a"])
    inv = cuda_arch.inventory(lib, tool=tool, use_cache=False)
    assert inv.sass == ["sm_80", "sm_90a"] and inv.ptx == []
    assert cuda_arch.coverage(inv, "sm_90a") == {"kind": "exact", "via": "sm_90a"}
    assert cuda_arch.coverage(inv, "sm_86") == {"kind": "compatible", "via": "sm_80"}
    assert cuda_arch.coverage(inv, "sm_100")["kind"] == "missing"
    rows = cuda_arch.coverage_table([lib], tmp_path, ["sm_90a", "sm_100"], tool=tool)
    assert rows[0]["ok"] is False and rows[0]["targets"]["sm_100"]["kind"] == "missing"
    assert "MISSING" in cuda_arch.format_table(rows, ["sm_90a", "sm_100"])


def test_family_cubin_listed_as_sm_100_is_read_as_sm_100f(tmp_path, tool):
    lib = compile_lib(tmp_path, "family.so", ["arch=compute_100f,code=sm_100f", "arch=compute_80,code=compute_80"])
    listed = subprocess.run([str(tool), "--list-elf", str(lib)], capture_output=True, text=True).stdout
    assert "sm_100.cubin" in listed and "sm_100f" not in listed  # the pitfall
    inv = cuda_arch.inventory(lib, tool=tool, use_cache=False)
    assert inv.sass == ["sm_100f"] and inv.ptx == ["compute_80"]
    assert cuda_arch.coverage(inv, "sm_103") == {"kind": "compatible", "via": "sm_100f"}
    assert cuda_arch.coverage(inv, "sm_90a") == {"kind": "ptx", "via": "compute_80"}


def test_arch_specific_cubin_does_not_cover_another_minor(tmp_path, tool):
    lib = compile_lib(tmp_path, "a.so", ["arch=compute_100a,code=sm_100a"])
    inv = cuda_arch.inventory(lib, tool=tool, use_cache=False)
    assert inv.sass == ["sm_100a"]
    assert cuda_arch.coverage(inv, "sm_100")["kind"] == "exact"
    assert cuda_arch.coverage(inv, "sm_103")["kind"] == "missing"


def test_known_gap_is_accepted_with_its_reason(tmp_path, tool):
    lib = compile_lib(tmp_path, "fa3.so", ["arch=compute_90a,code=sm_90a"])
    gaps = cuda_arch.parse_known_gaps(["fa3.so:sm_100 FA3 is Hopper-only"])
    rows = cuda_arch.coverage_table([lib], tmp_path, ["sm_100"], known_gaps=gaps, tool=tool)
    assert rows[0]["ok"] and rows[0]["targets"]["sm_100"] == {"kind": "accepted-gap", "via": None, "reason": "FA3 is Hopper-only"}
    with pytest.raises(BadInput):
        cuda_arch.parse_known_gaps(["fa3.so sm_100"])


def member(wheel: Path, name: str, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        return Path(z.extract(name, dest))


def test_sglang_kernel_flash_ops_has_no_blackwell_code(tmp_path, tool):
    lib = member(fetch_wheel("sglang-kernel", "0.4.10"), "sgl_kernel/flash_ops.abi3.so", tmp_path)
    inv = cuda_arch.inventory(lib, tool=tool)
    assert inv.sass == ["sm_80", "sm_86", "sm_90a"]
    assert cuda_arch.coverage(inv, "sm_90a")["kind"] == "exact"
    assert cuda_arch.coverage(inv, "sm_100")["kind"] == "missing"


def test_vllm_0_33_0_main_extension_has_no_sm_103_cubin(tmp_path, tool):
    lib = member(fetch_wheel("vllm", "0.33.0"), "vllm/_C_stable_libtorch.abi3.so", tmp_path)
    inv = cuda_arch.inventory(lib, tool=tool)
    assert "sm_100" in inv.sass and "sm_120" in inv.sass
    assert not any(a.startswith("sm_103") for a in inv.sass)
    # sm_103 runs there only through same-major sm_100 cubins, and the report says so.
    assert cuda_arch.coverage(inv, "sm_103") == {"kind": "compatible", "via": "sm_100"}
    fa3 = member(fetch_wheel("vllm", "0.33.0"), "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", tmp_path)
    assert cuda_arch.coverage(cuda_arch.inventory(fa3, tool=tool), "sm_100")["kind"] == "missing"
