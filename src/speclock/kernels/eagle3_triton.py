"""The EAGLE-3 soft cross-entropy fused with the draft lm_head: Triton row kernel + chunked driver.

Design (docs/kernels.md has the measurements):
  * Tokens are processed in chunks of C rows. For each chunk one GEMM gives float32 logits
    [C, V] (bf16 operands, float32 output: no rounding of the logits to bf16); the full
    [T, V] logits never exist.
  * One Triton program per row streams the row's logits and target probabilities in blocks
    of the vocabulary, with an online softmax (running max and rescaled sum), and in the same
    pass the dot product p.z, the sum of p and both argmaxes. A second pass over the row (from
    L2) writes the gradient of the row's loss with respect to its logits, p_sum*softmax(z) - p,
    in bf16 over the first half of the row's own float32 logits (no extra buffer), so forward
    and backward are done in one sweep.
  * Two more GEMMs turn the chunk's logit gradient into its slice of grad_hidden and add its
    share of grad_weight (float32 accumulator). That is 3 GEMMs of 2*T*H*V FLOPs in total,
    against 4 for a design that recomputes the logits in backward; backward only scales the
    stored gradients by grad_output / n_valid.
On CPU tensors the same row kernel runs under Triton's interpreter (tests only: it is slow).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl

from speclock.core.errors import BadInput

DEFAULT_CHUNK_BUDGET = 768 << 20  # bytes for one chunk's float32 logits (+ bf16 logit gradient when not in place)


# Triton reads a kernel's annotations (tl.constexpr marks compile-time arguments), so the pointers and sizes stay
# unannotated, as Triton expects them.
def _row_kernel(  # type: ignore[no-untyped-def]
    logits_ptr,
    probs_ptr,
    mask_ptr,
    grad_ptr,
    loss_ptr,
    hit_ptr,
    V,
    stride_l,
    stride_p,
    stride_g,
    HAS_MASK: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    l_row = logits_ptr + row * stride_l
    p_row = probs_ptr + row * stride_p
    cols = tl.arange(0, BLOCK_V)

    m = tl.full([], float("-inf"), tl.float32)  # running max of the logits
    s = tl.zeros([], tl.float32)  # running sum of exp(z - m)
    pz = tl.zeros([], tl.float32)  # sum of p * z
    psum = tl.zeros([], tl.float32)
    best_z = tl.full([], float("-inf"), tl.float32)
    best_zi = tl.zeros([], tl.int32)
    best_p = tl.full([], float("-inf"), tl.float32)
    best_pi = tl.zeros([], tl.int32)
    for start in range(0, V, BLOCK_V):
        offs = start + cols
        inb = offs < V
        z = tl.load(l_row + offs, mask=inb, other=float("-inf")).to(tl.float32)
        p = tl.load(p_row + offs, mask=inb, other=0.0).to(tl.float32)
        bz = tl.max(z, axis=0)
        m_new = tl.maximum(m, bz)
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m = m_new
        pz += tl.sum(p * tl.where(inb, z, 0.0), axis=0)
        psum += tl.sum(p, axis=0)
        # first index of the maximum, like torch.argmax: a later block wins only if strictly larger
        zi = tl.argmax(z, axis=0).to(tl.int32) + start
        best_zi = tl.where(bz > best_z, zi, best_zi)
        best_z = tl.maximum(best_z, bz)
        pb = tl.where(inb, p, float("-inf"))
        bp = tl.max(pb, axis=0)
        pi = tl.argmax(pb, axis=0).to(tl.int32) + start
        best_pi = tl.where(bp > best_p, pi, best_pi)
        best_p = tl.maximum(best_p, bp)

    lse = m + tl.log(s)
    if HAS_MASK:
        w = tl.load(mask_ptr + row).to(tl.float32)
    else:
        w = 1.0
    tl.store(loss_ptr + row, (psum * lse - pz) * w)
    tl.store(hit_ptr + row, ((best_zi == best_pi) & (w != 0.0)).to(tl.int32))
    if WRITE_GRAD:
        g_row = grad_ptr + row * stride_g
        for start in range(0, V, BLOCK_V):
            offs = start + cols
            inb = offs < V
            z = tl.load(l_row + offs, mask=inb, other=0.0).to(tl.float32)
            p = tl.load(p_row + offs, mask=inb, other=0.0).to(tl.float32)
            g = (psum * tl.exp(z - lse) - p) * w
            tl.store(g_row + offs, g.to(grad_ptr.dtype.element_ty), mask=inb)


@functools.cache
def _kernel(interpret: bool) -> Any:  # a triton JITFunction (triton has no type information)
    # Triton picks compiler or interpreter from TRITON_INTERPRET when it is imported (its own
    # library functions are decorated then), so the interpreter cannot be chosen per call.
    if interpret and not os.environ.get("TRITON_INTERPRET") == "1":
        raise BadInput(
            "the Triton loss kernel on CPU tensors needs Triton's interpreter",
            hint="set TRITON_INTERPRET=1 before the first import of triton (tests do this in a subprocess)",
        )
    return triton.jit(_row_kernel)


_MM_DTYPE_OK = [True]
INPLACE_GRAD = [True]  # write the bf16 logit gradient over the chunk's float32 logits (saves C*V*2 bytes)
DW_ACCUM = ["float32"]  # grad_weight accumulator across chunks: "float32" or "weight" (the weight's dtype)
_ADDMM_DTYPE_OK = [True]


def _logits_f32(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float32 logits of bf16/fp16 operands without rounding them to the input dtype."""
    if h.is_cuda and h.dtype in (torch.bfloat16, torch.float16):
        if _MM_DTYPE_OK[0]:
            try:
                return torch.mm(h, w.t(), out_dtype=torch.float32)
            except (RuntimeError, NotImplementedError, TypeError):
                _MM_DTYPE_OK[0] = False  # torch without mm(out_dtype=): logits rounded to the input dtype
        return (h @ w.t()).float()
    return h.float() @ w.float().t()


