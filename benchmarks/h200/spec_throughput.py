"""Tokens/s of a stack's engine with and without its EAGLE-3 drafter, at batch 1 and at N concurrent
requests, for several draft lengths k; on a GPU host (run by benchmarks/h200/run_bench.sh).

Uses speclock's own engine adapter (speclock.engines.vllm.OfflineSession: the stack's engine settings,
CUDA graphs on) and the smoke test's chat-templated MT-Bench prompts, greedy. Per configuration:
one engine start, a warm-up, then
  batch 1:  the first --batch1-prompts prompts one at a time (each request alone in the engine);
  batch N:  the first --concurrent prompts submitted together.
Spec-decode counters are deltas around each phase. At batch 1 the engine takes one step per draft,
so seconds / drafts is the time of one decode step with the drafter, and tokens / drafts the tokens
each step yields: that split says where the time goes. One JSON line per configuration goes to
--out as soon as it is measured (a run cut short keeps what it finished).

python benchmarks/h200/spec_throughput.py --stack S --target DIR --configs plain,1,2,3 --out bench.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stack", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", help="drafter folder (default: the stack's draft.path)")
    p.add_argument("--prompts", help="JSONL prompts (default: the stack's MT-Bench questions)")
    p.add_argument("--configs", default="plain,1,2,3,4,5", help="comma list: plain and/or draft lengths k")
    p.add_argument("--batch1-prompts", type=int, default=16)
    p.add_argument("--concurrent", type=int, default=80)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--settings", default="{}", help="JSON engine settings merged over the stack's")
    p.add_argument(
        "--k-per-batch-size",
        default="",
        help="JSON [[first bs, last bs, k], ...] for the drafted engines (engine.k_per_batch_size; default: the stack's)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each phase; the median run is kept (2026-12-05: single runs of 0.5-6 s varied by 15%%)",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()

    from transformers import AutoTokenizer

    from speclock.core.layout import REPO_ROOT
    from speclock.engines import EngineConfig, get_engine, running
    from speclock.spec.prompts import chat_prompt_ids, load_prompts
    from speclock.spec.stack import load_stack

    stack = load_stack(args.stack)
    target = Path(args.target)
    draft = Path(args.draft) if args.draft else REPO_ROOT / stack.draft["path"]
    tok = AutoTokenizer.from_pretrained(str(target))
    texts = load_prompts(args.prompts, max(args.concurrent, args.batch1_prompts))
    prompts = [chat_prompt_ids(tok, t) for t in texts]
    settings = dict(stack.engine_settings_for("sm_90a"), **json.loads(args.settings))
    env = stack.engine_env  # as smoke sets it
    engine = get_engine(stack.engine["name"])
    schedule = tuple(tuple(r) for r in json.loads(args.k_per_batch_size)) if args.k_per_batch_size else stack.k_per_batch_size

    for item in args.configs.split(","):
        k = 0 if item == "plain" else int(item)
        cfg = EngineConfig(target, draft if k else None, k or 1, settings, "", env, k_per_batch_size=schedule if k else ())
        t0 = time.perf_counter()
        with running(engine, cfg) as session:
            start_s = time.perf_counter() - t0
            session.generate(prompts[:2], 16)  # warm-up
            row = {
                "config": item,
                "k": k,
                "engine_start_s": round(start_s, 1),
                "max_tokens": args.max_tokens,
                "settings": settings,
                "k_per_batch_size": [list(r) for r in schedule] if k else [],
            }
            for phase, batches in (
                ("batch1", [[q] for q in prompts[: args.batch1_prompts]]),
                (f"batch{args.concurrent}", [prompts[: args.concurrent]]),
            ):
                runs = []
                for _ in range(max(args.repeats, 1)):
                    before = session.counters()
                    t1 = time.perf_counter()
                    tokens = sum(len(o) for b in batches for o in session.generate(b, args.max_tokens))
                    seconds = time.perf_counter() - t1
                    runs.append((seconds, tokens, session.counters() - before))
                runs.sort(key=lambda r: r[0])
                seconds, tokens, d = runs[len(runs) // 2]  # greedy: every run yields the same tokens
                cell = {
                    "tokens": tokens,
                    "seconds": round(seconds, 4),
                    "tok_s": round(tokens / seconds, 2),
                    "seconds_all": [round(r[0], 4) for r in runs],
                }
                if k:
                    cell.update(
                        drafts=d.num_drafts,
                        draft_tokens=d.num_draft_tokens,
                        accepted=d.num_accepted_tokens,
                        mean_acceptance_length=round(1 + d.num_accepted_tokens / max(d.num_drafts, 1), 4),
                        accepted_per_position=list(d.accepted_per_position),
                    )
                    if phase == "batch1":
                        cell["ms_per_step"] = round(1000 * seconds / max(d.num_drafts, 1), 3)
                        cell["tokens_per_step"] = round(tokens / max(d.num_drafts, 1), 3)
                else:
                    cell["ms_per_token"] = round(1000 * seconds / tokens, 3)
                row[phase] = cell
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
