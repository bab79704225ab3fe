"""Smoke's numbers: one speculative run's metrics, throughput, per-seed spread and lossless check, as report sections."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from speclock.engines import SpecCounters
from speclock.verify import lossless
from speclock.verify.profiles import per_seed_summary
from speclock.verify.report_types import (
    BackendRun,
    Batch1,
    Concurrent,
    LosslessSection,
    Metrics,
    RunState,
    SampledSection,
    SeedMetrics,
    Throughput,
)
from speclock.verify.smoke.inputs import SmokeInputs, log

# One generation pass of an engine: (outputs per prompt, seconds, counters as a delta around the pass).
PassResult = tuple[list[list[int]], float, SpecCounters]


class Measured(TypedDict):
    """One speculative run's report sections (measure): the first backend's become the report's."""

    backend: str | None
    captured_layers: list[int] | None
    metrics: Metrics
    concurrent: Concurrent
    lossless: LosslessSection
    sampled: NotRequired[SampledSection]


def metrics_of(counters: SpecCounters) -> Metrics:
    """The report's `metrics` object of a run's counters (SpecCounters.metrics, key for key)."""
    m = counters.metrics()
    return {
        "num_drafts": m["num_drafts"],
        "num_draft_tokens": m["num_draft_tokens"],
        "num_accepted_tokens": m["num_accepted_tokens"],
        "accepted_per_position": m["accepted_per_position"],
        "acceptance_rate": m["acceptance_rate"],
        "mean_acceptance_length": m["mean_acceptance_length"],
        "acceptance_per_position": m["acceptance_per_position"],
    }


def measure(
    inp: SmokeInputs,
    backend: str | None,
    passes: list[dict[str, Any] | None],
    results: list[PassResult],
    captured: list[int] | None,
    plain: list[list[int]],
    plain_s: float,
    prompt_ids: list[list[int]],
    run: RunState,
) -> Measured:
    """One speculative run's report sections: counters pooled over its passes (seeds), per-seed spread, throughput,
    and lossless (greedy: token for token against the plain run; sampled: not checkable token by token)."""
    pooled = results[0][2]
    for _, _, delta in results[1:]:
        pooled = pooled + delta
    spec_tokens = sum(sum(map(len, outputs)) for outputs, _, _ in results)
    spec_s = sum(seconds for _, seconds, _ in results)
    base_tps, spec_tps = sum(map(len, plain)) / plain_s, spec_tokens / spec_s
    # all prompts at once (offline: one batch; a server: --concurrency in flight); the judged speedup is batch 1's
    requests = inp.concurrency if inp.server_url else len(prompt_ids)
    concurrent: Concurrent = {
        "requests": requests,
        "baseline_tok_s": round(base_tps, 2),
        "spec_tok_s": round(spec_tps, 2),
        "speedup": round(spec_tps / base_tps, 4),
        "baseline_s": round(plain_s, 3),
        "spec_s": round(spec_s, 3),
    }
    first_pass = passes[0]
    if first_pass is not None:  # sampled: counters per seed, their spread, and what losslessness can mean here
        seeds = list(inp.profile.seeds) if inp.profile else list(range(len(passes)))
        # one pass per seed (sampling_passes), one result per pass
        per_seed: list[SeedMetrics] = [
            {"seed": seed, **metrics_of(delta)} for seed, (_, _, delta) in zip(seeds, results, strict=True)
        ]
        sampled: SampledSection = {
            "temperature": first_pass["temperature"],
            "seeds": seeds,
            "per_request_seed": "seed" in first_pass,
            "per_seed": per_seed,
            "spread": per_seed_summary(per_seed),
        }
        sampled_lossless: LosslessSection = {
            "checked": 0,
            "mismatches": 0,
            "mode": "sampled",
            "note": "temperature > 0: two correct samplers draw different tokens, so outputs are not "
            "compared token for token; the greedy profiles prove the verification path lossless, "
            "and this profile's acceptance is gated two-sided against a sampled baseline (a "
            "rejection sampler that rejects too often drops it, one that accepts too much raises it)",
        }
        return {
            "backend": backend,
            "captured_layers": captured,
            "metrics": metrics_of(pooled),
            "concurrent": concurrent,
            "sampled": sampled,
            "lossless": sampled_lossless,
        }
    spec = results[0][0]
    judge: lossless.Judge | None = None
    if plain != spec:  # the float32 judge loads the target: only when something diverged
        run["stage"] = "lossless (judging divergences)"
        judge = lossless.float32_judge(inp.target, log=log)
    compared = lossless.compare(plain, spec, prompt_ids, judge)
    if compared["numeric_ties"]:
        log(
            f"lossless: {compared['numeric_ties']} prompt(s) part at numeric ties of the target "
            f"(float32 margin <= tie limit), {compared['mismatches']} real mismatch(es)"
        )
    return {
        "backend": backend,
        "captured_layers": captured,
        "metrics": metrics_of(pooled),
        "concurrent": concurrent,
        "lossless": compared,
    }


def backend_run(name: str, measured: Measured) -> BackendRun:
    """An `attention_backends` entry: the backend's name and its run's sections."""
    entry: BackendRun = {"backend": name, "metrics": measured["metrics"], "lossless": measured["lossless"]}
    if "sampled" in measured:
        entry["sampled"] = measured["sampled"]
    return entry


def throughput_section(batch1: Batch1 | None, concurrent: Concurrent) -> Throughput:
    """The report's throughput: the contract's keys hold the batch-1 figures (None when not measured)."""
    if batch1 is None:
        return {
            "baseline_tok_s": None,
            "spec_tok_s": None,
            "speedup": None,
            "measured_at": None,
            "batch1": None,
            "loaded": None,
            "concurrent": concurrent,
        }
    return {
        "baseline_tok_s": batch1["plain_tok_s_median"],
        "spec_tok_s": batch1["spec_tok_s_median"],
        "speedup": batch1["speedup"],
        "measured_at": "batch 1",
        "batch1": batch1,
        "loaded": None,  # replaced by the measurement when smoke.speed_concurrent asks for one
        "concurrent": concurrent,
    }
