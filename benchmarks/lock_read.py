"""The lock's model (#38): what reading a lock costs on its hot path (every build, fetch and `lock --check`).

Measures, with this source tree and, with --before-src, another one (`git archive COMMIT src | tar -x -C DIR`, then
DIR/src; byte-compiled first, as an installed speclock is), the biggest committed lock (locks/*.lock by size):
  - in one process: the first read_lock (with the model: pydantic's import and the lock validator's build) and
    the median and best of --repeats more (validation and the provenance checks only);
  - whole commands: `speclock lock --stack NAME --check` over --runs fresh interpreters, the two trees alternating.
And, with this tree: pydantic's import, the lock validator's build, the parse and the validation alone.

Usage: python benchmarks/lock_read.py [--runs 15] [--repeats 30] [--before-src DIR]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = max(ROOT.glob("locks/*.lock"), key=lambda p: p.stat().st_size)

IN_PROCESS = """
import statistics, sys, time
from pathlib import Path
from speclock.spec.lock import read_lock
from speclock.spec.stack import load_stack
lock, stack = Path(sys.argv[1]), load_stack(Path(sys.argv[2]))
t0 = time.perf_counter(); read_lock(lock, stack=stack); first = time.perf_counter() - t0
runs = []
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter(); read_lock(lock, stack=stack); runs.append(time.perf_counter() - t0)
print(f"first read_lock {first * 1000:.1f} ms; then median {statistics.median(runs) * 1000:.1f} ms, best {min(runs) * 1000:.1f} ms")
"""

PARTS = """
import sys, time
t0 = time.perf_counter()
from pydantic import TypeAdapter
t1 = time.perf_counter()
from speclock.core.docmodel import validator
from speclock.core.jsonread import parse_json
from speclock.spec.lock import LOCK
t2 = time.perf_counter(); check = validator(LOCK); t3 = time.perf_counter()
data = open(sys.argv[1], "rb").read()
t4 = time.perf_counter(); doc = parse_json(data, sys.argv[1], what="lock file"); t5 = time.perf_counter()
best = min((lambda a: (check.validate_python(doc), time.perf_counter() - a)[1])(time.perf_counter()) for _ in range(30))
print(f"import pydantic {(t1 - t0) * 1000:.1f} ms, build the lock validator {(t3 - t2) * 1000:.1f} ms, "
      f"parse {(t5 - t4) * 1000:.1f} ms, validate (best of 30) {best * 1000:.2f} ms")
"""


def _python(src: Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--before-src", type=Path)
    args = ap.parse_args()
    trees = {"this tree": ROOT / "src"}
    if args.before_src:
        trees = {"before": args.before_src.resolve(), **trees}
    for src in trees.values():
        compileall.compile_dir(src, quiet=1)
    stack = ROOT / "stacks" / f"{LOCK.stem}.toml"
    print(f"{LOCK.relative_to(ROOT)} ({LOCK.stat().st_size} bytes)")
    for name, src in trees.items():
        print(f"{name}: {_python(src, '-c', IN_PROCESS, str(LOCK), str(stack), str(args.repeats)).strip()}")
    walls: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, src in trees.items():
            t0 = time.perf_counter()
            _python(src, "-m", "speclock", "lock", "--stack", LOCK.stem, "--check")
            walls[name].append(time.perf_counter() - t0)
    for name, runs in walls.items():
        print(
            f"{name}: `speclock lock --stack {LOCK.stem} --check` median {statistics.median(runs) * 1000:.0f} ms, "
            f"best {min(runs) * 1000:.0f} ms (n={len(runs)})"
        )
    print(f"this tree: {_python(ROOT / 'src', '-c', PARTS, str(LOCK)).strip()}")


if __name__ == "__main__":
    main()
