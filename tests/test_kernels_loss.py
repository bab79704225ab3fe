"""The fused EAGLE-3 loss: the reference against an independent float64 formula, and the Triton
kernel against the reference under Triton's CPU interpreter (and on a GPU when there is one)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

torch = pytest.importorskip("torch")

from speclock.core.errors import BadInput, EnvironmentProblem  # noqa: E402
from speclock.kernels import eagle3_loss  # noqa: E402
from speclock.kernels.reference import eagle3_loss_reference  # noqa: E402

GPU = torch.cuda.is_available()


def _inputs(T, H, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) / H**0.5 * 3).to(dtype)
    p = torch.softmax(torch.randn(T, V, generator=g) * 2 + (h.float() @ w.float().t()), -1)
    mask = torch.rand(T, generator=g) > 0.3
    return h, w, p, mask


def test_reference_matches_float64_formula_and_analytic_gradient():
    h, w, p, mask = _inputs(40, 16, 50, seed=0)
    p = p * 0.9  # rows that do not sum to 1 are allowed
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, correct = eagle3_loss(hh, ww, p, mask)  # CPU: the reference
    loss.backward()
    z = h.double() @ w.double().t()
    lse = torch.logsumexp(z, -1, keepdim=True)
    per = -(p.double() * (z - lse)).sum(-1)
    m = mask.double()
    n = m.sum()
    assert abs(loss.item() - float((per * m).sum() / n)) < 1e-5
    assert int(correct) == int(((z.argmax(-1) == p.argmax(-1)) & mask).sum())
    dz = (p.double().sum(-1, keepdim=True) * torch.softmax(z, -1) - p.double()) * (m / n)[:, None]
    torch.testing.assert_close(hh.grad.double(), dz @ w.double(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ww.grad.double(), dz.t() @ h.double(), rtol=1e-4, atol=1e-6)


def test_all_masked_gives_zero_not_nan():
    h, w, p, _ = _inputs(5, 8, 12, seed=1)
    loss, correct = eagle3_loss(h, w, p, torch.zeros(5, dtype=torch.bool))
    assert loss.item() == 0.0 and int(correct) == 0


def test_bad_inputs_are_named():
    h, w, p, mask = _inputs(6, 8, 10, seed=2)
    with pytest.raises(BadInput, match="shapes disagree"):
        eagle3_loss(h, w[:, :4], p)
    with pytest.raises(BadInput, match="mask"):
        eagle3_loss(h, w, p, mask[:3])
    with pytest.raises(BadInput, match="bfloat16"):
        eagle3_loss(h, w.bfloat16(), p)
    with pytest.raises(BadInput, match="backend"):
        eagle3_loss(h, w, p, backend="cuda")


@pytest.mark.skipif(GPU, reason="checks the no-GPU error; this machine has a GPU")
def test_triton_backend_without_gpu_is_a_clear_error():
    h, w, p, _ = _inputs(6, 8, 10, seed=3)
    with pytest.raises(EnvironmentProblem) as err:
        eagle3_loss(h, w, p, backend="triton")
    assert "GPU" in str(err.value) and "gpu.cuda" in str(err.value)


_INTERPRETER_SCRIPT = textwrap.dedent("""
    import torch
    from speclock.kernels import eagle3_loss
    from speclock.kernels import eagle3_triton as e3
    from speclock.kernels.reference import eagle3_loss_reference

    def inputs(T, H, V, seed, dtype):
        g = torch.Generator().manual_seed(seed)
        h = torch.randn(T, H, generator=g).to(dtype)
        w = (torch.randn(V, H, generator=g) / H ** 0.5 * 3).to(dtype)
        p = torch.softmax(torch.randn(T, V, generator=g) * 2 + (h.float() @ w.float().t()), -1)
        return h, w, p, torch.rand(T, generator=g) > 0.3

    def rel(a, b):
        return float((a.double() - b.double()).norm() / b.double().norm())

    # (T, H, V, dtype, use_mask, chunk, inplace): several chunks, a chunk that does not divide T,
    # V over one 4096 block (the online softmax across blocks), bf16 with the in-place gradient.
    cases = [(37, 24, 300, torch.float32, True, 16, True), (9, 16, 5000, torch.float32, False, 4, True),
             (33, 32, 515, torch.bfloat16, True, 10, True), (33, 32, 515, torch.bfloat16, True, 10, False)]
    for T, H, V, dtype, use_mask, chunk, inplace in cases:
        e3.INPLACE_GRAD[0] = inplace
        h, w, p, mask = inputs(T, H, V, T + V, dtype)
        mask = mask if use_mask else None
        if V == 300:
            p = p * 0.8  # target rows need not sum to 1 (a draft vocabulary cuts the target's mass)
        a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss, correct = eagle3_loss(a, b, p, mask, backend="triton-interpret", chunk_tokens=chunk)
        loss.backward()
        ra, rb = h.float().requires_grad_(), w.float().requires_grad_()
        rloss, rcorrect = eagle3_loss_reference(ra, rb, p, mask)
        rloss.backward()
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert abs(loss.item() - rloss.item()) <= 1e-5 * abs(rloss.item()), (loss.item(), rloss.item())
        assert int(correct) == int(rcorrect), (int(correct), int(rcorrect))
        assert rel(a.grad, ra.grad) < tol and rel(b.grad, rb.grad) < tol, (rel(a.grad, ra.grad), rel(b.grad, rb.grad))
        if mask is not None:
            assert bool((a.grad[~mask] == 0).all())
        try:
            loss.backward()
        except RuntimeError as err:
            assert "once" in str(err)
        else:
            raise AssertionError("a second backward must fail, not double-scale the gradients")
        print("ok", T, H, V, dtype, use_mask, chunk, inplace, flush=True)

    # argmax ties: duplicated lm_head rows tie exactly; the first index wins, as in torch.argmax
    h, w, p, _ = inputs(8, 16, 40, 7, torch.float32)
    w[20] = w[3]
    w[31] = w[3]
    z = h @ w.t()
    p = torch.zeros(8, 40)
    p[torch.arange(8), z.argmax(-1)] = 1.0  # targets agree with the first maximal index
    loss, correct = eagle3_loss(h, w, p, backend="triton-interpret")
    assert int(correct) == int(eagle3_loss_reference(h, w, p)[1]) == 8
    # no gradient wanted: the kernel skips the gradient pass, same loss
    with torch.no_grad():
        h, w, p, mask = inputs(20, 8, 100, 11, torch.float32)
        l1, c1 = eagle3_loss(h, w, p, mask, backend="triton-interpret")
        l2, c2 = eagle3_loss_reference(h, w, p, mask)
        assert abs(l1.item() - l2.item()) < 1e-5 and int(c1) == int(c2)
    print("ALL OK")
