"""Speed in the verdict: the batch-1 speedup smoke measures and how the gate judges it.

How smoke measures (the method of benchmarks/h200/spec_throughput.py): the first smoke.speed_prompts prompts,
one request at a time, smoke.speed_max_tokens new tokens each, smoke.speed_repeats times per engine, in three
engine runs: plain, drafted, plain again (on a GPU one engine fits at a time; the second plain run shows how
far the machine drifted while the drafted one ran). Each engine's figure is the median of its repeats.

    speedup      = drafted median / median of every plain run (before and after)
    interval     = [slowest drafted run / fastest plain run, fastest drafted run / slowest plain run]
                   (`interval_method = "runs"`: the spread of the plain AND the drafted runs; reports written before
                   2026-12-07 have no interval_method and were bracketed by the two plain medians only: "medians")
    spread       = (high - low) / speedup

Warm-up (docs/smoke.md, "Warm-up"): each engine runs its batch-1 workload until the last `repeats` runs agree within
WARMUP_TOLERANCE of their median, or until WARMUP_EXTRA runs more than `repeats` were made; only the last `repeats`
runs are kept, the earlier ones are reported as `*_warmup_tok_s`, and `steady` says per engine whether the window
settled. (On the H100 on 2026-12-07 the first engine's plain runs were 532-563 tok/s and the last engine's 767-793.)

The report's `throughput.speedup` is this batch-1 speedup (`throughput.measured_at = "batch 1"`); the pass over
all prompts at the engine's own concurrency is kept as `throughput.concurrent`. Batch 1 is where speculative
decoding pays (measured on an H100, vLLM 0.26.0: 1.18-1.28x at batch 1, 0.98x at 80 requests at once).

The gate: the interval against smoke.thresholds.min_speedup (all of it above: PASS; all below: FAIL; across:
WARN, with the spread: the run cannot tell), and the speedup's relative drop from the baseline's against
smoke.thresholds.max_speedup_drop (judged the same way over the interval).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from speclock.verify.checks import Check, warning
from speclock.verify.plausibility import Bad
from speclock.verify.report_dates import BATCH1_SINCE, predates  # the report's dates, shared with plausibility
from speclock.verify.report_types import Batch1, SmokeReport

CPU_NOTE = (
    "measured on a CPU: with many requests at once verifying k + 1 tokens per step costs a CPU nearly k + 1 "
    "decode steps, so the concurrent speedup (throughput.concurrent) below 1 is expected there; one request at "
    "a time drafting pays on a CPU too (cpu-vllm: 1.1-1.5x measured, docs/smoke.md), with a wide spread on a busy "
    "machine; min_speedup judges batch 1 only"
)


def tok_s(runs: Sequence[tuple[float, float]]) -> list[float]:
    return [round(tokens / seconds, 2) if seconds > 0 else 0.0 for tokens, seconds in runs]


# The warm-up rule (docs/smoke.md): runs agree within 5% of their median, at most 4 runs more than the kept ones.
WARMUP_TOLERANCE = 0.05
WARMUP_EXTRA = 4
INTERVAL_METHODS = ("runs", "medians")


def steady(values: Sequence[float], window: int, tolerance: float = WARMUP_TOLERANCE) -> bool:
    """The last `window` tok/s figures agree: (max - min) / median <= tolerance."""
    if window < 1 or len(values) < window:
        return False
    last = list(values)[-window:]
    mid = statistics.median(last)
    return mid > 0 and (max(last) - min(last)) / mid <= tolerance


_Run = TypeVar("_Run", bound=tuple[float, float])  # one run: (tokens, seconds)


def warm_runs(
    run_once: Callable[[], _Run], repeats: int, extra: int = WARMUP_EXTRA, tolerance: float = WARMUP_TOLERANCE
) -> tuple[list[_Run], list[_Run], bool]:
    """Call run_once() -> (tokens, seconds) until the last `repeats` runs are steady or `repeats + extra` runs were
    made. Returns (kept runs: the last `repeats`, warm-up runs before them, steady)."""
    runs: list[_Run] = []
    while True:
        runs.append(run_once())
        done = steady(tok_s(runs), repeats, tolerance)
        if done or len(runs) >= repeats + extra:
            return runs[-repeats:], runs[:-repeats], done


def _bounds(b: list[float], s: list[float], a: list[float], method: str) -> tuple[float, float, float]:
    plain = statistics.median(b + a)
    spec_med = statistics.median(s)
    speedup = spec_med / plain if plain else 0.0
    if method == "runs":  # every pairing of a drafted run with a plain run lies inside
        bounds = [min(s) / max(b + a), max(s) / min(b + a), speedup] if min(b + a) > 0 else [0.0, speedup]
    else:  # "medians": reports written before 2026-12-07
        bounds = [spec_med / x if x else 0.0 for x in (statistics.median(b), statistics.median(a))] + [speedup]
    return speedup, min(bounds), max(bounds)


def summarize_batch1(
    before: Sequence[tuple[float, float]],
    spec: Sequence[tuple[float, float]],
    after: Sequence[tuple[float, float]],
    *,
    prompts: int,
    max_tokens: int,
    warmup: Sequence[Sequence[tuple[float, float]]] | None = None,
    steady_runs: Sequence[bool] | None = None,
    method: str = "runs",
) -> Batch1:
    """The report's `throughput.batch1` from (tokens, seconds) per repeat of each engine run; `warmup`: the runs
    each engine (plain, drafted, plain again) made before its kept ones, `steady_runs`: whether each settled."""
    b, s, a = tok_s(before), tok_s(spec), tok_s(after)
    speedup, low, high = _bounds(b, s, a, method)
    out: Batch1 = {
        "prompts": prompts,
        "max_tokens": max_tokens,
        "repeats": len(s),
        "plain_before_tok_s": b,
        "spec_tok_s": s,
        "plain_after_tok_s": a,
        "plain_tok_s_median": round(statistics.median(b + a), 2),
        "spec_tok_s_median": round(statistics.median(s), 2),
        "speedup": round(speedup, 4),
        "speedup_low": round(low, 4),
        "speedup_high": round(high, 4),
        "spread": round((high - low) / speedup, 4) if speedup else None,
        "interval_method": method,
    }
    if warmup is not None:
        wb, ws, wa = (tok_s(w) for w in warmup)
        out["warmup_tok_s"] = {"plain_before": wb, "spec": ws, "plain_after": wa}
        out["steady"] = {k: bool(v) for k, v in zip(("plain_before", "spec", "plain_after"), steady_runs or (), strict=False)}
    return out


_BATCH1_KEYS: dict[str, tuple[type, ...]] = {
    "prompts": (int,),
    "max_tokens": (int,),
    "repeats": (int,),
    "plain_before_tok_s": (list,),
    "spec_tok_s": (list,),
    "plain_after_tok_s": (list,),
    "speedup": (int, float),
    "speedup_low": (int, float),
    "speedup_high": (int, float),
    "spread": (int, float, type(None)),
    "plain_tok_s_median": (int, float),  # printed with the verdict (interval_text)
    "spec_tok_s_median": (int, float),
}


def check_batch1(data: SmokeReport, bad: Bad) -> None:
    """The batch-1 speed figures are the ones its own runs give (speclock.verify.speed.summarize_batch1), and the
    top-level speedup is that one: an edited interval or speedup cannot turn a FAIL or WARN into a PASS. The same
    for the loaded figures (throughput.loaded)."""
    tp = data["throughput"]
    b1: Mapping[str, Any] | None = tp.get("batch1")  # read as untrusted: each key's type is checked here
    if not isinstance(b1, dict):
        if tp.get("measured_at") == "batch 1":
            raise bad("throughput.batch1", "missing, but throughput.measured_at says 'batch 1'")
    else:
        _check_runs(b1, "throughput.batch1", bad)
        if tp.get("measured_at") == "batch 1" and (
            tp["speedup"] is None or not math.isclose(tp["speedup"], b1["speedup"], rel_tol=1e-9, abs_tol=5e-4)
        ):
            raise bad("throughput.speedup", f"{tp['speedup']} differs from throughput.batch1.speedup {b1['speedup']}")
    loaded: Mapping[str, Any] | None = tp.get("loaded")
    if isinstance(loaded, dict):
        _check_runs(loaded, "throughput.loaded", bad)
        if loaded.get("requests") != loaded.get("prompts"):
            raise bad("throughput.loaded.requests", f"{repr(loaded.get('requests'))[:20]} differs from its prompts")


def _check_runs(b1: Mapping[str, Any], where: str, bad: Bad) -> None:
    for key, kinds in _BATCH1_KEYS.items():  # shape first: a fuzzed or edited section is bad input, never a crash
        value = b1.get(key)
        if not isinstance(value, kinds) or isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
            raise bad(f"{where}.{key}", f"expected {' or '.join(k.__name__ for k in kinds)}, got {repr(value)[:40]}")
    if b1["repeats"] < 1 or b1["prompts"] < 1 or b1["max_tokens"] < 1:
        raise bad(f"{where}.repeats", "repeats, prompts and max_tokens must be at least 1")
    runs: dict[str, list[tuple[float, float]]] = {}
    for key in ("plain_before_tok_s", "spec_tok_s", "plain_after_tok_s"):
        values = b1[key]
        if (
            not values
            or len(values) != b1["repeats"]
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)
        ):
            raise bad(
                f"{where}.{key}",
                f"expected {b1['repeats']} ({where}.repeats) positive tok/s, got {repr(values)[:80]}",
            )
        runs[key] = [(v, 1.0) for v in values]
    method = b1.get("interval_method", "medians")  # absent: a report written before the method was named
    if method not in INTERVAL_METHODS:
        raise bad(f"{where}.interval_method", f"expected one of {', '.join(INTERVAL_METHODS)}, got {repr(method)[:40]}")
    want: Mapping[str, Any] = summarize_batch1(
        runs["plain_before_tok_s"],
        runs["spec_tok_s"],
        runs["plain_after_tok_s"],
        prompts=b1["prompts"],
        max_tokens=b1["max_tokens"],
        method=method,
    )
    for key in ("speedup", "speedup_low", "speedup_high", "spread", "plain_tok_s_median", "spec_tok_s_median"):
        got = b1.get(key)  # spread may be null, never missing: a missing one is refused like a wrong one
        if want[key] is not None and (got is None or not math.isclose(got, want[key], rel_tol=1e-3, abs_tol=5e-4)):
            raise bad(f"{where}.{key}", f"{repr(got)[:40]} is not what the runs give ({want[key]}; speclock.verify.speed)")


def batch1_of(report: SmokeReport) -> Batch1 | None:
    """The report's batch-1 measurement, or None (not measured: speed_repeats 0, or a report from before)."""
    tp = report.get("throughput")
    b1 = tp.get("batch1") if tp else None
    return b1 if isinstance(b1, dict) and b1.get("speedup") is not None else None


