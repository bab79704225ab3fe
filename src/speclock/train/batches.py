"""What the fit loop reads of the extracted data: the draft vocabulary, seeded batch order, held-out split, padded batches."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from speclock.core.errors import BadInput
from speclock.train.extract import gather_states, state_widths

if TYPE_CHECKING:
    import torch


def build_draft_vocab(input_ids, loss_mask, vocab_size: int, draft_vocab_size: int):
    """The `draft_vocab_size` target ids most frequent among response tokens (ties: lower id), sorted."""
    # heavy, optional (torch): imported only where it is used
    import torch

    if draft_vocab_size > vocab_size:
        raise BadInput(f"draft vocab {draft_vocab_size} is larger than the target vocab {vocab_size}")
    resp = input_ids[loss_mask.bool()].long()
    counts = torch.bincount(resp, minlength=vocab_size).double()
    counts += torch.bincount(input_ids.long(), minlength=vocab_size).double() * 1e-6  # prompts break ties
    counts -= torch.arange(vocab_size, dtype=torch.float64) * 1e-12
    top = counts.topk(draft_vocab_size).indices.sort().values
    covered = float(counts[top].clamp(min=0).sum() / counts.clamp(min=0).sum())
    return top, {
        "response_tokens": int(resp.numel()),
        "distinct_response_tokens": int((torch.bincount(resp, minlength=vocab_size) > 0).sum()),
        "coverage_of_response_tokens": round(
            float(torch.bincount(resp, minlength=vocab_size)[top].sum()) / max(1, resp.numel()), 5
        ),
        "coverage_weighted": round(covered, 5),
    }


def batches_for_epoch(spans: list[tuple[int, int]], max_len: int, batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Sequence indices per batch: similar lengths together, at most batch_tokens padded tokens, shuffled."""
    order = sorted(range(len(spans)), key=lambda i: min(spans[i][1], max_len))
    batches: list[list[int]] = []
    cur: list[int] = []
    width = 0
    for i in order:
        n = min(spans[i][1], max_len)
        if cur and max(width, n) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    if cur:
        batches.append(cur)
    random.Random(seed * 1000003 + epoch).shuffle(batches)
    return batches


def split_holdout(num_sequences: int, holdout: int, seed: int) -> tuple[list[int], list[int]]:
    """(training ids, held-out ids): a seeded draw of `holdout` sequences, the rest in order."""
    if holdout < 0 or (holdout and holdout >= num_sequences):
        raise BadInput(
            f"holdout of {holdout} sequences leaves nothing to train on ({num_sequences} sequences)",
            hint="pass a smaller --holdout",
        )
    held = sorted(random.Random(seed * 7919 + 1).sample(range(num_sequences), holdout)) if holdout else []
    hs = set(held)
    return [i for i in range(num_sequences) if i not in hs], held


def collate(
    data: dict[str, Any], idxs: list[int], max_len: int, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(ids, loss mask, aux states, final states) of a batch, padded to its longest sequence; and its token count."""
    # heavy, optional (torch): imported only where it is used
    import torch

    spans = [(s, min(n, max_len)) for s, n in (data["spans"][i] for i in idxs)]
    T = max(n for _, n in spans)
    B = len(spans)
    H3, H = state_widths(data)
    ids = torch.zeros(B, T, dtype=torch.long, device=device)
    lm = torch.zeros(B, T, dtype=torch.bool, device=device)
    aux = torch.zeros(B, T, H3, dtype=torch.bfloat16, device=device)
    fin = torch.zeros(B, T, H, dtype=torch.bfloat16, device=device)
    aux_rows = gather_states(data, "aux", spans).to(device)
    fin_rows = gather_states(data, "final", spans).to(device)
    at = 0
    for j, (s, n) in enumerate(spans):
        ids[j, :n] = data["input_ids"][s : s + n].to(device)
        lm[j, :n] = data["loss_mask"][s : s + n].to(device).bool()
        aux[j, :n] = aux_rows[at : at + n]
        fin[j, :n] = fin_rows[at : at + n]
        at += n
    return ids, lm, aux, fin, sum(n for _, n in spans)
