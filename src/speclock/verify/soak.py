"""`speclock soak`: the smoke test's drafted run, repeated on ONE engine instance for N minutes.

Acceptance has been reported to decay over hours of serving in some engine versions (state that
builds up in a long-lived engine: caches, drafter state, counters). A fresh smoke run cannot see
that, so the soak keeps one engine up and measures acceptance window by window (each window =
the smoke prompts once, counters as deltas around it), then gates on drift: the worst window's
mean acceptance length may be at most `--max-drift` (relative) below the first window's. It
also compares each window's greedy outputs with the first window's: batches take other shapes from
window to window, so bf16 near-ties of the target may flip (speclock.verify.lossless); each divergence is
judged by the target in float32 after the engine stops, and a real mismatch (a token the target
clearly does not prefer) fails the soak.

Writes soak.json (windows, drift, verdict) and soak.md to --out. Exit 0 pass, 1 drift over the
limit (or the engine failed), 2 bad input, 3 engine missing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Final

from speclock.core.args import positive_float, positive_int
from speclock.core.errors import BadInput
from speclock.core.files import atomic_write_text, os_error
from speclock.engines import EngineConfig, get_engine, package_version, running, visible_arch
from speclock.spec.prompts import chat_prompt_ids, load_prompts
from speclock.verify import lossless
from speclock.verify.report_types import SOAK_SCHEMA_ID, SoakDoc, SoakDrift, SoakWindow
from speclock.verify.smoke.inputs import SmokeInputs, SmokeOptions, add_smoke_arguments, resolve_inputs

SOAK_SCHEMA: Final = SOAK_SCHEMA_ID


DEFAULT_MAX_DRIFT = 0.05  # relative drop of mean acceptance length from the first window


def drift_limit(text: str) -> float:
    """--max-drift: a relative drop in [0, 1) (argparse type: a bad one is exit 2 at parse time)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not allowed: give a relative drop from 0 up to (not including) 1")
    return value


def _log(msg: str) -> None:
    print(f"soak: {msg}", file=sys.stderr, flush=True)


def drift_of(windows: list[SoakWindow]) -> SoakDrift:
    """Relative drop of mean acceptance length from the first window to the worst and to the last one."""
    if len(windows) < 2:
        return {"worst_drop": 0.0, "last_drop": 0.0, "worst_window": 0}
    first = windows[0]["mean_acceptance_length"]
    drops = [(first - w["mean_acceptance_length"]) / first if first else 0.0 for w in windows]
    worst = max(range(1, len(windows)), key=lambda i: drops[i])
    return {"worst_drop": round(drops[worst], 5), "last_drop": round(drops[-1], 5), "worst_window": worst}


def judge(windows: list[SoakWindow], max_drift: float, *, min_windows: int = 2) -> tuple[bool, list[str]]:
    failures = []
    if len(windows) < min_windows:
        failures.append(f"only {len(windows)} window(s) ran; a drift needs at least {min_windows} (raise --minutes)")
    bad = [i + 1 for i, w in enumerate(windows) if w.get("mismatches")]
    if bad:
        failures.append(
            f"greedy outputs changed beyond numeric ties in window(s) {bad} (same prompts, same engine): "
            f"state that builds up in the engine changes what it generates; see first_mismatches in soak.json"
        )
    d = drift_of(windows)
    if d["worst_drop"] > max_drift:
        w = windows[d["worst_window"]]
        failures.append(
            f"acceptance drifted: window {d['worst_window'] + 1} (at {w['t_start_s']:.0f} s) has mean acceptance "
            f"length {w['mean_acceptance_length']:.3f} vs {windows[0]['mean_acceptance_length']:.3f} in the "
            f"first window: {d['worst_drop']:.1%} lower (limit {max_drift:.0%})"
        )
    return not failures, failures


