"""speclock's own kernels, each with a PyTorch reference that runs on CPU and serves as the test oracle.

Public API (stable; the training code calls these):

    loss, top1_correct = eagle3_loss(hidden, lm_head_weight, target_probs, mask=None)
    q, scale = fp8_pack(x)
    x_approx = fp8_unpack(q, scale, dtype=torch.bfloat16)

CUDA tensors go to the fast kernels (Triton for the loss, the nvcc-built library for fp8),
CPU tensors to the references in `speclock.kernels.reference`. `backend=` forces a choice.
torch and triton are imported on first call, never at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.kernels import fp8_cuda
from speclock.kernels.reference import eagle3_loss_reference, fp8_pack_reference, fp8_unpack_reference

if TYPE_CHECKING:
    import torch

__all__ = ["eagle3_loss", "fp8_pack", "fp8_unpack"]

_LOSS_BACKENDS = ("auto", "triton", "triton-interpret", "reference")
_FP8_BACKENDS = ("auto", "cuda", "reference")


def _no_gpu(what: str) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"{what} was asked to run on a GPU, but none is visible (torch.cuda.is_available() is False)",
        hint="run on a GPU host, or use a CPU stack (empty gpu.cuda, no kernels.build): CPU tensors use the PyTorch reference",
    )


def eagle3_loss(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    target_probs: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    backend: str = "auto",
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-3 training loss of the draft lm_head: soft cross-entropy and top-1 matches.

    Args:
        hidden: drafter hidden states [T, H] (bf16 on GPU; any float dtype on CPU).
        lm_head_weight: draft lm_head weight [V, H], same dtype and device as hidden.
        target_probs: the target's distribution restricted to the draft vocabulary [T, V]
            (any float dtype; rows need not sum to 1). Treated as a constant: no gradient.
        mask: optional [T], bool or 0/1; tokens with 0 are ignored. None = every token counts.
        backend: "auto" (Triton on CUDA tensors, the reference on CPU), "triton", "reference",
            or "triton-interpret" (the Triton kernel on CPU tensors through Triton's interpreter:
            slow, for tests).
        chunk_tokens: tokens per chunk for the Triton path (default: the largest power of two
            with C*V*6 bytes <= 768 MiB; 4096 at V = 32000).

    Returns:
        loss: float32 scalar, differentiable w.r.t. hidden and lm_head_weight:
              loss = sum_t m_t * ( -sum_v p[t,v] * log softmax(hidden[t] @ W^T)[v] ) / max(1, sum_t m_t)
              (logits and softmax in float32; m_t = mask, 1 when mask is None).
        top1_correct: int64 scalar, the number of tokens with m_t != 0 where
              argmax_v logits[t] == argmax_v target_probs[t] (first index on ties, like torch.argmax).
              Accuracy = top1_correct / number of unmasked tokens.

    The Triton path never materialises the [T, V] logits: it works in token chunks, computes
    both gradients during the forward sweep and only scales them in backward, so backward may
    run once per forward.
    """
    if backend not in _LOSS_BACKENDS:
        raise BadInput(f"eagle3_loss: backend {backend!r} is not one of {', '.join(_LOSS_BACKENDS)}")
    _check_loss_inputs(hidden, lm_head_weight, target_probs, mask)
    if backend == "auto":
        backend = "triton" if hidden.is_cuda else "reference"
    if backend == "reference":
        return eagle3_loss_reference(hidden, lm_head_weight, target_probs, mask)
    if backend == "triton" and not hidden.is_cuda:
        # heavy, optional (torch): imported only where it is used
        import torch

        if not torch.cuda.is_available():
            raise _no_gpu("eagle3_loss(backend='triton')")
        raise BadInput("eagle3_loss(backend='triton') needs CUDA tensors; move them with .cuda()")
    if backend == "triton-interpret" and hidden.is_cuda:
        raise BadInput("eagle3_loss(backend='triton-interpret') runs on CPU tensors only")
    # heavy, optional (torch): imported only where it is used
    from speclock.kernels.eagle3_triton import eagle3_loss_triton

    return eagle3_loss_triton(hidden, lm_head_weight, target_probs, mask, chunk_tokens)


