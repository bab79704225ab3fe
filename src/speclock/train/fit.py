"""Drafter training with training-time test (TTT), checkpoints and resume.

Loss (train/loss.py; per TTT step s, weighted 0.8**s as in EAGLE-3): cross-entropy between the drafter's
distribution over the draft vocabulary and the target's distribution restricted to it (softmax of
the target logits at those ids), on response tokens whose target argmax lies in the draft vocab.
The target logits come from the stored final hidden states times the target's lm_head.
bf16 autocast with fp32 master weights on a GPU; plain float32 on a CPU.

The batch order (train/batches.py) is a pure function of (seed, epoch), so a resumed run replays the
same batches: resume skips the batches already done in the interrupted epoch.
"""

from __future__ import annotations

import json
import math
import pickle
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from speclock.core.errors import BadInput
from speclock.core.files import atomic_output, atomic_write_text, clean_stale_temps, os_error
from speclock.train.batches import batches_for_epoch, collate
from speclock.train.batches import build_draft_vocab as build_draft_vocab
from speclock.train.batches import split_holdout as split_holdout
from speclock.train.distributed import optimizer_state_by_position
from speclock.train.loss import data_consistency
from speclock.train.loss import ttt_loss as ttt_loss


@dataclass
class FitConfig:
    epochs: int = 3
    ttt_steps: int = 7
    lr: float = 3e-4
    warmup_steps: int = 100
    batch_tokens: int = 16384
    max_len: int = 1024
    draft_vocab_size: int = 8192
    seed: int = 0
    checkpoint_every: int = 200
    grad_clip: float = 0.5
    holdout_sequences: int = 0  # sequences kept out of training, scored at each epoch end (generalisation)
    fused_loss: bool = True  # on a GPU, one process: speclock's Triton loss (same result, less memory)
    max_steps: int = 0  # 0 = no cap (the quick mode and tests cap it)
    time_budget_s: float = 0.0  # 0 = no limit; else stop (checkpointed) after this many seconds


class HistoryRecord(TypedDict):
    """One line of the training history (fit-summary.json): a training window, or a held-out score at an epoch end."""

    step: int
    epoch: int
    loss: NotRequired[float]
    acc_per_step: NotRequired[list[float]]
    tokens: NotRequired[int]
    train_tok_s: NotRequired[float]
    holdout_acc_per_step: NotRequired[list[float]]


class _Window(TypedDict):
    """The steps since the last history record: their losses and per-step accuracies."""

    loss: list[float]
    acc: list[list[float]]


class FitState(TypedDict):
    """Where a run is (checkpointed as "state"; a resume continues from it)."""

    epoch: int
    batch: int  # batches done in this epoch
    step: int
    history: list[HistoryRecord]
    tokens: int
    seconds: float


def load_checkpoint(path: Path, device: str) -> dict[str, Any]:
    """A checkpoint this module wrote; a damaged one is bad input naming the file, not a crash."""
    # heavy, optional (torch): imported only where it is used
    import torch

    hint = "delete it (or pass --no-resume) and run `speclock train fit` again"
    try:
        saved = torch.load(path, map_location=device, weights_only=False)
    except (
        pickle.UnpicklingError,
        EOFError,
        RuntimeError,
        ValueError,
        AttributeError,
        ImportError,
        KeyError,
        IndexError,
        TypeError,
        UnicodeDecodeError,
    ) as err:
        raise BadInput(
            f"{path}: not a readable checkpoint ({type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''})",
            hint=hint,
        ) from None
    except OSError as err:
        raise os_error(err, path, "read the checkpoint") from None
    if (
        not isinstance(saved, dict)
        or not all(k in saved for k in ("drafter", "fit_config", "vocab"))
        or not isinstance(saved["fit_config"], dict)
        or "draft_vocab_size" not in saved["fit_config"]
    ):
        raise BadInput(f"{path}: not a speclock checkpoint (keys drafter, fit_config, vocab)", hint=hint)
    return saved