""")


def test_triton_kernel_under_interpreter():  # ~10-17 s: the interpreter runs the kernel in numpy
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_triton_on_cpu_without_interpreter_is_refused():
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    h, w, p, _ = _inputs(4, 8, 10, seed=4)
    with pytest.raises(BadInput, match="TRITON_INTERPRET"):
        eagle3_loss(h, w, p, backend="triton-interpret")


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (the kernel is checked on an H200 by benchmarks/kernels_bench.py)")
def test_triton_kernel_on_gpu():
    h, w, p, mask = _inputs(1000, 256, 4097, seed=5, dtype=torch.bfloat16)
    h, w, p, mask = h.cuda(), w.cuda(), p.cuda(), mask.cuda()
    a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, correct = eagle3_loss(a, b, p, mask, chunk_tokens=300)
    loss.backward()
    ra, rb = h.double().requires_grad_(), w.double().requires_grad_()
    rloss, rcorrect = eagle3_loss_reference(ra, rb, p.double(), mask)
    rloss.backward()
    assert abs(loss.item() - rloss.item()) < 1e-3 * abs(rloss.item())
    assert abs(int(correct) - int(rcorrect)) <= 2
    for got, ref in ((a.grad, ra.grad), (b.grad, rb.grad)):
        assert float((got.double() - ref).norm() / ref.norm()) < 1e-2
