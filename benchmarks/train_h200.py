"""Train the SmolLM2-135M EAGLE-3 drafter end to end on one GPU and measure it; also runs at toy scale.

    python benchmarks/train_h200.py --target T --work W --out O --prompts sharegpt.jsonl.gz \
        --mtbench question.jsonl [--stages generate,extract,fit,export,reference,speed] [...]

Stages: generate (with --self-prompts N the target first writes N user requests, mixed with
--num-prompts drawn from --prompts; static-KV CUDA-graph loop) -> extract (fp8 store by default) -> fit (TTT) ->
export (vLLM + SGLang) -> reference (decoder on the 80 MT-Bench first turns, k=3, 256 and 64 new
tokens, recorded in the manifest) -> speed (batch-1 tokens/s with and without the drafter) ->
fp8-effect (the same data subset extracted in bf16, fp8 and fp8-all, drafters trained for the
same steps, each judged on MT-Bench: what the fp8 stores cost in acceptance).
Every stage resumes from the work folder, so a long run can be split over several calls of at
most a few minutes each (the work folder must survive between them). Writes
<out>/results-<stages>.json and, once exported, <out>/drafter.tar.partNN as it goes, so a run cut
short still returns what it finished. Timings are wall-clock on the machine it runs on.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speclock.train.fit import FitConfig
from speclock.train.judge import measure_speed, stage_reference
from speclock.train.pipeline import run_all
from speclock.train.settings import Settings, log, pick_device


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
        (out / f"drafter.tar.part{i // part_bytes:02d}").write_bytes(data[i : i + part_bytes])
    tmp.unlink()


def fp8_effect(a, base: Settings, device: str) -> dict:
    """Same sequences, same steps, bf16 vs fp8 store: held-out accuracy and MT-Bench acceptance of each."""
    import shutil

    from speclock.train.data import read_done

    done = sorted(read_done(a.work / "responses.jsonl").values(), key=lambda r: r["id"])[: a.effect_sequences]
    out: dict = {"sequences": len(done), "steps": a.effect_steps}
    for store in a.effect_stores.split(","):
        work = a.work / f"effect-{store}"
        work.mkdir(parents=True, exist_ok=True)
        with open(work / "responses.jsonl", "w") as f:
            for r in done:
                f.write(json.dumps(r) + "\n")
        fit = replace(
            base.fit,
            epochs=max(1, base.fit.epochs),
            max_steps=a.effect_steps,
            time_budget_s=0.0,
            holdout_sequences=min(300, len(done) // 10),
            checkpoint_every=10**9,
        )
        s = replace(base, work=work, hidden_store=store, fit=fit)
        res = run_all(s, ["extract", "fit", "export"])
        ref = stage_reference(
            a.target,
            work / "export" / "vllm",
            device,
            a.ref_prompts,
            3,
            [64],
            record=False,
            prompts_file=a.mtbench or None,
            workers=a.ref_workers,
        )
        out[store] = {
            "extract": res.get("extract"),
            "fit_seconds": res["fit"]["seconds"],
            "holdout_acc_per_step": (res["fit"].get("holdout") or {}).get("acc_per_step"),
            "train_acc_per_step": res["fit"].get("final_acc_per_step"),
            "data_greedy_consistency": res["fit"].get("data_greedy_consistency"),
            "mtbench_64": ref[0]["metrics"],
        }
        shutil.rmtree(work / "hidden", ignore_errors=True)
        log(f"fp8-effect: {store}: MT-Bench x64 mean acceptance length {ref[0]['metrics']['mean_acceptance_length']:.3f}")
    return out


def return_self_prompts(work: Path, out: Path) -> None:
    """The target's own requests come back from the GPU host (gzipped), so they can be reused."""
    import gzip
    import shutil

    own = work / "self-prompts.jsonl"
    if own.exists():
        with open(own, "rb") as src, gzip.open(out / "self-prompts.jsonl.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", default="sharegpt")
    ap.add_argument("--mtbench", default="")
    ap.add_argument("--num-prompts", type=int, default=60000)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--generator", default="static")
    ap.add_argument("--gen-budget", type=float, default=240)
    ap.add_argument("--fit-budget", type=float, default=240)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--ttt-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--hidden-store", default="fp8", choices=["fp8", "fp8-all", "bf16"])
    ap.add_argument("--effect-stores", default="bf16,fp8,fp8-all")
    ap.add_argument("--holdout", type=int, default=500)
    ap.add_argument("--ref-prompts", type=int, default=80)
    ap.add_argument("--ref-max-tokens", type=int, nargs="+", default=[256, 64])
    ap.add_argument("--ref-workers", type=int, default=8)
    ap.add_argument("--speed-prompts", type=int, default=4)
    ap.add_argument("--effect-sequences", type=int, default=6000)
    ap.add_argument("--effect-steps", type=int, default=400)
    ap.add_argument("--self-prompts", type=int, default=0, help="user requests the target writes before generating")
    ap.add_argument("--self-budget", type=float, default=90)
    ap.add_argument("--device", default="")
    ap.add_argument("--stages", default="generate,extract,fit,export,reference,speed")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    stages = a.stages.split(",")
    results: dict = {"args": {k: str(v) for k, v in vars(a).items()}}
    name = a.out / f"results-{'-'.join(stages)}.json"

    def save():
        name.write_text(json.dumps(results, indent=1, default=str) + "\n")

    fit = FitConfig(
        epochs=a.epochs,
        ttt_steps=a.ttt_steps,
        lr=a.lr,
        warmup_steps=50,
        batch_tokens=a.batch_tokens,
        max_len=1024,
        draft_vocab_size=a.draft_vocab,
        checkpoint_every=500,
        time_budget_s=a.fit_budget,
        holdout_sequences=a.holdout,
    )
    s = Settings(
        work=a.work,
        target=a.target,
        prompts=a.prompts,
        num_prompts=a.num_prompts,
        max_prompt_tokens=512,
        max_new_tokens=a.max_new_tokens,
        generator=a.generator,
        gen_batch=a.gen_batch,
        gen_time_budget_s=a.gen_budget,
        fit=fit,
        device=a.device,
        ref_prompts_file=a.mtbench,
        hidden_store=a.hidden_store,
        self_prompts=a.self_prompts,
        self_prompt_time_budget_s=a.self_budget,
    )
    t0 = time.perf_counter()
    export = a.work / "export"
    pipeline_stages = [x for x in ("generate", "extract", "fit", "export") if x in stages]
    if pipeline_stages:
        results["pipeline"] = run_all(s, pipeline_stages)
        results["pipeline"].pop("manifest", None)
        return_self_prompts(a.work, a.out)
        save()
    device = pick_device(a.device)
    if (export / "vllm" / "config.json").exists():
        save_drafter(a.out, export, a.work)
    if "reference" in stages:
        results["reference"] = []
        for mt in a.ref_max_tokens:
            results["reference"] += stage_reference(
                a.target,
                export / "vllm",
                device,
                a.ref_prompts,
                3,
                [mt],
                record=True,
                prompts_file=a.mtbench or None,
                workers=a.ref_workers,
                also_record_in=[export / "sglang"],
            )
            save()
            save_drafter(a.out, export, a.work)
    if "speed" in stages and a.speed_prompts:
        results["speed"] = measure_speed(
            a.target, export / "vllm", device, a.speed_prompts, 3, max(a.ref_max_tokens), prompts_file=a.mtbench or None
        )
        save()
    if "fp8-effect" in stages:
        results["fp8_effect"] = fp8_effect(a, s, device)
        save()
    results["seconds"] = round(time.perf_counter() - t0, 1)
    save()
    log(f"all done in {results['seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
