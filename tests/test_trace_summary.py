"""benchmarks/gpu/trace_summary.py, the profile summariser of the GPU speed issue (#39): exact figures from a scripted
chrome trace (two decode steps: spans, kernel and CUDA-graph launches tied to their kernels by correlation id), and a
real torch-profiler trace made on this CPU (record_function spans, Python stacks)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
from trace_summary import load_trace, summarize


def _span(name, ts, dur, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def _launch(name, ts, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 5, "pid": 1, "tid": 1, "args": {"correlation": corr}}


def _kernel(ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "pid": 0, "tid": 7, "args": {"correlation": corr}}


def scripted_trace() -> dict:
    """Two steps of 1000 us: `draft` launches 3 kernels one by one (eager), `verify` one CUDA graph of 2 kernels."""
    events = []
    for i, t0 in enumerate((0, 1000)):
        events += [_span("scheduler.run_batch", t0, 1000), _span("draft", t0 + 10, 400), _span("verify", t0 + 500, 300)]
        for j in range(3):
            corr = 100 * i + j
            events += [_launch("cudaLaunchKernel", t0 + 20 + 10 * j, corr), _kernel(t0 + 50 + 40 * j, 30, corr)]
        corr = 100 * i + 50
        events += [_launch("cudaGraphLaunch", t0 + 510, corr), _kernel(t0 + 600, 100, corr), _kernel(t0 + 700, 50, corr)]
    return {"traceEvents": events}


def test_a_scripted_trace_gives_exact_figures():
    s = summarize(scripted_trace(), "scheduler.run_batch")
    assert s["steps"] == 2 and s["wall_ms_per_step"] == 1.0
    assert s["gpu_busy_ms_per_step"] == pytest.approx((3 * 30 + 100 + 50) / 1000)
    assert s["eager_launches_per_step"] == 3 and s["graph_launches_per_step"] == 1
    phases = {p["phase"]: p for p in s["phases"]}
    assert phases["draft"]["eager_launches_per_step"] == 3 and phases["draft"]["outside_cuda_graphs"]
    assert phases["draft"]["gpu_ms_per_step"] == pytest.approx(0.09) and phases["draft"]["cpu_ms_per_step"] == 0.4
    assert phases["verify"]["graph_launches_per_step"] == 1 and not phases["verify"]["outside_cuda_graphs"]
    assert phases["verify"]["gpu_ms_per_step"] == pytest.approx(0.15)
    assert phases["scheduler.run_batch"]["eager_launches_per_step"] == 3  # an outer span counts what it encloses


def test_a_missing_step_span_names_the_spans_seen():
    with pytest.raises(ValueError, match=r"no span matching 'execute_model'.*draft"):
        summarize(scripted_trace(), "execute_model")


def test_a_real_cpu_torch_profiler_trace(tmp_path):
    torch = pytest.importorskip("torch")

    def step(x):
        with torch.profiler.record_function("scheduler.run_batch"):
            with torch.profiler.record_function("draft"):
                x = x @ x
            with torch.profiler.record_function("verify"):
                x = torch.relu(x) / 10
        return x

    x = torch.randn(32, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(5):
            x = step(x)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    s = summarize(load_trace(tmp_path / "t.json"), "scheduler.run_batch")
    names = {p["phase"] for p in s["phases"]}
    assert s["steps"] == 5 and {"scheduler.run_batch", "draft", "verify"} <= names
    assert s["eager_launches_per_step"] == 0 and s["gpu_busy_ms_per_step"] == 0  # a CPU has no kernels
