"""fp8 (e4m3) packing of hidden states: the reference against a brute-force definition, and the CUDA
kernel against the reference bit for bit (GPU only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

torch = pytest.importorskip("torch")

from speclock.core.errors import BadInput, EnvironmentProblem  # noqa: E402
from speclock.kernels import fp8_pack, fp8_unpack  # noqa: E402
from speclock.kernels.reference import fp8_pack_reference, fp8_unpack_reference  # noqa: E402

GPU = torch.cuda.is_available()


def _inputs(T, H, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    mag = torch.pow(10.0, torch.empty(T, 1).uniform_(-4, 4, generator=g))
    x = torch.randn(T, H, generator=g) * mag
    x[min(1, T - 1)] = 0  # an all-zero row
    return x.to(torch.bfloat16).to(device)


def _e4m3_table():
    codes = torch.arange(256, dtype=torch.uint8)
    vals = codes.view(torch.float8_e4m3fn).double()
    finite = ~torch.isnan(vals)
    return codes[finite].long(), vals[finite]


def test_reference_rounds_to_nearest_e4m3_ties_to_even():
    """Independent oracle: for every element, the nearest of the 254 finite e4m3 values to
    float32(x * float32(448 / amax)), ties to the even code."""
    x = _inputs(24, 257, seed=1)
    q, scale = fp8_pack_reference(x)
    xf = x.float()
    amax = xf.abs().amax(1).clamp_min(1e-30)
    inv = torch.full_like(amax, 448.0) / amax
    v = (xf * inv[:, None]).double().reshape(-1)
    codes, vals = _e4m3_table()
    dist = (v[:, None] - vals[None, :]).abs()
    best = dist.min(1, keepdim=True).values
    tied = dist == best
    # among tied candidates prefer an even code (mantissa LSB 0); +0 over -0 for zeros
    pref = tied.double() * 4 + (codes[None, :] % 2 == 0).double() * 2 + (codes[None, :] < 128).double()
    expect = codes[pref.argmax(1)]
    got = q.view(torch.uint8).reshape(-1).long()
    same_value = vals[torch.searchsorted(codes, got)] == vals[torch.searchsorted(codes, expect)]
    assert bool(same_value.all()), f"{int((~same_value).sum())} codes differ from the nearest e4m3 value"
    torch.testing.assert_close(scale, amax / 448.0, rtol=0, atol=0)


def test_roundtrip_error_and_special_rows():
    x = _inputs(64, 1000, seed=2)
    q, scale = fp8_pack(x)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and q.shape == x.shape
    y = fp8_unpack(q, scale)
    assert y.dtype == torch.bfloat16
    xf, yf = x.float(), y.float()
    nz = xf.abs().amax(1) > 0
    rel = (yf - xf).norm(dim=1)[nz] / xf.norm(dim=1)[nz]
    assert float(rel.max()) < 0.04  # 3 mantissa bits: at most 1/16 per element, ~2-3% per row
    assert torch.isfinite(scale).all() and bool((yf[~nz] == 0).all())
    # the largest element of each row maps to +-448 exactly
    arg = xf.abs().argmax(1)
    top = q.float()[torch.arange(64), arg][nz].abs()
    assert bool((top == 448).all())
    # bytes on disk: half of bf16
    assert q.view(torch.uint8).numel() * 1 + scale.numel() * 4 < x.numel() * 2 * 0.51


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_unpack_dtypes_and_uint8_storage(dtype):
    x = _inputs(8, 96, seed=3)
    q, s = fp8_pack(x)
    y = fp8_unpack(q.view(torch.uint8), s, dtype)
    assert y.dtype == dtype
    expect = (q.float() * s[:, None]).to(dtype)
    assert torch.equal(y, expect)


def test_bad_input():
    with pytest.raises(BadInput):
        fp8_pack(torch.zeros(4))
    with pytest.raises(BadInput):
        fp8_pack(torch.zeros(2, 4), backend="tpu")


@pytest.mark.skipif(GPU, reason="checks the no-GPU error; this machine has a GPU")
def test_cuda_backend_without_gpu_is_a_clear_error():
    with pytest.raises(EnvironmentProblem) as err:
        fp8_pack(torch.zeros(2, 8, dtype=torch.bfloat16), backend="cuda")
    assert "GPU" in str(err.value) and "gpu.cuda" in str(err.value)
    with pytest.raises(EnvironmentProblem):
        fp8_unpack(torch.zeros(2, 8, dtype=torch.uint8), torch.ones(2), backend="cuda")


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (the kernel is checked on an H200 by benchmarks/kernels_bench.py)")
@pytest.mark.parametrize("T,H", [(3, 7), (257, 4096), (64, 21504), (33, 12288), (5, 70000)])
def test_cuda_kernel_bit_exact(T, H):
    from speclock.kernels import fp8_cuda

    x = _inputs(T, H, seed=T * H, device="cuda")
    qr, sr = fp8_pack_reference(x)
    for variant in (0, 1, 2, 3, 5):
        q = torch.full((T, H), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        s = torch.full((T,), float("nan"), device="cuda")
        fp8_cuda.pack(x, q, s, variant=variant)
        assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(s, sr)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        y = torch.full((T, H), float("nan"), dtype=dtype, device="cuda")
        fp8_cuda.unpack(q, s, dtype, out=y)
        assert torch.equal(y, fp8_unpack_reference(q, s, dtype))