def interval_text(b1: Batch1) -> str:
    return (
        f"{b1['speedup']:.3f} (interval {b1['speedup_low']:.3f}-{b1['speedup_high']:.3f}, spread "
        f"{b1['spread'] or 0:.1%}, plain {b1['plain_tok_s_median']} -> spec {b1['spec_tok_s_median']} tok/s, "
        f"{b1['prompts']} prompts x {b1['max_tokens']} tokens x {b1['repeats']} repeats)"
    )


def judge_floor(name: str, b1: Batch1, floor: float, key: str, what: str, below: str, straddle: str = "") -> Check:
    """A speedup's interval against the floor smoke.thresholds.<key>: all of it at or above PASS, all below FAIL
    (`below` says what that means), across it WARN (the run cannot tell; `straddle` says what to do)."""
    limit = f">= {floor} (smoke.thresholds.{key})"
    if b1["speedup_low"] >= floor:
        return Check(name, True, b1["speedup"], limit, "speed")
    if b1["speedup_high"] < floor:
        return Check(name, False, b1["speedup"], limit, "speed", f"{what} is below smoke.thresholds.{key} {floor}: {below}")
    tail = f" {straddle}" if straddle else ""
    return warning(
        name,
        b1["speedup"],
        limit,
        "speed",
        f"{what} straddles smoke.thresholds.{key} {floor}: the spread is too wide to judge{tail}",
    )


