"""Load libspeclock_fp8.so (built by speclock.kernels.build) with ctypes and launch it on torch tensors.

Where the library is looked for, first match wins:
  1. $SPECLOCK_KERNELS_DIR (a folder holding libspeclock_fp8.so and kernels.json)
  2. <image root>/kernels (/opt/speclock/kernels inside an image; the builder stage puts it there)
  3. <host cache>/kernels/<sha of the source>-<arch>: built here on first use when nvcc is present
The library must hold a cubin for the running GPU's architecture; otherwise the error names
the stack key (gpu.archs) to change.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import file_sha256
from speclock.core.jsonread import loads
from speclock.core.layout import IMAGE, cache_dir
from speclock.kernels import build
from speclock.spec.schema import ARCH_MIN_CUDA

if TYPE_CHECKING:
    import torch


def _device_archs(torch: Any, device: int) -> list[str]:  # torch: the module, imported by the caller
    major, minor = torch.cuda.get_device_capability(device)
    plain = f"sm_{major}{minor}"
    # An sm_XYa cubin runs only on exactly that compute capability; a plain one as well.
    return [plain + "a", plain]


def _candidate_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("SPECLOCK_KERNELS_DIR"):
        dirs.append(Path(os.environ["SPECLOCK_KERNELS_DIR"]))
    dirs.append(IMAGE.root / "kernels")
    return dirs


def _manifest(folder: Path) -> dict[str, Any] | None:  # kernels.json as read: not checked, each field read with .get
    try:
        man: dict[str, Any] | None = loads((folder / build.MANIFEST).read_text())
        return man
    except (OSError, ValueError):
        return None


@functools.cache
def load_library(device_index: int = 0) -> ctypes.CDLL:
    # heavy, optional (torch): imported only where it is used
    import torch

    if not torch.cuda.is_available():
        raise EnvironmentProblem(
            "fp8 kernels need a CUDA GPU, and none is visible (torch.cuda.is_available() is False)",
            hint="run on a GPU host (check the driver and CUDA_VISIBLE_DEVICES), or use a CPU stack: "
            "empty gpu.cuda and remove kernels.build",
        )
    wanted = _device_archs(torch, device_index)
    seen = []
    for folder in _candidate_dirs():
        man = _manifest(folder)
        if man is None or not (folder / build.FP8_LIBRARY).is_file():
            continue
        if man.get("abi") != build.ABI_VERSION:
            seen.append(f"{folder} (ABI {man.get('abi')}, need {build.ABI_VERSION}: rebuild)")
            continue
        if not set(wanted) & set(man.get("archs", [])):
            seen.append(f"{folder} (built for {', '.join(man.get('archs', []))})")
            continue
        return _open(folder / build.FP8_LIBRARY)
    # Nothing prebuilt fits: build for this GPU into the host cache when nvcc is here.
    try:
        nvcc = build.find_nvcc()
    except EnvironmentProblem:
        nvcc = None
    if nvcc is None:
        where = "; ".join(seen) or "no prebuilt library found"
        raise EnvironmentProblem(
            f"no fp8 kernel library for this GPU ({wanted[0]}): {where}",
            hint=f"add {wanted[0]} to the stack's gpu.archs and rebuild the image, or set SPECLOCK_KERNELS_DIR "
            "to a folder built with `python -m speclock.kernels.build`",
        )
    src = file_sha256(build.FP8_SOURCE)[:16]
    arch = wanted[0] if wanted[0] in ARCH_MIN_CUDA else wanted[1]
    folder = cache_dir() / "kernels" / f"{src}-{arch}"
    if _manifest(folder) is None:
        build.build_fp8_library([arch], folder, nvcc=nvcc, progress=lambda m: None)
    return _open(folder / build.FP8_LIBRARY)


def _open(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.speclock_fp8_abi_version.restype = ctypes.c_int
    lib.speclock_fp8_error_string.restype = ctypes.c_char_p
    lib.speclock_fp8_error_string.argtypes = [ctypes.c_int]
    lib.speclock_fp8_pack_bf16.restype = ctypes.c_int
    lib.speclock_fp8_pack_bf16.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_longlong,
        ctypes.c_longlong,
        ctypes.c_void_p,
    ]
    lib.speclock_fp8_pack_bf16_variant.restype = ctypes.c_int
    lib.speclock_fp8_pack_bf16_variant.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_longlong,
        ctypes.c_longlong,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    lib.speclock_fp8_unpack.restype = ctypes.c_int
    lib.speclock_fp8_unpack.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_longlong,
        ctypes.c_longlong,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    if lib.speclock_fp8_abi_version() != build.ABI_VERSION:
        raise EnvironmentProblem(
            f"{path} has ABI {lib.speclock_fp8_abi_version()}, speclock needs {build.ABI_VERSION}",
            hint="rebuild it with `python -m speclock.kernels.build`",
        )
    return lib


def _on(device: torch.device) -> AbstractContextManager[object]:
    """The device guard only when the tensor is not on the current device (it costs ~10 us a call)."""
    # heavy, optional (torch): imported only where it is used
    import torch

    if device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def _check(lib: ctypes.CDLL, err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what}: CUDA error {err}: {lib.speclock_fp8_error_string(err).decode()}")


def pack(
    x: torch.Tensor, q: torch.Tensor | None = None, scale: torch.Tensor | None = None, variant: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """q/scale: optional preallocated outputs (tests poison them to prove every element is written).
    variant: 0 lets the library choose; 1 row in registers, 2/4/5 two passes, 3 scalar (benchmarks)."""
    # heavy, optional (torch): imported only where it is used
    import torch

    if x.dim() != 2 or x.dtype != torch.bfloat16:
        raise BadInput(f"fp8_pack on CUDA takes a bfloat16 [T, H] tensor, got {x.dtype} {list(x.shape)}")
    x = x.contiguous()
    T, H = x.shape
    q = torch.empty((T, H), dtype=torch.float8_e4m3fn, device=x.device) if q is None else q
    scale = torch.empty(T, dtype=torch.float32, device=x.device) if scale is None else scale
    if (
        q.shape != (T, H)
        or q.dtype != torch.float8_e4m3fn
        or scale.shape != (T,)
        or scale.dtype != torch.float32
        or not (q.is_contiguous() and scale.is_contiguous())
    ):
        raise BadInput("fp8_pack: out tensors must be contiguous float8_e4m3fn [T, H] and float32 [T]")
    lib = load_library(x.device.index or 0)
    with _on(x.device):
        stream = torch.cuda.current_stream(x.device).cuda_stream
        _check(
            lib,
            lib.speclock_fp8_pack_bf16_variant(x.data_ptr(), q.data_ptr(), scale.data_ptr(), T, H, variant, stream),
            "fp8_pack",
        )
    return q, scale


def unpack(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    # heavy, optional (torch): imported only where it is used
    import torch

    kinds = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
    if dtype not in kinds:
        raise BadInput(f"fp8_unpack: dtype must be bfloat16, float16 or float32, got {dtype}")
    if q.dtype == torch.uint8:
        q = q.view(torch.float8_e4m3fn)
    if q.dim() != 2 or q.dtype != torch.float8_e4m3fn or scale.shape != (q.shape[0],):
        raise BadInput(
            f"fp8_unpack takes q float8_e4m3fn/uint8 [T, H] and scale [T], got {q.dtype} {list(q.shape)} and {list(scale.shape)}"
        )
    q = q.contiguous()
    scale = scale.to(device=q.device, dtype=torch.float32).contiguous()
    T, H = q.shape
    y = torch.empty((T, H), dtype=dtype, device=q.device) if out is None else out
    if y.shape != (T, H) or y.dtype != dtype or not y.is_contiguous():
        raise BadInput(f"fp8_unpack: out must be a contiguous {dtype} [T, H] tensor")
    lib = load_library(q.device.index or 0)
    with _on(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _check(
            lib, lib.speclock_fp8_unpack(q.data_ptr(), scale.data_ptr(), y.data_ptr(), T, H, kinds[dtype], stream), "fp8_unpack"
        )
    return y
