"""Speed under load in the verdict (docs/smoke.md, "Under load"): smoke.speed_concurrent requests at once, in runs of
at least MIN_LOADED_RUN_S per engine, summarised as batch 1 is (speclock.verify.speed) into `throughput.loaded`, and
judged against smoke.thresholds.min_concurrent_speedup over its interval."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from speclock.verify.checks import Check, warning
from speclock.verify.report_dates import LOADED_SINCE, predates
from speclock.verify.report_types import Loaded, SmokeReport
from speclock.verify.speed import interval_text, judge_floor, summarize_batch1

# A loaded run lasts at least this long (the batch repeats until it has): on an H100 80 requests x 128 tokens take
# 0.26-0.5 s, too short to time (2026-12-07); on a CPU one batch is already longer.
MIN_LOADED_RUN_S = 3.0


def loaded_runs(run_batch: Callable[[], tuple[int, float]], min_seconds: float = MIN_LOADED_RUN_S) -> tuple[int, float, int]:
    """A run of the loaded measurement: run_batch() -> (tokens, seconds) of one batch of requests at once, repeated
    until `min_seconds` have passed; (tokens, seconds, batches) of the whole run."""
    tokens, seconds, batches = 0, 0.0, 0
    while seconds < min_seconds or batches == 0:
        t, s = run_batch()
        tokens, seconds, batches = tokens + t, seconds + s, batches + 1
    return tokens, seconds, batches


def summarize_loaded(
    before: Sequence[tuple[float, float]],
    spec: Sequence[tuple[float, float]],
    after: Sequence[tuple[float, float]],
    *,
    requests: int,
    max_tokens: int,
    batches: int,
    warmup: Sequence[Sequence[tuple[float, float]]] | None = None,
    steady_runs: Sequence[bool] | None = None,
) -> Loaded:
    """The report's `throughput.loaded`: `requests` at once, the figures as batch 1's (summarize_batch1)."""
    b1 = summarize_batch1(before, spec, after, prompts=requests, max_tokens=max_tokens, warmup=warmup, steady_runs=steady_runs)
    out: Loaded = {**b1, "requests": requests, "batches_per_run_min": batches}
    return out


def loaded_of(report: SmokeReport) -> Loaded | None:
    """The report's speed under load (throughput.loaded), or None (smoke.speed_concurrent 0, or a report from before)."""
    tp = report.get("throughput")
    loaded = tp.get("loaded") if tp else None
    return loaded if isinstance(loaded, dict) and loaded.get("speedup") is not None else None


def loaded_checks(report: SmokeReport, thresholds: dict[str, Any]) -> list[Check]:
    """The speedup with smoke.speed_concurrent requests at once against smoke.thresholds.min_concurrent_speedup, over
    its interval as min_speedup is judged at batch 1 (PASS / FAIL / WARN across it)."""
    floor = thresholds.get("min_concurrent_speedup", 0.0)
    if not floor:
        return []
    loaded = loaded_of(report)
    limit = f">= {floor} (smoke.thresholds.min_concurrent_speedup)"
    if loaded is None and predates(report, LOADED_SINCE) and "loaded" not in (report.get("throughput") or {}):
        return [
            warning(
                "speedup under load (spec / plain tok/s)",
                None,
                limit,
                "speed",
                f"not measured: the report was created ({report.get('created')}) before smoke measured speed under "
                f"load ({LOADED_SINCE}); it cannot show whether the drafter pays under load",
            )
        ]
    if loaded is None:
        return [
            Check(
                "speedup under load (spec / plain tok/s)",
                False,
                None,
                limit,
                "speed",
                "not measured (the report has no throughput.loaded: smoke ran with smoke.speed_concurrent = 0, or "
                f"speed_repeats = 0); smoke.thresholds.min_concurrent_speedup asks for >= {floor}: set "
                "smoke.speed_concurrent (or --speed-concurrent) to the load to judge",
            )
        ]
    name = f"speedup with {loaded['requests']} requests at once (spec / plain tok/s)"
    what = interval_text(loaded).replace(f"{loaded['prompts']} prompts x", f"{loaded['requests']} at once x")
    below = (
        "under this load the drafter costs throughput (engine.k_per_batch_size can draft less, or nothing, at large batch sizes)"
    )
    return [judge_floor(name, loaded, floor, "min_concurrent_speedup", what, below)]
