"""Profile an engine's batch-1 decode steps, plain or drafted, on a GPU host; write a small summary, not the trace.

Uses speclock's own engine adapter (the stack's settings and env, as smoke starts the engine), one engine per
process. After a warm-up it times `--timed-prompts` prompts one at a time (tokens/s and, drafted, ms per step
from the engine's own counters), then records one prompt of `--tokens` tokens with the engine's profiler hook:
  vLLM:   LLM(profiler_config={"profiler": "torch", ...}) + start_profile()/stop_profile(); vLLM 0.26 runs a
          Llama target on its V2 model runner, which has no record_function spans, so the trace records Python
          functions (with_stack) and a step is one `_process_engine_step` of the engine core; with_stack slows
          the CPU side, so the step's wall time comes from the timed run, not the trace;
  SGLang: Engine.start_profile(output_dir=..., with_stack=False) / stop_profile(); SGLang's own spans
          (`scheduler.run_batch`, `draft`, `verify`, `draft_extend`, ...) give the phases.
The trace is summarised by trace_summary.py into <out>/<label>.json (wall vs GPU-busy time per step, launches
per step, per phase CPU/GPU time and whether it ran outside CUDA graphs); the raw trace stays in /tmp.

    python benchmarks/gpu/profile_step.py --stack S.toml --target DIR --draft DIR --prompts P.jsonl --k 3 \
        --label sglang-k3 --out DIR [--settings JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_summary import load_trace, summarize

STEP_SPAN = {"vllm": "_process_engine_step", "sglang": "scheduler.run_batch"}


def traces_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stack", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--k", type=int, required=True, help="draft length; 0: plain (no drafter)")
    p.add_argument("--settings", default="{}", help="JSON engine settings merged over the stack's")
    p.add_argument("--tokens", type=int, default=64, help="tokens of the profiled request")
    p.add_argument("--timed-prompts", type=int, default=8)
    p.add_argument("--timed-tokens", type=int, default=128)
    p.add_argument("--label", required=True)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()

    from transformers import AutoTokenizer

    from speclock.engines import EngineConfig, get_engine, running
    from speclock.spec.prompts import chat_prompt_ids, load_prompts
    from speclock.spec.stack import load_stack

    stack = load_stack(args.stack)
    name = stack.engine["name"]
    tok = AutoTokenizer.from_pretrained(args.target)
    prompts = [chat_prompt_ids(tok, t) for t in load_prompts(args.prompts, args.timed_prompts + 2)]
    settings = dict(stack.engine_settings_for("sm_90a"), **json.loads(args.settings))
    tdir = Path(tempfile.mkdtemp(prefix=f"speclock-profile-{args.label}-"))
    if name == "vllm":
        settings["profiler_config"] = {
            "profiler": "torch",
            "torch_profiler_dir": str(tdir),
            "torch_profiler_with_stack": True,
            "torch_profiler_use_gzip": False,
            "torch_profiler_dump_cuda_time_total": False,
        }
    cfg = EngineConfig(Path(args.target), Path(args.draft) if args.k else None, args.k or 1, settings, "", stack.engine_env)
    row: dict = {
        "label": args.label,
        "engine": name,
        "k": args.k,
        "settings": {k: v for k, v in settings.items() if k != "profiler_config"},
    }
    t0 = time.perf_counter()
    with running(get_engine(name), cfg) as session:
        row["engine_start_s"] = round(time.perf_counter() - t0, 1)
        session.generate(prompts[:2], 32)  # warm-up: first shapes, JIT
        for q in prompts[2:4]:
            session.generate([q], args.timed_tokens)
        before = session.counters()
        t1 = time.perf_counter()
        tokens = sum(len(session.generate([q], args.timed_tokens)[0]) for q in prompts[2:])
        seconds = time.perf_counter() - t1
        d = session.counters() - before
        row["timed"] = {
            "prompts": len(prompts) - 2,
            "tokens": tokens,
            "seconds": round(seconds, 4),
            "tok_s": round(tokens / seconds, 2),
        }
        if args.k:
            row["timed"].update(
                drafts=d.num_drafts,
                ms_per_step=round(1000 * seconds / max(d.num_drafts, 1), 4),
                mean_acceptance_length=round(1 + d.num_accepted_tokens / max(d.num_drafts, 1), 4),
            )
        else:
            row["timed"]["ms_per_step"] = round(1000 * seconds / tokens, 4)
        try:  # a profiler that fails still leaves the timed figures
            if name == "vllm":
                session.llm.start_profile()
                session.generate([prompts[2]], args.tokens)
                session.llm.stop_profile()
            else:
                session.engine.start_profile(
                    output_dir=str(tdir), activities=["CPU", "GPU"], with_stack=False, record_shapes=False
                )
                session.generate([prompts[2]], args.tokens)
                session.engine.stop_profile()
        except Exception as err:
            row["profile_error"] = f"{type(err).__name__}: {err}"[:500]
    time.sleep(2)  # trace files are written by the engine's process as it stops
    summaries = []
    for trace in traces_in(tdir):
        try:
            s = summarize(load_trace(trace), STEP_SPAN[name])
        except (ValueError, OSError, json.JSONDecodeError) as err:
            summaries.append({"trace": trace.name, "bytes": trace.stat().st_size, "skipped": str(err)[:300]})
            continue
        summaries.append({"trace": trace.name, "bytes": trace.stat().st_size, **s})
    row["traces"] = summaries
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / f".{args.label}.json.tmp"
    tmp.write_text(json.dumps(row, indent=1) + "\n")
    os.replace(tmp, args.out / f"{args.label}.json")
    print(json.dumps({k: v for k, v in row.items() if k != "traces"}), flush=True)
    for s in summaries:
        print(json.dumps({k: v for k, v in s.items() if k != "phases"}), flush=True)
        for ph in s.get("phases", [])[:25]:
            print("   ", json.dumps(ph), flush=True)
    shutil.rmtree(tdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
