"""PyTorch reference implementations: what runs on CPU, and the oracle the fast kernels are tested against.

They define the semantics; `speclock.kernels.eagle3_loss` and `fp8_pack`/`fp8_unpack` must
agree with them (the loss within bf16 rounding, the fp8 codes bit for bit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FP8_MAX = 448.0  # largest finite float8 e4m3fn value
AMAX_FLOOR = 1e-30  # keeps the scale of an all-zero row finite (its codes are all zero anyway)


def eagle3_loss_reference(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, target_probs: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft cross-entropy of softmax(hidden @ W^T) against target_probs, and top-1 matches.

    Computed in float32 (logits from the inputs upcast), differentiable by autograd.
    Returns (loss, top1_correct) as in `speclock.kernels.eagle3_loss`.
    """
    # heavy, optional (torch): imported only where it is used
    import torch

    logits = hidden.float() @ lm_head_weight.float().t()
    p = target_probs.float()
    logp = torch.log_softmax(logits, dim=-1)
    per_token = -(p * logp).sum(dim=-1)
    valid = torch.ones_like(per_token) if mask is None else mask.to(per_token.dtype)
    count = valid.sum().clamp_min(1.0)
    loss = (per_token * valid).sum() / count
    hits = (logits.argmax(dim=-1) == p.argmax(dim=-1)).to(torch.int64)
    correct = (hits * valid.to(torch.int64)).sum()
    return loss, correct


def eagle3_loss_eager(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, target_probs: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same loss written the way training code usually does (logits in the input dtype, then
    float32 softmax): the eager and torch.compile baselines of the benchmark."""
    # heavy, optional (torch): imported only where it is used
    import torch

    logits = (hidden @ lm_head_weight.t()).float()
    logp = torch.log_softmax(logits, dim=-1)
    per_token = -(target_probs.float() * logp).sum(dim=-1)
    valid = torch.ones_like(per_token) if mask is None else mask.to(per_token.dtype)
    loss = (per_token * valid).sum() / valid.sum().clamp_min(1.0)
    correct = ((logits.argmax(-1) == target_probs.argmax(-1)).to(torch.int64) * valid.to(torch.int64)).sum()
    return loss, correct


def fp8_pack_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token fp8 e4m3 quantisation: returns (q float8_e4m3fn [T,H], scale float32 [T]).

    amax = max(|x|, 1e-30) per row; q = e4m3(x * (448 / amax)); scale = amax / 448.
    Every operation is one IEEE float32 operation, so the CUDA kernel matches bit for bit.
    """
    # heavy, optional (torch): imported only where it is used
    import torch

    xf = x.float()
    amax = xf.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    inv = torch.full_like(amax, FP8_MAX) / amax  # tensor / tensor: one IEEE division (448.0 / t is not)
    q = (xf * inv.unsqueeze(-1)).to(torch.float8_e4m3fn)
    scale = amax / torch.full_like(amax, FP8_MAX)
    return q, scale


def fp8_unpack_reference(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Inverse of fp8_pack_reference: dtype(float32(q) * scale[:, None]) (bfloat16 by default)."""
    # heavy, optional (torch): imported only where it is used
    import torch

    dtype = dtype or torch.bfloat16
    if q.dtype == torch.uint8:
        q = q.view(torch.float8_e4m3fn)
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)
