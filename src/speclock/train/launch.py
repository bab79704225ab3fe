"""Launching `speclock train ... --nproc N`: the one-process stages here, `extract` and `fit` under

    python -m torch.distributed.run --standalone --nproc-per-node N -m speclock.train.launch SETTINGS STAGES

and this module's `main` as each rank's entry point. It sits above the pipeline (it runs it);
speclock.train.distributed (what runs inside a rank) sits below it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from speclock.core import errors
from speclock.core.errors import BadInput, EnvironmentProblem, SpeclockError
from speclock.core.files import atomic_write_text, read_json
from speclock.core.layout import IMPORT_ROOT
from speclock.train.distributed import DIST_STAGES, LAUNCH_ENV, backend_for, under_torchrun
from speclock.train.fit import FitConfig
from speclock.train.pipeline import run_all
from speclock.train.settings import Settings, log


def torchrun_command(nproc: int, module_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", *module_args]


def launch_env() -> dict:
    """The environment of the launched ranks: this speclock on PYTHONPATH, NVLink multicast off."""
    src = str(IMPORT_ROOT)
    env = dict(os.environ, **LAUNCH_ENV)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_with_torchrun(s, stages: list[str], resume: bool, nproc: int) -> dict:
    """`speclock train ... --nproc N`: the one-process stages here, extract and fit under torchrun."""
    if under_torchrun():
        raise BadInput(
            "--nproc given inside a torchrun run", hint="launch with `speclock train --nproc N` or with torchrun, not both"
        )
    if isinstance(nproc, int) and nproc == 1:  # one process: exactly the plain path, no torchrun
        return run_all(s, stages, resume)
    backend, kind = backend_for(s.device, nproc)
    pre = [x for x in stages if x not in DIST_STAGES and stages.index(x) < _first(stages, DIST_STAGES)]
    mid = [x for x in stages if x in DIST_STAGES]
    post = [x for x in stages if x not in DIST_STAGES and x not in pre]
    t0 = time.perf_counter()
    summary: dict = {"stages": {}, "nproc": nproc, "backend": backend}
    s.work.mkdir(parents=True, exist_ok=True)
    if pre:
        summary.update(_without(run_all(s, pre, resume), "seconds", keep=summary))
        _free_gpu_memory()
    if mid:
        ctl = s.work / ".dist"
        ctl.mkdir(exist_ok=True)
        for old in ctl.glob("error-rank*.json"):
            old.unlink()
        settings_file = ctl / "settings.json"
        atomic_write_text(settings_file, json.dumps(settings_to_json(replace(s, device=kind)), indent=1) + "\n")
        (s.work / "run-summary.json").unlink(missing_ok=True)
        cmd = torchrun_command(
            nproc, ["speclock.train.launch", str(settings_file), ",".join(mid)] + ([] if resume else ["--no-resume"])
        )
        log(f"distributed: {' '.join(cmd[1:])} ({backend})")
        ts = time.perf_counter()
        rc = subprocess.run(cmd, env=launch_env()).returncode
        if rc != 0:
            raise _rank_error(ctl, rc)
        part = read_json(
            s.work / "run-summary.json",
            what="run summary of the torchrun ranks",
            hint="run the same command again: it resumes where the ranks stopped",
        )
        summary.update(_without(part, "seconds", keep=summary))
        summary["stages"]["torchrun"] = round(time.perf_counter() - ts, 2)
    if post:
        summary.update(_without(run_all(s, post, resume), "seconds", keep=summary))
    summary["nproc"], summary["backend"] = nproc, backend
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    atomic_write_text(s.work / "run-summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    return summary


def _first(stages, names) -> int:
    return min([stages.index(x) for x in stages if x in names] or [len(stages)])


def _without(part: dict, key: str, keep: dict) -> dict:
    """A stage run's summary, its stage timings merged into keep's."""
    out = {k: v for k, v in part.items() if k not in (key, "stages")}
    keep["stages"].update(part.get("stages", {}))
    return out


def _free_gpu_memory() -> None:
    # heavy, optional (torch): imported only where it is used
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _rank_error(ctl: Path, rc: int) -> SpeclockError:
    """The first rank's speclock error (with its exit code), else an environment problem."""
    for p in sorted(ctl.glob("error-rank*.json")):
        try:
            e = read_json(p, what="rank error")
            cls = {
                "BadInput": errors.BadInput,
                "CheckFailed": errors.CheckFailed,
                "EnvironmentProblem": errors.EnvironmentProblem,
            }.get(e.get("class"), errors.CheckFailed)
            hint = e.get("hint")
            return cls(f"rank {e.get('rank')}: {e.get('message')}", hint=hint if isinstance(hint, str) else None)
        except BadInput:  # a rank killed while writing it: report the exit code instead
            continue
    return EnvironmentProblem(
        f"torchrun exited with {rc} (a rank crashed; its traceback is above)",
        hint="see the first rank's error above; rerun resumes where the run stopped",
    )


def settings_to_json(s) -> dict:
    d = asdict(s)
    for k in ("work", "target", "gguf"):
        d[k] = None if d[k] is None else str(d[k])
    return d


def settings_from_json(d: dict, source: Path | str = "settings"):

    if not isinstance(d, dict) or not isinstance(d.get("fit"), dict):
        raise BadInput(
            f"{source}: key 'fit' is missing or not an object (not a settings file speclock wrote)",
            hint="run `speclock train all --nproc N` again: it writes the settings afresh",
        )
    d = dict(d)
    fit_names = {f.name for f in fields(FitConfig)}
    d["fit"] = FitConfig(**{k: v for k, v in d["fit"].items() if k in fit_names})
    for k in ("work", "target", "gguf"):
        if d.get(k) is not None and not isinstance(d[k], str):
            raise BadInput(f"{source}: key {k!r} is not a path string", hint="run `speclock train all --nproc N` again")
        d[k] = None if d.get(k) is None else Path(d[k])
    names = {f.name for f in fields(Settings)}
    return Settings(**{k: v for k, v in d.items() if k in names})


def main(argv: list[str] | None = None) -> int:
    """One torchrun rank: python -m speclock.train.launch SETTINGS.json extract,fit [--no-resume]."""
    p = argparse.ArgumentParser(prog="speclock.train.launch")
    p.add_argument("settings", type=Path)
    p.add_argument("stages")
    p.add_argument("--no-resume", action="store_true")
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        s = settings_from_json(read_json(args.settings, what="distributed settings"), args.settings)
        run_all(s, [x for x in args.stages.split(",") if x], resume=not args.no_resume)
        return 0
    except SpeclockError as err:
        # torchrun reports every failure as exit 1: the parent re-raises this with its own exit code.
        atomic_write_text(
            args.settings.parent / f"error-rank{rank:03d}.json",
            json.dumps({"rank": rank, "class": type(err).__name__, "message": err.message, "hint": err.hint}),
        )
        print(f"speclock train (rank {rank}): error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