def _check_loss_inputs(hidden: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor, mask: torch.Tensor | None) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or probs.dim() != 2:
        raise BadInput(
            f"eagle3_loss: want hidden [T,H], lm_head_weight [V,H], target_probs [T,V]; got "
            f"{list(hidden.shape)}, {list(weight.shape)}, {list(probs.shape)}"
        )
    (T, H), (V, H2) = hidden.shape, weight.shape
    if H2 != H or tuple(probs.shape) != (T, V):
        raise BadInput(
            f"eagle3_loss: shapes disagree: hidden {list(hidden.shape)}, lm_head_weight "
            f"{list(weight.shape)}, target_probs {list(probs.shape)} (want [T,H], [V,H], [T,V])"
        )
    if mask is not None and tuple(mask.shape) != (T,):
        raise BadInput(f"eagle3_loss: mask must be [T] = [{T}], got {list(mask.shape)}")
    if hidden.dtype != weight.dtype:
        raise BadInput(f"eagle3_loss: hidden is {hidden.dtype} but lm_head_weight is {weight.dtype}; cast one")
    devs = {t.device for t in (hidden, weight, probs) + (() if mask is None else (mask,))}
    if len(devs) != 1:
        raise BadInput(f"eagle3_loss: inputs are on different devices: {sorted(map(str, devs))}")


def fp8_pack(x: torch.Tensor, *, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Pack hidden states [T, H] into float8 e4m3 codes with one float32 scale per token.

    Returns (q [T, H] torch.float8_e4m3fn, scale [T] float32), half the bytes of bf16
    (use q.view(torch.uint8) to store raw bytes). Per row: amax = max(|x|, 1e-30),
    q = e4m3_round_nearest_even(x * (448 / amax)), scale = amax / 448. The CUDA kernel and
    the reference agree bit for bit. CUDA tensors must be bfloat16; CPU tensors any float dtype.
    """
    if backend not in _FP8_BACKENDS:
        raise BadInput(f"fp8_pack: backend {backend!r} is not one of {', '.join(_FP8_BACKENDS)}")
    if x.dim() != 2:
        raise BadInput(f"fp8_pack: want x [T, H], got {list(x.shape)}")
    if backend == "auto":
        backend = "cuda" if x.is_cuda else "reference"
    if backend == "reference":
        return fp8_pack_reference(x)
    if not x.is_cuda:
        # heavy, optional (torch): imported only where it is used
        import torch

        if not torch.cuda.is_available():
            raise _no_gpu("fp8_pack(backend='cuda')")
        raise BadInput("fp8_pack(backend='cuda') needs a CUDA tensor; move x with x.cuda()")
    return fp8_cuda.pack(x)


def fp8_unpack(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype | None = None, *, backend: str = "auto") -> torch.Tensor:
    """Inverse of fp8_pack: dtype(float32(q) * scale[:, None]), bfloat16 by default.

    q may be float8_e4m3fn or its uint8 bytes; the result is [T, H] on q's device.
    """
    # heavy, optional (torch): imported only where it is used
    import torch

    dtype = dtype or torch.bfloat16
    if backend not in _FP8_BACKENDS:
        raise BadInput(f"fp8_unpack: backend {backend!r} is not one of {', '.join(_FP8_BACKENDS)}")
    if backend == "auto":
        backend = "cuda" if q.is_cuda else "reference"
    if backend == "reference":
        return fp8_unpack_reference(q, scale, dtype)
    if not q.is_cuda:
        if not torch.cuda.is_available():
            raise _no_gpu("fp8_unpack(backend='cuda')")
        raise BadInput("fp8_unpack(backend='cuda') needs CUDA tensors; move q and scale with .cuda()")
    return fp8_cuda.unpack(q, scale, dtype)