def speed_checks(
    report: SmokeReport, thresholds: dict[str, Any], baseline: SmokeReport | None, baseline_source: str = "the baseline"
) -> list[Check]:
    """The batch-1 speedup against smoke.thresholds.min_speedup, and against the baseline's (max_speedup_drop)."""
    checks: list[Check] = []
    b1 = batch1_of(report)
    floor = thresholds.get("min_speedup", 0.0)
    name = "speedup at batch 1 (spec / plain tok/s)"
    if floor:
        limit = f">= {floor} (smoke.thresholds.min_speedup)"
        if b1 is None and predates(report, BATCH1_SINCE) and "batch1" not in (report.get("throughput") or {}):
            checks.append(
                warning(
                    name,
                    None,
                    limit,
                    "speed",
                    f"not measured: the report was created ({report.get('created')}) before smoke measured speed at "
                    f"batch 1 ({BATCH1_SINCE}); it cannot show whether the drafter pays",
                )
            )
        elif b1 is None:
            checks.append(
                Check(
                    name,
                    False,
                    None,
                    limit,
                    "speed",
                    "not measured (the report has no throughput.batch1: smoke ran with smoke.speed_repeats = 0 "
                    "or --speed-repeats 0, or before speclock measured speed); smoke.thresholds.min_speedup "
                    f"asks for >= {floor}: run `speclock smoke` with speed_repeats >= 1",
                )
            )
        else:
            checks.append(
                judge_floor(
                    name,
                    b1,
                    floor,
                    "min_speedup",
                    interval_text(b1),
                    "the drafter does not pay for itself at batch 1",
                    "(a busy machine?); run smoke again on a quiet one, or with more smoke.speed_repeats / speed_prompts",
                )
            )
    limit_drop = thresholds.get("max_speedup_drop", 0.0)
    if baseline is None or not limit_drop or b1 is None:
        return checks
    name = "speedup at batch 1 vs baseline"
    limit = f"<= {limit_drop} relative drop (smoke.thresholds.max_speedup_drop)"
    base = batch1_of(baseline)
    if base is None:
        checks.append(
            warning(
                name,
                None,
                limit,
                "regression",
                f"no speed baseline: {baseline_source} has no throughput.batch1 (recorded before smoke "
                "measured speed at batch 1); record a new baseline to compare speed",
            )
        )
        return checks
    unlike = [
        f"{key} {theirs} vs {mine}"
        for key, theirs, mine in (
            ("prompts", base.get("prompts"), b1.get("prompts")),
            ("max_tokens", base.get("max_tokens"), b1.get("max_tokens")),
        )
        if theirs != mine
    ]
    gpu_now, gpu_then = (report.get("gpu") or {}).get("name"), (baseline.get("gpu") or {}).get("name")
    if gpu_now != gpu_then:
        unlike.append(f"GPU {gpu_then or 'none'} vs {gpu_now or 'none'}")
    if unlike:
        checks.append(
            warning(
                name,
                None,
                limit,
                "regression",
                f"no comparable speed baseline: {baseline_source} measured speed otherwise "
                f"({'; '.join(unlike)}); record a baseline with this run's settings",
            )
        )
        return checks
    ref = base["speedup"]
    drop = (ref - b1["speedup"]) / ref if ref else 0.0
    drop_low = (ref - b1["speedup_high"]) / ref if ref else 0.0
    drop_high = (ref - b1["speedup_low"]) / ref if ref else 0.0
    what = f"{interval_text(b1)} vs baseline {ref:.3f}: dropped {drop:.1%}"
    if drop_high <= limit_drop:
        checks.append(Check(name, True, round(drop, 4), limit, "regression"))
    elif drop_low > limit_drop:
        checks.append(
            Check(
                name,
                False,
                round(drop, 4),
                limit,
                "regression",
                f"{what}, beyond smoke.thresholds.max_speedup_drop {limit_drop:.0%}",
            )
        )
    else:
        checks.append(
            warning(
                name,
                round(drop, 4),
                limit,
                "regression",
                f"{what}; over the interval the drop is {drop_low:.1%}-{drop_high:.1%}, across "
                f"smoke.thresholds.max_speedup_drop {limit_drop:.0%}: the spread is too wide to judge",
            )
        )
    return checks
