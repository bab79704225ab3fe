"""The reference stage: judge an exported drafter with speclock's reference decoder (spread over
processes), record the result in its manifest, and measure batch-1 speed with and without it."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any, TypedDict

from speclock.core.threads import cpu_threads
from speclock.drafter.counters import SpecCounters
from speclock.drafter.manifest import (
    ReferenceKey,
    check_manifest_matches_target,
    drafter_sha256,
    load_drafter,
    record_reference,
    reference_key,
)
from speclock.drafter.models import read_drafter_manifest, target_sha256
from speclock.drafter.reference import load_target, run_baseline, run_reference
from speclock.spec.prompts import chat_prompt_ids, load_prompts, require_chat_template
from speclock.train.settings import log


class ReferenceResult(TypedDict):
    """One max_tokens setting's result (what record_reference writes into the manifest, and the run's facts)."""

    key: ReferenceKey
    metrics: dict[str, Any]
    run: dict[str, Any]


def _reference_worker(job: dict[str, Any]) -> dict[str, Any]:
    """One process's share of a reference run (prompts job['ids']); spawn-safe."""
    # heavy, optional (torch): imported only where it is used
    import torch

    torch.set_num_threads(job.get("threads", 1))
    model, tok = load_target(job["target_dir"], job["device"], job["dtype"])
    drafter, manifest = load_drafter(job["drafter_dir"], model, job["device"])
    every = max(1, len(job["ids"]) // 8)

    def progress(done: int, total: int, m: dict) -> None:
        if done % every == 0 or done == total:
            log(
                f"reference worker {job.get('worker', 0)}: {done}/{total} prompts, "
                f"mean acceptance length so far {m['mean_acceptance_length']:.3f}"
            )

    run = run_reference(
        model, tok, drafter, manifest["aux_layers_after"], job["ids"], job["k"], job["max_tokens"], progress=progress
    )
    return {
        "metrics": run.metrics,
        "outputs": run.outputs,
        "tokens": run.tokens,
        "seconds": run.seconds,
        "device": run.device,
        "dtype": run.dtype,
    }


def _merge_counters(parts: list[dict[str, Any]], k: int) -> dict[str, Any]:
    total = SpecCounters(k=k)
    for p in parts:
        total = total + SpecCounters.from_metrics(p["metrics"])
    return total.reference_metrics()


def stage_reference(
    target_dir: Path,
    drafter_dir: Path,
    device: str,
    n_prompts: int,
    k: int,
    max_tokens_list: list[int],
    record: bool,
    prompts_file: str | None = None,
    dtype: str | None = None,
    workers: int = 1,
    also_record_in: list[Path] | None = None,
) -> list[ReferenceResult]:
    """Run the reference decoder on MT-Bench (or a prompt file); optionally record into the manifest(s).

    With workers > 1 the prompts are split over that many processes (batch 1 each; the counters
    are sums over prompts, so the merged result equals a single-process run)."""
    # heavy, optional (transformers): imported only where it is used
    from transformers import AutoConfig, AutoTokenizer

    manifest = read_drafter_manifest(drafter_dir, required=True, strict_schema=True)
    check_manifest_matches_target(manifest, target_dir, AutoConfig.from_pretrained(target_dir))
    tok = AutoTokenizer.from_pretrained(target_dir)
    require_chat_template(tok, f"the target {target_dir}")
    texts = load_prompts(prompts_file, n_prompts)
    ids = [chat_prompt_ids(tok, t) for t in texts]
    tsha, dsha = target_sha256(target_dir), drafter_sha256(drafter_dir)
    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    results: list[ReferenceResult] = []
    for mt in max_tokens_list:
        log(f"reference: {len(ids)} prompts, k={k}, max_tokens={mt}, {device} {dtype}, {workers} worker(s)")
        jobs: list[dict[str, Any]] = [
            {
                "target_dir": str(target_dir),
                "drafter_dir": str(drafter_dir),
                "device": device,
                "dtype": dtype,
                "ids": ids[w::workers],
                "k": k,
                "max_tokens": mt,
                "worker": w,
            }
            for w in range(workers)
        ]
        jobs = [j for j in jobs if j["ids"]]
        for j in jobs:  # the CPU's threads (or OMP_NUM_THREADS) shared among the workers (one worker keeps them all)
            j["threads"] = max(1, cpu_threads() // len(jobs))
        if len(jobs) == 1:
            parts = [_reference_worker(jobs[0])]
        else:
            with mp.get_context("spawn").Pool(len(jobs)) as pool:
                parts = pool.map(_reference_worker, jobs)
        metrics = _merge_counters(parts, k)
        tokens = sum(p["tokens"] for p in parts)
        res: ReferenceResult = {
            "key": reference_key(tsha, dsha, texts, k, mt),
            "metrics": metrics,
            "run": {
                "device": parts[0]["device"],
                "dtype": parts[0]["dtype"],
                "workers": len(jobs),
                "tokens": tokens,
                "seconds_max_worker": round(max(p["seconds"] for p in parts), 2),
            },
        }
        if record:
            for folder in [drafter_dir] + list(also_record_in or []):
                if (Path(folder) / "speclock-manifest.json").exists():
                    record_reference(folder, res["key"], metrics, {"run": res["run"]})
        log(
            f"reference: max_tokens={mt}: mean acceptance length {metrics['mean_acceptance_length']:.3f}, "
            f"per position {[round(x, 3) for x in metrics['per_position_rate']]}"
        )
        results.append(res)
    return results


def measure_speed(
    target_dir: Path,
    drafter_dir: Path,
    device: str,
    n_prompts: int,
    k: int,
    max_tokens: int,
    dtype: str | None = None,
    prompts_file: str | None = None,
) -> dict[str, Any]:
    """Batch-1 tokens/s of the reference decoder with and without the drafter, on the same prompts."""
    model, tok = load_target(target_dir, device, dtype)
    drafter, manifest = load_drafter(drafter_dir, model, device)
    ids = [chat_prompt_ids(tok, t) for t in load_prompts(prompts_file, n_prompts)]
    run_reference(model, tok, drafter, manifest["aux_layers_after"], ids[:1], k, 8)  # warm-up
    spec = run_reference(model, tok, drafter, manifest["aux_layers_after"], ids, k, max_tokens)
    outs, secs = run_baseline(model, tok, ids, max_tokens)
    base_tok = sum(map(len, outs))
    res = {
        "prompts": n_prompts,
        "k": k,
        "max_tokens": max_tokens,
        "device": spec.device,
        "dtype": spec.dtype,
        "spec_tokens": spec.tokens,
        "spec_seconds": round(spec.seconds, 2),
        "spec_tok_s": round(spec.tokens / spec.seconds, 2),
        "baseline_tokens": base_tok,
        "baseline_seconds": round(secs, 2),
        "baseline_tok_s": round(base_tok / secs, 2),
        "speedup": round((spec.tokens / spec.seconds) / (base_tok / secs), 3),
        "mismatched_prompts": sum(1 for a, b in zip(outs, spec.outputs, strict=True) if a != b),  # one output per prompt each
        "mean_acceptance_length": spec.metrics["mean_acceptance_length"],
    }
    log(
        f"speed: spec {res['spec_tok_s']} tok/s, baseline {res['baseline_tok_s']} tok/s, speedup {res['speedup']}x, "
        f"{res['mismatched_prompts']} mismatched prompts"
    )
    return res
