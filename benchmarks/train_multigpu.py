"""Extraction and training throughput with 1 and N processes (torchrun + FSDP2), and scaling efficiency.

    python benchmarks/train_multigpu.py --target T --responses responses.jsonl --work W --out O [--nprocs 1,2,4,8]
    python benchmarks/train_multigpu.py --target T --prompts prompts.jsonl --num-prompts 2000 --work W --out O

For each N the same responses are extracted into a fresh folder and the drafter is trained from
scratch for --fit-steps steps with the same global batches (`speclock train all --stages extract,fit
--nproc N`). N=1 runs twice: the plain one-process path (the baseline) and, as "fsdp1", torchrun with one
rank (the FSDP2/NCCL path on one GPU: a single H200 exercises the distributed code this way).
N larger than the visible GPUs is skipped and recorded as skipped. --weak scales the global batch with
N (batch_tokens * N) instead of keeping it fixed.

Writes <out>/train_multigpu.json after every run (a run cut short keeps what it finished):
per run the extraction tok/s (tokens / slowest rank's time), the training tok/s, wall times, final loss
and accuracy; per N the scaling efficiency = tok/s(N) / (N * tok/s(1, plain)).
`--device cpu` runs the same on a CPU with gloo (a check of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from speclock.train.launch import launch_env, torchrun_command  # noqa: E402


def gpu_info() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "python": platform.python_version()}
    if torch.cuda.is_available():
        info.update(gpus=torch.cuda.device_count(), gpu_name=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
        try:
            v = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as err:  # informational only
            info["nccl"] = f"unknown ({err})"
    return info


def train_args(a, work: Path, n: int) -> list[str]:
    batch = a.batch_tokens * (n if a.weak else 1)
    out = [
        "train",
        "all",
        "--stages",
        "extract,fit",
        "--work",
        str(work),
        "--target",
        str(a.target),
        "--no-resume",
        "--epochs",
        str(a.epochs),
        "--ttt-steps",
        str(a.ttt_steps),
        "--batch-tokens",
        str(batch),
        "--draft-vocab",
        str(a.draft_vocab),
        "--max-steps",
        str(a.fit_steps),
        "--lr",
        str(a.lr),
    ]
    if a.aux_layers:
        out += ["--aux-layers", a.aux_layers]
    if a.device:
        out += ["--device", a.device]
    return out


def run_one(a, mode: str, n: int, responses: Path) -> dict:
    work = a.work / f"{mode}-n{n}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shutil.copy(responses, work / "responses.jsonl")
    args = train_args(a, work, n)
    if mode == "plain":
        cmd = [sys.executable, "-m", "speclock", *args]
    elif mode == "fsdp1":  # torchrun with one rank: the distributed path, on one device
        cmd = torchrun_command(1, ["speclock", *args])
    else:
        cmd = [sys.executable, "-m", "speclock", *args, "--nproc", str(n)]
    t0 = time.perf_counter()
    log = (a.out / f"{mode}-n{n}.log").open("w")
    rc = subprocess.run(cmd, env=launch_env(), stdout=log, stderr=subprocess.STDOUT, timeout=a.run_timeout).returncode
    wall = time.perf_counter() - t0
    rec = {"mode": mode, "nproc": n, "rc": rc, "wall_s": round(wall, 2), "command": " ".join(cmd[1:])}
    if rc != 0:
        rec["error"] = (a.out / f"{mode}-n{n}.log").read_text()[-3000:]
        return rec
    summ = json.loads((work / "run-summary.json").read_text())
    fit = summ.get("fit") or {}
    ext = summ.get("extract") or {}
    rec.update(
        extract_tokens=ext.get("new_tokens"),
        extract_s=ext.get("seconds"),
        extract_tok_s=ext.get("tok_s"),
        fit_steps=fit.get("steps"),
        fit_tokens=fit.get("tokens_seen"),
        fit_s=fit.get("seconds"),
        fit_tok_s=fit.get("train_tok_s"),
        final_loss=fit.get("final_loss"),
        final_acc_per_step=fit.get("final_acc_per_step"),
        precision=fit.get("precision"),
        stages_s=summ.get("stages"),
    )
    if not a.keep_work:
        shutil.rmtree(work / "hidden", ignore_errors=True)
    return rec


def efficiency(runs: list[dict]) -> dict:
    base = next((r for r in runs if r["mode"] == "plain" and r["rc"] == 0), None)
    out = {}
    if not base:
        return out
    for r in runs:
        if r["rc"] != 0 or r["mode"] == "plain":
            continue
        key = f"{r['mode']}-n{r['nproc']}"
        out[key] = {
            m: round(r[f"{m}_tok_s"] / (r["nproc"] * base[f"{m}_tok_s"]), 3)
            if r.get(f"{m}_tok_s") and base.get(f"{m}_tok_s")
            else None
            for m in ("extract", "fit")
        }
        out[key]["loss_vs_plain"] = (
            round(r["final_loss"] - base["final_loss"], 5)
            if r.get("final_loss") is not None and base.get("final_loss") is not None
            else None
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True, help="the target as a Hugging Face folder")
    ap.add_argument("--responses", type=Path, help="responses.jsonl (speclock train generate's output)")
    ap.add_argument("--prompts", help="instead of --responses: a chat JSONL (or 'sharegpt') to generate responses from once")
    ap.add_argument("--num-prompts", type=int, default=2000)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--nprocs", default="", help="comma-separated process counts (default: 1 and every visible GPU)")
    ap.add_argument("--no-fsdp1", action="store_true", help="skip the torchrun run with one rank")
    ap.add_argument("--weak", action="store_true", help="global batch = batch_tokens * N (default: the same global batch)")
    ap.add_argument("--fit-steps", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--aux-layers", default="", help="e.g. 2,15,27 (default 2,N/2,N-3)")
    ap.add_argument("--device", default="", help="cuda (default when available) or cpu (gloo; checks the script only)")
    ap.add_argument("--run-timeout", type=float, default=3600)
    ap.add_argument("--keep-work", action="store_true", help="keep each run's hidden states (disk)")
    a = ap.parse_args()
    if not a.responses and not a.prompts:
        ap.error("give --responses or --prompts")
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    info = gpu_info()
    have = info.get("gpus", 0) if a.device != "cpu" else os.cpu_count()
    nprocs = [int(x) for x in a.nprocs.split(",") if x] if a.nprocs else sorted({1, max(1, have)})
    responses = a.responses
    result = {
        "schema": "speclock.bench.train_multigpu/v1",
        "host": platform.node(),
        "env": info,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "runs": [],
        "skipped": [],
    }
    if not responses:
        gen = a.work / "generate"
        gen.mkdir(exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "speclock",
            "train",
            "generate",
            "--work",
            str(gen),
            "--target",
            str(a.target),
            "--prompts",
            a.prompts,
            "--num-prompts",
            str(a.num_prompts),
            "--max-new-tokens",
            str(a.max_new_tokens),
        ]
        cmd += ["--device", a.device] if a.device else []
        t0 = time.perf_counter()
        subprocess.run(cmd, env=launch_env(), check=True)
        result["generate_s"] = round(time.perf_counter() - t0, 2)
        responses = gen / "responses.jsonl"
    plan = []
    for n in nprocs:
        if n > have:
            result["skipped"].append({"nproc": n, "why": f"{have} {'GPUs' if a.device != 'cpu' else 'CPUs'} visible"})
            continue
        plan += [("plain", 1)] + ([] if a.no_fsdp1 else [("fsdp1", 1)]) if n == 1 else [("torchrun", n)]
    for mode, n in plan:
        print(f"[{time.strftime('%H:%M:%S')}] {mode} nproc={n}", flush=True)
        rec = run_one(a, mode, n, responses)
        print(
            json.dumps({k: rec.get(k) for k in ("mode", "nproc", "rc", "extract_tok_s", "fit_tok_s", "final_loss", "wall_s")}),
            flush=True,
        )
        result["runs"].append(rec)
        result["scaling_efficiency"] = efficiency(result["runs"])
        (a.out / "train_multigpu.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(r["rc"] == 0 for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
