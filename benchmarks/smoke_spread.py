"""Run N healthy smokes of one profile and derive the gate's drift tolerances from their spread.

    PYTHONPATH=src python benchmarks/smoke_spread.py --profile quick -n 3 \
        --target ~/.cache/speclock/test-models/SmolLM2-135M-Instruct --draft models/smollm2-135m-eagle3 \
        --out out/spread-quick
    PYTHONPATH=src python benchmarks/smoke_spread.py --from out/spread-quick/run-*/report.json   # no new runs

For each run: wall time, the load average at start and end and the highest seen during the run (sampled every
5 s: the machine may be shared, and timings mean little without it), the mean acceptance length and each
position's acceptance rate. Over the runs: mean, standard deviation, min, max, and the largest pairwise relative
drift of each figure. That largest drift is the smallest tolerance that raises no false alarm when any one of
these healthy runs is the baseline of another; the derived tolerance adds a safety factor (x1.5) and keeps the
floor (5%, the engines' own CI standard for greedy runs). Writes spread.json next to the runs (or --json-out).
The tolerances then go into the stack's [smoke.profiles] with a comment naming the measurement (docs/smoke.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SAFETY = 1.5
FLOOR = 0.05


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_one(args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "speclock", "smoke", "--profile", args.profile, "--out", str(out)]
    for flag in ("stack", "target", "draft", "num_prompts", "max_tokens", "reference"):
        value = getattr(args, flag)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    peak = [0.0]
    done = threading.Event()

    def sample():
        while not done.wait(5):
            peak[0] = max(peak[0], os.getloadavg()[0])

    start_load = loadavg()
    t0 = time.time()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "smoke.log", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    done.set()
    wall = time.time() - t0
    return {
        "exit_code": code,
        "wall_s": round(wall, 1),
        "load_start": start_load,
        "load_end": loadavg(),
        "load1_max": round(max(peak[0], start_load[0]), 2),
        "report": str(out / "report.json"),
    }


def figures(report: dict) -> dict[str, float]:
    m = report["metrics"]
    out = {"mean_acceptance_length": m["mean_acceptance_length"]}
    drafts = m["num_drafts"]
    for i, a in enumerate(m["accepted_per_position"]):
        out[f"position_{i + 1}"] = a / drafts if drafts else 0.0
    return out


def max_pairwise_drift(values: list[float]) -> float:
    """The largest |b - a| / a over ordered pairs: any run as the baseline of any other."""
    worst = 0.0
    for a, b in itertools.permutations(values, 2):
        worst = max(worst, abs(b - a) / a if a else (0.0 if a == b else math.inf))
    return worst


def summarize(runs: list[dict], reports: list[dict], profile: str) -> dict:
    names = list(figures(reports[0]))
    stats = {}
    for name in names:
        vals = [figures(r)[name] for r in reports]
        drift = max_pairwise_drift(vals)
        stats[name] = {
            "values": [round(v, 5) for v in vals],
            "mean": round(statistics.fmean(vals), 5),
            "stdev": round(statistics.stdev(vals), 5) if len(vals) > 1 else 0.0,
            "min": round(min(vals), 5),
            "max": round(max(vals), 5),
            "max_pairwise_relative_drift": round(drift, 5),
            "derived_tolerance": round(max(FLOOR if profile != "sampled" else 0.0, math.ceil(drift * SAFETY * 200) / 200), 3),
        }
    per_seed = [r["sampled"]["spread"] for r in reports if isinstance(r.get("sampled"), dict)]
    return {
        "profile": profile,
        "runs": len(reports),
        "safety_factor": SAFETY,
        "floor": FLOOR,
        "timing": runs,
        "figures": stats,
        "per_seed_spread": per_seed,
        "note": "derived_tolerance = max(floor for greedy profiles, 1.5 x the largest pairwise relative drift over "
        "these healthy runs, rounded up to 0.005); the largest pairwise drift itself is the smallest drift "
        "the gate can catch with no false alarm over these runs",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", choices=["quick", "full", "sampled"], default="quick")
    p.add_argument("-n", type=int, default=3, help="healthy runs to make (default 3)")
    p.add_argument("--stack")
    p.add_argument("--target")
    p.add_argument("--draft")
    p.add_argument("--num-prompts", dest="num_prompts", type=int)
    p.add_argument("--max-tokens", dest="max_tokens", type=int)
    p.add_argument("--reference", choices=["recorded", "live", "off"])
    p.add_argument("--out", default="out/smoke-spread", help="folder for run-<i>/ and spread.json")
    p.add_argument("--from", dest="reports", nargs="+", help="summarize these report.json files instead of running")
    p.add_argument("--json-out", help="where to write the summary (default: <out>/spread.json)")
    args = p.parse_args(argv)
    out = Path(args.out)
    runs: list[dict] = []
    if args.reports:
        paths = [Path(r) for r in args.reports]
    else:
        paths = []
        for i in range(1, args.n + 1):
            info = run_one(args, out / f"run-{i}")
            print(
                f"run {i}: exit {info['exit_code']}, {info['wall_s']} s, load {info['load_start']} -> "
                f"{info['load_end']} (1-min max {info['load1_max']})",
                flush=True,
            )
            runs.append(info)
            paths.append(Path(info["report"]))
    reports = [json.loads(path.read_text()) for path in paths if path.is_file()]
    if not reports:
        print("no reports to summarize", file=sys.stderr)
        return 2
    profile = (reports[0].get("profile") or {}).get("name", "quick")
    summary = summarize(runs, reports, profile)
    summary["reports"] = [str(p) for p in paths]
    for name, s in summary["figures"].items():
        print(
            f"{name:24} mean {s['mean']:.4f}  sd {s['stdev']:.4f}  range {s['min']:.4f}-{s['max']:.4f}  "
            f"max pairwise drift {s['max_pairwise_relative_drift']:.2%}  -> tolerance {s['derived_tolerance']:.3f}"
        )
    dest = Path(args.json_out) if args.json_out else out / "spread.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
