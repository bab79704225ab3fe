"""The edit-rebuild loop side by side (#37 item 1): speclock before, speclock now, and the naive peer, in ONE run.

Each round, in turn (so the machine's load falls on all three alike):
  peer      a one-line edit of app/main.py, then `docker build` (BuildKit) as image_build.py's naive builds run
  before    `speclock build-image --skip-selfcheck --json` from the source of --before (a git revision, extracted
            with `git archive`), after a one-line edit of its src/speclock/__init__.py
  now       the same from this checkout's source (copied: the checkout is never edited)
and for both speclocks a rebuild with nothing changed. Each speclock has a private SPECLOCK_CACHE (hard links
to the fetched wheelhouse and base, as image_build.py makes); both use the machine's buildah store, whose
layers were built before (warm rebuilds are what is timed: run image_build.py for cold builds). The peer is
built cold once first (untimed: it fills BuildKit's cache). Bytecode is written as in a developer's shell
(PYTHONDONTWRITEBYTECODE is unset for the timed commands). Wall time of the whole command, median of --runs.

    python benchmarks/warm_rebuild.py --runs 5 --before ac44e5a --out /tmp/warm.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import image_build as ib

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("src", "stacks", "locks", "containers", "models", "patches", "baselines")


def checkout(dest: Path, revision: str | None) -> Path:
    """The parts of the repo a build reads: from git (`revision`) or from this checkout (None)."""
    dest.mkdir(parents=True)
    if revision:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, *PARTS], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    else:
        for part in PARTS:
            shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def speclock_build(repo: Path, cache: Path, log: Path, builder: str = "buildah") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(repo / "src"), SPECLOCK_CACHE=str(cache))
    cmd = [
        sys.executable,
        "-m",
        "speclock",
        "build-image",
        "--stack",
        ib.STACK,
        "--skip-selfcheck",
        "--json",
        "--builder",
        builder,
    ]
    before = ib.load1()
    t0 = time.monotonic()
    with open(log, "a") as err:
        proc = subprocess.run(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"speclock build failed (exit {proc.returncode}); see {log}")
    record = json.loads(proc.stdout)
    return {
        "wall_s": round(wall, 3),
        "build_s": None if record.get("reused") else record.get("build_seconds"),  # a reused record keeps its build's
        "reused": bool(record.get("reused")),
        "image_id": record["image_id"],
        "load_before": before,
        "load_after": ib.load1(),
    }


def edit(path: Path, original: str, label: str) -> None:
    path.write_text(original + f"# one-line edit {label} {time.time()}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--before", default="HEAD", help="git revision of the 'before' speclock (default HEAD)")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--builder", default="buildah", choices=["buildah", "docker"], help="speclock's builder (default buildah)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="speclock-warm-"))
    logs = work / "logs"
    logs.mkdir()
    results: dict = {
        "machine": ib.machine_info(),
        "before": args.before,
        "builder": args.builder,
        "runs": args.runs,
        "rounds": [],
    }
    repos = {"before": checkout(work / "before", args.before), "now": checkout(work / "now", None)}
    caches = {name: ib.private_cache(work / f"cache-{name}") for name in repos}
    janitor = ib.BuildCacheJanitor()
    peer_ctx = None
    tags: list[str] = []
    try:
        if not args.skip_peer:
            results["peer_base"] = ib.ensure_naive_base()
            peer_ctx = ib.naive_context(work, json.loads((ROOT / "locks" / f"{ib.STACK}.lock").read_text()))
            tags.append(f"{ib.NAIVE_TAG}:warm-cold")
            first = ib.naive_build(peer_ctx, tags[-1], no_cache=False, logs=logs, janitor=janitor)
            ib.say(f"[peer] first build (fills BuildKit's cache, untimed here): {first['seconds']} s")
        for name, repo in repos.items():  # each speclock's first build stages its context (untimed)
            speclock_build(repo, caches[name], logs / f"{name}.log", args.builder)
        for n in range(1, args.runs + 1):
            rnd: dict = {}
            if peer_ctx is not None:
                app = peer_ctx / "app" / "main.py"
                original = app.read_text()
                edit(app, original, str(n))
                tags.append(f"{ib.NAIVE_TAG}:warm-{n}")
                rnd["peer_edit"] = ib.naive_build(peer_ctx, tags[-1], no_cache=False, logs=logs, janitor=janitor)
                rnd["peer_edit"]["wall_s"] = rnd["peer_edit"]["seconds"]
                app.write_text(original)
            for name, repo in repos.items():
                init = repo / "src" / "speclock" / "__init__.py"
                original = init.read_text()
                edit(init, original, str(n))
                rnd[f"{name}_edit"] = speclock_build(repo, caches[name], logs / f"{name}.log", args.builder)
                rnd[f"{name}_nochange"] = speclock_build(repo, caches[name], logs / f"{name}.log", args.builder)
                init.write_text(original)
            ib.say(f"[round {n}/{args.runs}] " + ", ".join(f"{k} {v['wall_s']:.2f} s" for k, v in rnd.items()))
            results["rounds"].append(rnd)
    finally:
        for tag in tags:
            ib.run([ib.DOCKER, "rmi", tag], check=False)
        janitor.prune()
    medians = {key: round(statistics.median(r[key]["wall_s"] for r in results["rounds"]), 3) for key in results["rounds"][0]}
    results["medians_wall_s"] = medians
    results["min_median_max_wall_s"] = {
        key: [round(f(r[key]["wall_s"] for r in results["rounds"]), 3) for f in (min, statistics.median, max)]
        for key in results["rounds"][0]
    }
    if "peer_edit" in medians:
        results["ratios_to_peer"] = {k: round(v / medians["peer_edit"], 2) for k, v in medians.items()}
    ib.say(json.dumps({k: results[k] for k in ("min_median_max_wall_s", "ratios_to_peer") if k in results}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