def evaluate_holdout(drafter, target_head, data: dict[str, Any], ids: list[int], cfg: FitConfig, device: str) -> list[float]:
    """Teacher-forced TTT accuracy per step on held-out sequences (mean over their batches)."""
    # heavy, optional (torch): imported only where it is used
    import torch

    if not ids:
        return []
    sub = [data["spans"][i] for i in ids]
    batches = [[ids[j] for j in b] for b in batches_for_epoch(sub, cfg.max_len, cfg.batch_tokens, cfg.seed, 0)]
    per_step: list[list[float]] = [[] for _ in range(cfg.ttt_steps)]
    was_training = drafter.training
    drafter.eval()
    with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
        for b in batches:
            ids_t, lm, aux, fin, _ = collate(data, b, cfg.max_len, device)
            _, accs, _ = ttt_loss(drafter, target_head, ids_t, lm, aux, fin, cfg.ttt_steps)
            for i, a in enumerate(accs):
                per_step[i].append(a)
    drafter.train(was_training)
    return [round(sum(v) / len(v), 4) for v in per_step if v]


def _lr_at(step: int, progress: float, cfg: FitConfig) -> float:
    """Linear warm-up, then cosine to 10% over `progress` (0..1, by steps or by the time budget)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _settings(fit_config: dict[str, Any]) -> dict[str, Any]:
    """The fit settings that must match to resume (stop conditions may change between runs)."""
    return {k: v for k, v in fit_config.items() if k not in ("max_steps", "time_budget_s", "checkpoint_every", "fused_loss")}


def train_drafter(
    data: dict[str, Any], target, cfg: FitConfig, ckpt_dir: Path, device: str, log=print, resume: bool = True, dist=None
):
    """Train (or resume) an Eagle3Drafter on extracted hidden states; returns (drafter, summary).
    `dist` (speclock.train.distributed.DistContext): this process's share of a torchrun run."""
    # heavy, optional (torch): imported only where it is used
    import torch

    from speclock.drafter.eagle3 import DrafterConfig, Eagle3Drafter, count_parameters

    torch.manual_seed(cfg.seed)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if not dist or dist.is_main:
        clean_stale_temps(ckpt_dir)  # a checkpoint a killed run was writing
    ckpt = ckpt_dir / "checkpoint.pt"
    tcfg = target.config
    dcfg = DrafterConfig.from_target(tcfg, cfg.draft_vocab_size)
    drafter = Eagle3Drafter(dcfg).to(device)
    vocab, vocab_stats = build_draft_vocab(
        data["input_ids"].cpu(), data["loss_mask"].cpu(), tcfg.vocab_size, cfg.draft_vocab_size
    )
    drafter.set_vocab(vocab.to(device))
    head = target.get_output_embeddings().weight.detach()
    drafter.init_from_target(
        target.get_input_embeddings().weight.detach().to(device), head.to(device), target.model.norm.weight.detach().to(device)
    )
    if dist:
        drafter = dist.shard_drafter(drafter)
    use_amp = device.startswith("cuda")
    fused = "triton" if (cfg.fused_loss and use_amp and not dist) else None
    target_head = head.to(device, torch.bfloat16 if use_amp else torch.float32)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    train_ids, held_ids = split_holdout(len(data["spans"]), cfg.holdout_sequences, cfg.seed)
    train_spans = [data["spans"][i] for i in train_ids]
    epochs_batches = [
        [[train_ids[j] for j in b] for b in batches_for_epoch(train_spans, cfg.max_len, cfg.batch_tokens, cfg.seed, e)]
        for e in range(cfg.epochs)
    ]
    schedule_steps = sum(map(len, epochs_batches))  # the LR schedule ignores stop conditions, so resume = no stop
    total_steps = min(schedule_steps, cfg.max_steps) if cfg.max_steps else schedule_steps
    state: FitState = {"epoch": 0, "batch": 0, "step": 0, "history": [], "tokens": 0, "seconds": 0.0}
    if resume and ckpt.exists():
        saved = load_checkpoint(ckpt, device)
        if _settings(saved["fit_config"]) != _settings(asdict(cfg)) or saved["vocab"] != vocab.tolist():
            raise BadInput(
                f"{ckpt} was written with other settings or data", hint="use a fresh --work folder, or pass --no-resume"
            )
        if dist:
            dist.load_checkpoint(drafter, opt, saved)
        else:
            drafter.load_state_dict(saved["drafter"], strict=False)
            if saved.get("optimizer_keys") == "fqn":  # written by a torchrun run
                saved["optimizer"] = optimizer_state_by_position(saved["optimizer"], drafter)
            opt.load_state_dict(saved["optimizer"])
        state = saved["state"]
        log(f"fit: resumed at epoch {state['epoch']} batch {state['batch']} (step {state['step']})")
    log(
        f"fit: {count_parameters(drafter) / 1e6:.2f}M trainable parameters, draft vocab {cfg.draft_vocab_size} "
        f"(covers {vocab_stats['coverage_of_response_tokens']:.1%} of response tokens), {total_steps} steps, "
        f"{'bf16 autocast' if use_amp else 'float32'} on {device}{', fused Triton loss' if fused else ''}"
    )

    def save():
        if dist:
            return dist.save_checkpoint(drafter, opt, ckpt, {"state": state, "fit_config": asdict(cfg), "vocab": vocab.tolist()})
        with atomic_output(ckpt, binary=True) as fh:  # a kill mid-save leaves the previous checkpoint
            torch.save(
                {
                    "drafter": drafter.state_dict(),
                    "optimizer": opt.state_dict(),
                    "state": state,
                    "fit_config": asdict(cfg),
                    "vocab": vocab.tolist(),
                },
                fh,
            )

    probe = [b for e in epochs_batches[:1] for b in e[:4]]
    consistency = [
        data_consistency(*collate(data, b, cfg.max_len, device)[:2], collate(data, b, cfg.max_len, device)[3], target_head)
        for b in probe
    ]
    data_check = round(sum(consistency) / max(1, len(consistency)), 4)
    log(f"fit: data check: {data_check:.1%} of response tokens equal the target's greedy choice (first batches)")
    window: _Window = {"loss": [], "acc": []}
    t_last = t_start = time.perf_counter()
    stop = False

    def _elapsed():  # rank 0's clock in distributed runs: every rank must stop at the same step
        e = time.perf_counter() - t_start
        return dist.from_rank0(e) if dist else e

    while state["epoch"] < cfg.epochs and not stop:
        batches = epochs_batches[state["epoch"]]
        while state["batch"] < len(batches):
            if cfg.max_steps and state["step"] >= cfg.max_steps:
                stop = True
                break
            if cfg.time_budget_s and _elapsed() > cfg.time_budget_s:
                log(f"fit: time budget of {cfg.time_budget_s:.0f}s spent at step {state['step']}; stopping (checkpointed)")
                stop = True
                break
            if dist:
                ids, lm, aux, fin, ntok = dist.collate_local(collate, data, batches[state["batch"]], cfg.max_len, device)
            else:
                ids, lm, aux, fin, ntok = collate(data, batches[state["batch"]], cfg.max_len, device)
            for g in opt.param_groups:
                progress = state["step"] / max(1, schedule_steps)
                if cfg.time_budget_s:
                    progress = max(progress, _elapsed() / cfg.time_budget_s)
                g["lr"] = _lr_at(state["step"], progress, cfg)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=use_amp):
                loss, accs, losses = ttt_loss(
                    drafter,
                    target_head,
                    ids,
                    lm,
                    aux,
                    fin,
                    cfg.ttt_steps,
                    reduce_counts=dist.all_reduce_sum if dist else None,
                    fused=fused,
                )
            opt.zero_grad(set_to_none=True)
            (loss * dist.grad_scale if dist else loss).backward()
            if dist:
                loss, accs, losses = dist.global_metrics(loss, accs, losses, cfg.ttt_steps)
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
            opt.step()
            state["batch"] += 1
            state["step"] += 1
            state["tokens"] += ntok
            window["loss"].append(float(loss.detach()))
            window["acc"].append(accs)
            if state["step"] % 50 == 0 or state["step"] == total_steps:
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                now = time.perf_counter()
                state["seconds"] += now - t_last
                t_last = now
                acc_mean = [
                    round(sum(a[i] for a in window["acc"] if len(a) > i) / max(1, sum(1 for a in window["acc"] if len(a) > i)), 4)
                    for i in range(cfg.ttt_steps)
                ]
                rec: HistoryRecord = {
                    "step": state["step"],
                    "epoch": state["epoch"],
                    "loss": round(sum(window["loss"]) / len(window["loss"]), 4),
                    "acc_per_step": acc_mean,
                    "tokens": state["tokens"],
                    "train_tok_s": round(state["tokens"] / max(state["seconds"], 1e-9), 1),
                }
                state["history"].append(rec)
                log(
                    f"fit: step {rec['step']}/{total_steps} epoch {rec['epoch']} loss {rec['loss']} acc {acc_mean[:3]} "
                    f"{rec['train_tok_s']:.0f} tok/s"
                )
                window = {"loss": [], "acc": []}
            if state["step"] % cfg.checkpoint_every == 0:
                save()
        else:
            state["epoch"] += 1
            state["batch"] = 0
            if held_ids:
                held = evaluate_holdout(drafter, target_head, data, held_ids, cfg, device)
                state["history"].append({"step": state["step"], "epoch": state["epoch"], "holdout_acc_per_step": held})
                log(f"fit: epoch {state['epoch']} done; held-out accuracy per step {held[:3]}")
    if window["loss"]:
        acc_mean = [
            round(sum(a[i] for a in window["acc"] if len(a) > i) / max(1, sum(1 for a in window["acc"] if len(a) > i)), 4)
            for i in range(cfg.ttt_steps)
        ]
        state["history"].append(
            {
                "step": state["step"],
                "epoch": state["epoch"],
                "loss": round(sum(window["loss"]) / len(window["loss"]), 4),
                "acc_per_step": acc_mean,
                "tokens": state["tokens"],
            }
        )
    state["seconds"] += time.perf_counter() - t_last
    save()
    # Every rank scores the held-out set: under FSDP2 each forward is a collective.
    held_final = evaluate_holdout(drafter, target_head, data, held_ids, cfg, device) if held_ids else []
    if dist and not dist.is_main:
        return drafter, None
    if held_final:
        log(f"fit: held-out accuracy per step at the end {held_final[:3]}")
    train_hist = [h for h in state["history"] if "loss" in h]
    last = train_hist[-1] if train_hist else None
    summary = {
        "steps": state["step"],
        "epochs": cfg.epochs,
        "ttt_steps": cfg.ttt_steps,
        "lr": cfg.lr,
        "batch_tokens": cfg.batch_tokens,
        "tokens_seen": state["tokens"],
        "seconds": round(state["seconds"], 2),
        "train_tok_s": round(state["tokens"] / max(state["seconds"], 1e-9), 1),
        "final_loss": last.get("loss") if last else None,
        "final_acc_per_step": last.get("acc_per_step") if last else None,
        "precision": "bf16-autocast" if use_amp else "float32",
        "device": device,
        "vocab": vocab_stats,
        "data_greedy_consistency": data_check,
        "holdout": {"sequences": len(held_ids), "tokens": sum(data["spans"][i][1] for i in held_ids), "acc_per_step": held_final}
        if held_ids
        else None,
    }
    atomic_write_text(
        ckpt_dir / "fit-summary.json", json.dumps({"summary": summary, "history": state["history"]}, indent=1) + "\n"
    )
    return drafter, summary