def markdown(doc: SoakDoc) -> str:
    lines = [
        f"### speclock soak: {doc['verdict'].upper()}: {doc['stack']} on {doc['engine']} "
        f"({len(doc['windows'])} windows in {doc['seconds']:.0f} s)",
        "",
        f"drift of mean acceptance length: worst {doc['drift']['worst_drop']:.1%}, last {doc['drift']['last_drop']:.1%} "
        f"(limit {doc['max_drift']:.0%}); outputs identical to the first window: "
        f"{sum(w['outputs_same'] for w in doc['windows'])}/{len(doc['windows'])}; prompts parting at numeric ties / "
        f"real mismatches: {sum(w.get('numeric_ties', 0) for w in doc['windows'])} / "
        f"{sum(w.get('mismatches', 0) for w in doc['windows'])}",
        "",
        "| window | start s | mean acc. length | acceptance rate | per position | tok/s | outputs same | ties / mismatches |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, w in enumerate(doc["windows"]):
        pos = ", ".join(f"{r:.3f}" for r in w["per_position"])
        lines.append(
            f"| {i + 1} | {w['t_start_s']:.0f} | {w['mean_acceptance_length']:.3f} | {w['acceptance_rate']:.3f} "
            f"| {pos} | {w['tok_s']:.1f} | {'yes' if w['outputs_same'] else 'NO'} "
            f"| {w.get('numeric_ties', 0)} / {w.get('mismatches', 0)} |"
        )
    if doc["failures"]:
        lines += ["", "Failures:"] + [f"- {f}" for f in doc["failures"]]
    return "\n".join(lines) + "\n"


def _judge_divergences(
    inp: SmokeInputs,
    windows: list[SoakWindow],
    first: list[list[int]] | None,
    differing: dict[int, list[list[int]]],
    prompt_ids: list[list[int]],
) -> None:
    """Each window's `numeric_ties` and `mismatches` against the first window (speclock.verify.lossless)."""
    judge_fn = lossless.float32_judge(inp.target, log=_log) if differing else None
    for i, w in enumerate(windows):
        # a window differs only from a first window's outputs, so `first` is there whenever one does
        c = lossless.compare(first, differing[i], prompt_ids, judge_fn) if first is not None and i in differing else None
        w["numeric_ties"], w["mismatches"] = (c["numeric_ties"], c["mismatches"]) if c else (0, 0)
        if c and c["first_mismatches"]:
            w["first_mismatches"] = c["first_mismatches"]


def soak_engine_config(inp: SmokeInputs, arch: str | None = None) -> EngineConfig:
    """The drafted engine as smoke starts it: the GPU arch's settings (gpu.arch_settings) and engine.env."""
    arch = visible_arch(inp.stack) if arch is None else arch
    env = inp.stack.engine_env
    return EngineConfig(
        inp.target,
        inp.draft,
        inp.k,
        inp.stack.engine_settings_for(arch),
        inp.server_url,
        env,
        concurrency=inp.concurrency,
        k_per_batch_size=inp.stack.k_per_batch_size,
    )


def run_soak(inp: SmokeInputs, minutes: float, max_drift: float, *, max_windows: int | None = None) -> SoakDoc:
    """Start the engine with the drafter once; run windows until `minutes` have passed (at least two)."""
    # heavy, optional (transformers): imported only where it is used
    from transformers import AutoTokenizer

    texts = load_prompts(inp.prompts_file)[: inp.num_prompts]  # all of them when the file holds fewer (as smoke)
    tokenizer = AutoTokenizer.from_pretrained(str(inp.target))
    prompt_ids = [chat_prompt_ids(tokenizer, t) for t in texts]
    engine = get_engine(inp.stack.engine["name"])
    config = soak_engine_config(inp)
    t0 = time.perf_counter()
    windows: list[SoakWindow] = []
    differing: dict[int, list[list[int]]] = {}  # window index -> outputs that differ from the first window's
    started = time.perf_counter()
    # `running` stops the engine on every exit; on Ctrl-C it kills what the engine started within ~2 s.
    with running(engine, config) as session:
        _log(
            f"{engine.NAME} with drafter ready in {time.perf_counter() - t0:.1f} s; soaking for {minutes} min "
            f"({len(prompt_ids)} prompts x {inp.max_tokens} tokens per window)"
        )
        started = time.perf_counter()
        error, first_outputs = _soak_windows(session, inp, prompt_ids, minutes, max_windows, windows, differing, started)
    _judge_divergences(inp, windows, first_outputs, differing, prompt_ids)
    ok, failures = judge(windows, max_drift)
    if error:
        ok, failures = False, [f"the engine failed after {len(windows)} window(s): {error}"] + failures
    return {
        "schema": SOAK_SCHEMA,
        "stack": inp.stack.name,
        "engine": f"{inp.stack.engine['package']} {package_version(inp.stack.engine['package']) or '?'}",
        "minutes": minutes,
        "max_drift": max_drift,
        "seconds": round(time.perf_counter() - started, 1),
        "prompts": len(prompt_ids),
        "max_tokens": inp.max_tokens,
        "num_speculative_tokens": inp.k,
        "windows": windows,
        "drift": drift_of(windows),
        "verdict": "pass" if ok else "fail",
        "failures": failures,
    }


def _soak_windows(
    session: Any,
    inp: SmokeInputs,
    prompt_ids: list[list[int]],
    minutes: float,
    max_windows: int | None,
    windows: list[SoakWindow],
    differing: dict[int, list[list[int]]],
    started: float,
) -> tuple[str | None, list[list[int]] | None]:
    """Generate window after window into `windows`; returns (the engine's error (a finding) or None, the first
    window's outputs). Ctrl-C propagates (the caller's `running` kills the engine)."""
    first_outputs = None
    try:
        session.generate(prompt_ids[:1], 4)  # warm-up, as in the smoke test
        while True:
            before = session.counters()
            t1 = time.perf_counter()
            outputs = session.generate(prompt_ids, inp.max_tokens)
            seconds = time.perf_counter() - t1
            m = (session.counters() - before).metrics()
            first_outputs = first_outputs if first_outputs is not None else outputs
            drafts = m["num_drafts"]
            windows.append(
                {
                    "t_start_s": round(t1 - started, 1),
                    "seconds": round(seconds, 2),
                    "mean_acceptance_length": m["mean_acceptance_length"],
                    "acceptance_rate": m["acceptance_rate"],
                    "per_position": [a / drafts if drafts else 0.0 for a in m["accepted_per_position"]],
                    "num_drafts": drafts,
                    "tok_s": round(sum(map(len, outputs)) / seconds, 2),
                    "outputs_same": outputs == first_outputs,
                }
            )
            if outputs != first_outputs:
                differing[len(windows) - 1] = outputs
            w = windows[-1]
            _log(f"window {len(windows)}: mean acceptance length {w['mean_acceptance_length']:.3f}, {w['tok_s']:.0f} tok/s")
            elapsed = time.perf_counter() - started
            if (elapsed >= minutes * 60 and len(windows) >= 2) or (max_windows and len(windows) >= max_windows):
                break
    except Exception as err:  # an engine crash mid-soak is a finding, not a traceback
        return f"{type(err).__name__}: {err}", first_outputs
    return None, first_outputs


def _cmd_soak(args: argparse.Namespace) -> int:

    if args.minutes <= 0 or not 0 <= args.max_drift < 1:
        raise BadInput("--minutes must be > 0 and --max-drift in [0, 1)", hint="e.g. --minutes 60 --max-drift 0.05")
    inp = resolve_inputs(SmokeOptions.from_args(args))  # checks the models, the prompts' path and creates --out up front
    doc = run_soak(inp, args.minutes, args.max_drift, max_windows=args.max_windows)
    out = Path(args.out) if args.out else inp.out_dir
    for name, text in (("soak.json", json.dumps(doc, indent=2) + "\n"), ("soak.md", markdown(doc))):
        try:
            atomic_write_text(out / name, text)
        except OSError as err:
            raise os_error(err, out / name, "write the soak result") from None
    print(markdown(doc))
    for f in doc["failures"]:
        print(f"  - {f}", file=sys.stderr)
    return 0 if doc["verdict"] == "pass" else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "soak",
        help="repeat the smoke test's drafted run on one engine for N minutes; gate on drift",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_smoke_arguments(p)
    p.add_argument("--minutes", type=positive_float, default=10.0, help="how long to keep generating (default 10)")
    p.add_argument(
        "--max-drift",
        type=drift_limit,
        default=DEFAULT_MAX_DRIFT,
        help=f"largest allowed relative drop of mean acceptance length from the first window (default {DEFAULT_MAX_DRIFT:g})",
    )
    p.add_argument("--max-windows", type=positive_int, help="stop after this many windows even if time is left")
    p.set_defaults(func=_cmd_soak)