def _accumulate_dw(dw32: torch.Tensor, g: torch.Tensor, h: torch.Tensor, first: bool) -> None:
    """dw32 (+)= g^T @ h with low-precision operands; the first chunk writes instead of adding."""
    if dw32.dtype == g.dtype:
        if first:
            torch.mm(g.t(), h, out=dw32)
        else:
            dw32.addmm_(g.t(), h)
        return
    if first and dw32.is_cuda and g.dtype in (torch.bfloat16, torch.float16) and _MM_DTYPE_OK[0]:
        torch.ops.aten.mm.dtype_out(g.t(), h, torch.float32, out=dw32)
        return
    if first:
        dw32.zero_()
    if dw32.is_cuda and g.dtype in (torch.bfloat16, torch.float16) and _ADDMM_DTYPE_OK[0]:
        try:
            torch.ops.aten.addmm.dtype_out(dw32, g.t(), h, torch.float32, out=dw32)
            return
        except (RuntimeError, NotImplementedError):
            _ADDMM_DTYPE_OK[0] = False  # older torch: fall back to a product then an add
    if dw32.is_cuda and g.dtype in (torch.bfloat16, torch.float16) and _MM_DTYPE_OK[0]:
        dw32.add_(torch.mm(g.t(), h, out_dtype=torch.float32))
    elif dw32.is_cuda:
        dw32.add_(g.t() @ h)
    else:
        dw32.add_(g.float().t() @ h.float())


