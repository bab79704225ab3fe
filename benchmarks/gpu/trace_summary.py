"""Summarise a torch-profiler chrome trace of an engine's decode steps into a small JSON (no GPU needed to run it).

A raw trace is megabytes; what the speed issue needs from it fits in a page:
  - wall time per step against GPU-busy time per step (the union of kernel intervals: a launch-bound step has
    a wall far above its busy time);
  - per phase (the engines' own record_function spans: vLLM's `gpu_model_runner: forward|sample|draft|...`,
    SGLang's `scheduler.run_batch`, `draft`, `verify`, `draft_extend`, ...): CPU time, kernels launched one by one
    (outside a CUDA graph), CUDA-graph launches, and the GPU time of the kernels it started;
  - kernel launches and graph launches per step.

A step is one span named by `step_span` (one per engine iteration). Kernels are tied to the CPU call that launched
them by the trace's `correlation` ids; a kernel belongs to the innermost phase span enclosing its launch.

    python benchmarks/gpu/trace_summary.py TRACE.json[.gz] --step-span "scheduler.run_batch" [--out summary.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

KERNEL_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
SPAN_CATS = {"user_annotation", "python_function"}
GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch")
KERNEL_LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")


def load_trace(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1000.0


def summarize(trace: dict, step_span: str, top: int = 60) -> dict:
    """The summary of one trace. `step_span`: a substring of the span that marks one engine iteration (the
    outermost such spans count); phases are every span (record_function, or Python function with with_stack)
    seen in at least half the steps, the `top` heaviest by CPU time."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    spans = [e for e in events if e.get("cat") in SPAN_CATS]
    steps = _outermost(sorted((e for e in spans if step_span in e.get("name", "")), key=lambda e: e["ts"]))
    if not steps:
        names = sorted({e.get("name", "") for e in spans if e.get("cat") == "user_annotation"})
        raise ValueError(f"no span matching {step_span!r} in the trace; annotations seen: {names[:30]}")
    t0, t1 = steps[0]["ts"], max(e["ts"] + e["dur"] for e in steps)
    n = len(steps)
    by_corr: dict[object, list[dict]] = defaultdict(list)
    for k in events:
        if k.get("cat") in KERNEL_CATS and (k.get("args") or {}).get("correlation") is not None:
            by_corr[k["args"]["correlation"]].append(k)

    # One sweep per thread: spans nest on a thread, so the spans open at a launch form a stack.
    launches = [
        e
        for e in events
        if e.get("cat") in RUNTIME_CATS and t0 <= e["ts"] <= t1 and e.get("name", "").startswith(GRAPH_LAUNCH + KERNEL_LAUNCH)
    ]
    rows: dict[str, dict] = defaultdict(lambda: {"cpu_us": 0.0, "spans": 0, "eager": 0, "graph": 0, "gpu_us": 0.0})
    by_thread: dict[object, list[tuple[float, int, dict]]] = defaultdict(list)
    for s in spans:
        if s["ts"] + s["dur"] >= t0 and s["ts"] <= t1:
            by_thread[(s.get("pid"), s.get("tid"))].append((s["ts"], 0, s))
    for e in launches:
        by_thread[(e.get("pid"), e.get("tid"))].append((e["ts"], 1, e))
    eager = graph = 0
    busy: list[tuple[float, float]] = []
    for items in by_thread.values():
        items.sort(key=lambda x: (x[0], x[1], -x[2]["dur"]))
        stack: list[dict] = []
        for ts, kind, ev in items:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < ts:
                stack.pop()
            if kind == 0:
                if ev["name"] not in {s["name"] for s in stack}:  # recursion counts once
                    rows[ev["name"]]["cpu_us"] += ev["dur"]
                    rows[ev["name"]]["spans"] += 1
                stack.append(ev)
                continue
            is_graph = ev["name"].startswith(GRAPH_LAUNCH)
            eager, graph = eager + (not is_graph), graph + is_graph
            gpu = 0.0
            for k in by_corr.get((ev.get("args") or {}).get("correlation"), ()):
                gpu += k["dur"]
                busy.append((k["ts"], k["ts"] + k["dur"]))
            for name in {s["name"] for s in stack} or {"(outside any span)"}:
                row = rows[name]
                row["graph" if is_graph else "eager"] += 1
                row["gpu_us"] += gpu
    table = [
        {
            "phase": name,
            "spans_per_step": round(r["spans"] / n, 2),
            "cpu_ms_per_step": round(r["cpu_us"] / 1000 / n, 4),
            "gpu_ms_per_step": round(r["gpu_us"] / 1000 / n, 4),
            "eager_launches_per_step": round(r["eager"] / n, 2),
            "graph_launches_per_step": round(r["graph"] / n, 2),
            "outside_cuda_graphs": r["eager"] > 0,
        }
        for name, r in rows.items()
        if r["spans"] * 2 >= n or name == "(outside any span)"
    ]
    table.sort(key=lambda r: -r["cpu_ms_per_step"])
    wall_ms = (t1 - t0) / 1000.0
    busy_ms = _union_ms(busy)
    return {
        "step_span": step_span,
        "steps": n,
        "wall_ms_per_step": round(wall_ms / n, 4),
        "gpu_busy_ms_per_step": round(busy_ms / n, 4),
        "gpu_busy_fraction": round(busy_ms / wall_ms, 4) if wall_ms else None,
        "eager_launches_per_step": round(eager / n, 2),
        "graph_launches_per_step": round(graph / n, 2),
        "phases": table[:top],
    }


def _outermost(spans: list[dict]) -> list[dict]:
    """Spans (sorted by start) not inside an earlier one of the list."""
    out: list[dict] = []
    for s in spans:
        if out and s["ts"] < out[-1]["ts"] + out[-1]["dur"]:
            continue
        out.append(s)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--step-span", required=True, help="a substring of the span that marks one engine iteration")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    summary = summarize(load_trace(args.trace), args.step_span)
    text = json.dumps(summary, indent=1) + "\n"
    if args.out:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
