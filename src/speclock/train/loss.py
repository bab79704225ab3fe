"""The TTT loss the fit loop minimises (EAGLE-3's step-weighted soft cross-entropy, plain or fused) and the greedy data check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speclock.core.errors import BadInput
from speclock.kernels import eagle3_loss

if TYPE_CHECKING:
    import torch


def ttt_loss(drafter, target_head, ids, lm, aux, fin, steps: int, reduce_counts=None, fused: str | None = None):
    """(weighted loss, per-step accuracies, per-step losses). `reduce_counts` (distributed runs) turns this
    process's per-step counts of loss positions into the global batch's, so each step is normalized by
    the whole global batch and the processes' losses add up to the one-process loss.
    `fused`: a speclock.kernels.eagle3_loss backend ("triton" on a GPU): the draft lm_head, the soft
    cross-entropy and the top-1 count in one chunked kernel, never holding [tokens x draft vocab]
    logits (same loss and gradients; one-process runs only, as FSDP2 shards lm_head)."""
    # heavy, optional (torch): imported only where it is used
    import torch

    if fused and reduce_counts is not None:
        raise BadInput("the fused loss runs in one-process training only", hint="drop --nproc, or pass --unfused-loss")

    B, T = ids.shape
    d2t_ids = drafter.draft_to_target_ids()
    with torch.no_grad():
        tl = fin.to(target_head.dtype) @ target_head.t()  # [B,T,V] target logits (position p predicts p+1)
        t_arg = tl.argmax(-1)
        tp = tl[..., d2t_ids].float().softmax(-1)
        in_vocab = drafter.t2d[t_arg]
        del tl
        counts = torch.stack([(lm[:, 2 + s :] & in_vocab[:, 1 + s : T - 1]).sum() for s in range(steps)])
        if reduce_counts is not None:
            counts = reduce_counts(counts)
    outs = drafter.ttt_forward(ids, aux.to(drafter.fc.weight.dtype), steps, normed_only=bool(fused))
    total = 0.0
    accs, losses = [], []
    for s, logits in enumerate(outs):
        n = T - 2 - s
        if n <= 0:
            break
        mask = lm[:, 2 + s :] & in_vocab[:, 1 + s : T - 1]
        if fused:
            loss_s, acc = _fused_step(drafter, logits[:, :n][mask], tp[:, 1 + s : T - 1][mask], fused)
            total = total + (0.8**s) * loss_s
            accs.append(acc)
            losses.append(float(loss_s.detach()))
            continue
        logp = logits[:, :n].float().log_softmax(-1)
        ce = -(tp[:, 1 + s : T - 1] * logp).sum(-1)
        cnt = counts[s].clamp(min=1)
        loss_s = (ce * mask).sum() / cnt
        total = total + (0.8**s) * loss_s
        with torch.no_grad():
            pred = d2t_ids[logits[:, :n].argmax(-1)]
            acc = ((pred == t_arg[:, 1 + s : T - 1]) & mask).sum() / cnt
        accs.append(float(acc))
        losses.append(float(loss_s.detach()))
    return total, accs, losses


def _fused_step(drafter, hidden_rows, probs_rows, backend: str):
    """One TTT step through speclock.kernels.eagle3_loss: (mean soft CE over the rows, accuracy)."""
    # heavy, optional (torch): imported only where it is used
    import torch

    if hidden_rows.shape[0] == 0:
        return hidden_rows.sum() * 0.0, 0.0
    weight = drafter.lm_head.weight
    # The Triton kernel takes bf16 on a GPU; autocast off so that the dtypes are what we pass.
    dtype = torch.bfloat16 if hidden_rows.is_cuda else weight.dtype
    with torch.autocast(device_type="cuda", enabled=False):
        loss, correct = eagle3_loss(hidden_rows.to(dtype), weight.to(dtype), probs_rows, backend=backend)
    return loss, float(correct) / hidden_rows.shape[0]


def data_consistency(ids: torch.Tensor, lm: torch.Tensor, fin: torch.Tensor, target_head: torch.Tensor) -> float:
    """Share of response tokens equal to the target's own greedy choice at that point: about 1.0 when
    the data really is the target's greedy output (a check on the generator and the extraction)."""
    # heavy, optional (torch): imported only where it is used
    import torch

    with torch.no_grad():
        pred = (fin[:, :-1].to(target_head.dtype) @ target_head.t()).argmax(-1)
        mask = lm[:, 1:]
        return float(((pred == ids[:, 1:]) & mask).sum() / mask.sum().clamp(min=1))
