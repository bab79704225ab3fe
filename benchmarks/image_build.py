"""Benchmark the default stack's image build on this machine.

Measures, as medians of --runs runs each (buildah, the reproducible builder):
  cold build   : `build-image --no-cache` (wheelhouse and base rootfs already cached: the
                 network is never used by a build, it runs with --network none)
  warm rebuild : `build-image` after a one-line edit in src/speclock/ (layer cache on)
and reports the runtime image's size per layer. Works on a scratch copy of the repo.

    python benchmarks/image_build.py --runs 3 --out docs/benchmarks-image.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import copy_repo  # noqa: E402


def build(repo: Path, *extra: str) -> tuple[float, dict]:
    env = dict(os.environ, PYTHONPATH=str(repo / "src"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "speclock", "build-image", "--json", *extra], cwd=repo, env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"build failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    results: dict = {"machine": f"{platform.node()} {os.cpu_count()} cores, {platform.platform()}", "runs": args.runs,
                     "cold_s": [], "warm_s": [], "loadavg_1min_at_each_build": []}
    with tempfile.TemporaryDirectory(prefix="speclock-bench-") as tmp:
        repo = copy_repo(Path(tmp))
        module = repo / "src" / "speclock" / "build" / "push.py"
        original = module.read_text()
        record = None
        for i in range(args.runs):
            results["loadavg_1min_at_each_build"].append(os.getloadavg()[0])
            wall, record = build(repo, "--no-cache", "--skip-selfcheck")
            results["cold_s"].append(round(wall, 1))
            print(f"cold build {i + 1}: {wall:.1f} s ({record['ref']})", flush=True)
            module.write_text(original + f"\n# benchmark edit {i} {time.time()}\n")
            results["loadavg_1min_at_each_build"].append(os.getloadavg()[0])
            wall, _ = build(repo, "--skip-selfcheck")
            results["warm_s"].append(round(wall, 1))
            print(f"warm rebuild after a one-line edit {i + 1}: {wall:.1f} s", flush=True)
            module.write_text(original)
        assert record is not None
        results["cold_median_s"] = statistics.median(results["cold_s"])
        results["warm_median_s"] = statistics.median(results["warm_s"])
        results["ratio_cold_over_warm"] = round(results["cold_median_s"] / results["warm_median_s"], 1)
        layers = record["layers"]
        results["layers"] = [{"size_mb": round(l["size"] / 1e6, 1), "created_by": l["created_by"][:120]} for l in layers]
        results["image_compressed_mb"] = round(sum(l["size"] for l in layers) / 1e6, 1)
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