def default_chunk(T: int, V: int, budget: int = DEFAULT_CHUNK_BUDGET) -> int:
    per_row = V * 6  # float32 logits + bf16 gradient
    c = max(128, budget // per_row)
    c = 1 << (c.bit_length() - 1)  # a power of two: full GEMM tiles
    return min(T, c)


def _launch_rows(
    logits: torch.Tensor,
    probs: torch.Tensor,
    mask_f: torch.Tensor | None,
    grad: torch.Tensor | None,
    loss_rows: torch.Tensor,
    hits: torch.Tensor,
    interpret: bool,
) -> None:
    rows, V = logits.shape
    block = min(4096, triton.next_power_of_2(V))
    kern = _kernel(interpret)
    write_grad = grad is not None
    g = grad if grad is not None else logits  # unused pointer when WRITE_GRAD is False
    kern[(rows,)](
        logits,
        probs,
        mask_f if mask_f is not None else logits,
        g,
        loss_rows,
        hits,
        V,
        logits.stride(0),
        probs.stride(0),
        g.stride(0),
        HAS_MASK=mask_f is not None,
        WRITE_GRAD=write_grad,
        BLOCK_V=block,
        **({} if interpret else {"num_warps": 8}),
    )


class Eagle3LossFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,  # torch's FunctionCtx, with the attributes this function sets on it
        hidden: torch.Tensor,
        weight: torch.Tensor,
        target_probs: torch.Tensor,
        mask: torch.Tensor | None,
        chunk_tokens: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        T, H = hidden.shape
        V = weight.shape[0]
        interpret = not hidden.is_cuda
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_grad = need_dh or need_dw
        dev = hidden.device
        mask_f = None if mask is None else mask.to(device=dev, dtype=torch.float32).contiguous()
        probs = target_probs if target_probs.stride(-1) == 1 else target_probs.contiguous()
        C = chunk_tokens or default_chunk(T, V)
        loss_rows = torch.empty(T, dtype=torch.float32, device=dev)
        hits = torch.empty(T, dtype=torch.int32, device=dev)
        dh = torch.empty_like(hidden) if need_dh else None
        acc_dtype = weight.dtype if DW_ACCUM[0] == "weight" else torch.float32
        dw32 = torch.empty(V, H, dtype=acc_dtype, device=dev) if need_dw else None
        grad_dtype = hidden.dtype if hidden.dtype in (torch.bfloat16, torch.float16) else torch.float32
        for c0 in range(0, T, C):
            c1 = min(T, c0 + C)
            hc = hidden[c0:c1]
            logits = _logits_f32(hc, weight)
            g: torch.Tensor | None = None
            if need_grad and INPLACE_GRAD[0] and grad_dtype.itemsize == 2 and logits.dtype == torch.float32:
                # Row r's gradient lands in the first half of row r's own float32 logits; each
                # program reads a block before it writes, and writes only bytes it has read.
                g = logits.view(grad_dtype)[:, :V]
            elif need_grad:
                g = torch.empty(c1 - c0, V, dtype=grad_dtype, device=dev)
            _launch_rows(
                logits, probs[c0:c1], None if mask_f is None else mask_f[c0:c1], g, loss_rows[c0:c1], hits[c0:c1], interpret
            )
            del logits
            if dh is not None and g is not None:  # need_dh: dh and g were allocated
                if g.dtype == hidden.dtype:
                    torch.mm(g, weight, out=dh[c0:c1])
                else:
                    dh[c0:c1] = (g @ weight.float()).to(hidden.dtype)
            if dw32 is not None and g is not None:  # need_dw: dw32 and g were allocated
                _accumulate_dw(dw32, g.to(hidden.dtype) if g.dtype != hidden.dtype and hidden.is_cuda else g, hc, c0 == 0)
            del g
        count = (torch.full((), float(T), device=dev) if mask_f is None else mask_f.sum()).clamp_min(1.0)
        loss = loss_rows.sum() / count
        correct = hits.sum(dtype=torch.int64)
        dw = None
        if dw32 is not None:  # need_dw
            dw = dw32 if dw32.dtype == weight.dtype else dw32.to(weight.dtype)
            del dw32
        ctx.save_for_backward(dh, dw, count)
        ctx.done = False
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(
        ctx: Any, grad_loss: torch.Tensor, _grad_correct: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        if ctx.done:
            raise RuntimeError("eagle3_loss: backward may run once per forward (the gradients are scaled in place)")
        ctx.done = True
        dh, dw, count = ctx.saved_tensors
        factor = (grad_loss / count).to(torch.float32)
        if dh is not None:
            dh.mul_(factor)
        if dw is not None:
            dw.mul_(factor)
        return dh, dw, None, None, None


def eagle3_loss_triton(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    target_probs: torch.Tensor,
    mask: torch.Tensor | None = None,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # torch declares Function.apply without types; it returns what forward returns
    out: tuple[torch.Tensor, torch.Tensor] = Eagle3LossFunction.apply(  # type: ignore[no-untyped-call]
        hidden, lm_head_weight, target_probs, mask, chunk_tokens
    )
    return out
