"""Train the SmolLM2-135M EAGLE-3 drafter end to end on one GPU and measure it; also runs at toy scale.

    python benchmarks/train_h200.py --target T --work W --out O --prompts sharegpt.jsonl \
        --mtbench question.jsonl [--num-prompts 12000 --gen-budget 140 --fit-budget 150 ...]

Stages: generate (static-KV CUDA-graph loop) -> extract -> fit (TTT) -> export (vLLM + SGLang) ->
reference decoder on the 80 MT-Bench first turns (k=3; 256 and 64 new tokens; recorded in the
manifest) -> batch-1 speed of the reference decoder with and without the drafter.
Writes <out>/results.json and <out>/drafter.tar (the exported folders) as it goes, so a run cut
short still returns what it finished. Timings are wall-clock on the machine it runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speclock.train.fit import FitConfig  # noqa: E402
from speclock.train.pipeline import Settings, log, measure_speed, run_all, stage_reference  # noqa: E402


def save_drafter(out: Path, export: Path, work: Path, part_bytes: int = 15 << 20) -> None:
    """The exported folders as a tar cut into parts small enough to be fetched (SGLang's tensors = vLLM's)."""
    tmp = out / "drafter.tar.tmp"
    with tarfile.open(tmp, "w") as tar:
        tar.add(export / "vllm", arcname="vllm")
        for name in ("config.json", "speclock-manifest.json"):
            tar.add(export / "sglang" / name, arcname=f"sglang/{name}")
        tar.add(work / "ckpt" / "fit-summary.json", arcname="fit-summary.json")
    for old in out.glob("drafter.tar.part*"):
        old.unlink()
    data = tmp.read_bytes()
    for i in range(0, len(data), part_bytes):
        (out / f"drafter.tar.part{i // part_bytes:02d}").write_bytes(data[i:i + part_bytes])
    tmp.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", default="sharegpt")
    ap.add_argument("--mtbench", default="")
    ap.add_argument("--num-prompts", type=int, default=12000)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--generator", default="static")
    ap.add_argument("--gen-budget", type=float, default=140)
    ap.add_argument("--fit-budget", type=float, default=150)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--ttt-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--ref-prompts", type=int, default=80)
    ap.add_argument("--ref-max-tokens", type=int, nargs="+", default=[256, 64])
    ap.add_argument("--ref-workers", type=int, default=8)
    ap.add_argument("--speed-prompts", type=int, default=4)
    ap.add_argument("--device", default="")
    ap.add_argument("--stages", default="generate,extract,fit,export")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"args": {k: str(v) for k, v in vars(a).items()}}

    def save():
        (a.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")

    fit = FitConfig(epochs=a.epochs, ttt_steps=a.ttt_steps, lr=a.lr, warmup_steps=50, batch_tokens=a.batch_tokens,
                    max_len=1024, draft_vocab_size=a.draft_vocab, checkpoint_every=500, time_budget_s=a.fit_budget)
    s = Settings(work=a.work, target=a.target, prompts=a.prompts, num_prompts=a.num_prompts, max_prompt_tokens=512,
                 max_new_tokens=a.max_new_tokens, generator=a.generator, gen_batch=a.gen_batch,
                 gen_time_budget_s=a.gen_budget, fit=fit, device=a.device, ref_prompts_file=a.mtbench)
    t0 = time.perf_counter()
    results["pipeline"] = run_all(s, a.stages.split(","))
    results["pipeline"].pop("manifest", None)
    save()
    export = a.work / "export"
    save_drafter(a.out, export, a.work)
    device = results["pipeline"]["device"]
    results["reference"] = []
    for mt in a.ref_max_tokens:
        results["reference"] += stage_reference(a.target, export / "vllm", device, a.ref_prompts, 3, [mt], record=True,
                                                prompts_file=a.mtbench or None, workers=a.ref_workers,
                                                also_record_in=[export / "sglang"])
        save()
        save_drafter(a.out, export, a.work)
    if a.speed_prompts:
        results["speed"] = measure_speed(a.target, export / "vllm", device, a.speed_prompts, 3, max(a.ref_max_tokens),
                                         prompts_file=a.mtbench or None)
    results["seconds"] = round(time.perf_counter() - t0, 1)
    save()
    log(f"all done in {results['seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
