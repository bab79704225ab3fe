"""The draft length k per batch size (`engine.k_per_batch_size`): how many tokens the drafter proposes at each load.

Speculative decoding pays where the target's step is launch-bound (batch 1) and costs where it is compute-bound
(many requests at once: verifying k + 1 tokens per request per step). A stack therefore says, per range of batch
sizes, which k to draft, 0 meaning plain decoding:

    [engine]
    k_per_batch_size = [[1, 8, 3], [9, 32, 1], [33, 1024, 0]]   # [first batch size, last batch size, k]

Rules (exit 2 naming the key): the ranges start at batch size 1, each starts right after the one before (increasing,
no gap, no overlap), each k is 0..smoke.num_speculative_tokens, smoke.num_speculative_tokens itself is one of them
(the largest k the drafted engine is started with), and the engine release is one whose source has the feature:

  - vLLM >= 0.26.0: `speculative_config.num_speculative_tokens_per_batch_size` (v1/spec_decode/dynamic/utils.py:
    inclusive ranges, the tail past the last range keeps its k, each k capped by num_speculative_tokens);
  - SGLang >= 0.5.15: adaptive speculative parameters (`speculative_adaptive` with a JSON file of per-batch-size
    slots, speculative/adaptive_spec_params.py): each range becomes a slot keyed by its first batch size with the
    single candidate step k, so the adaptive rule has nothing to choose between and k is fixed per load. SGLang
    routes a batch by its CUDA-graph padded size, so a batch of 5 in a graph of 8 takes the slot of 8. k = 0 is
    refused for SGLang: its slot is not plain decoding (every step still goes through the EAGLE worker, nothing
    drafted); on the H100 on 2026-12-07 a [[1, 8, 3], [9, 1024, 0]] table ran 80 requests at once at 14135 tok/s,
    against 22323-24353 drafting k = 1..3 and 30910-36563 plain (docs/gpu-runs/2026-12-07-h100/).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

# The first release of each engine whose source was read to have the feature (older ones may, but are not known to).
MIN_VERSION = {"vllm": (0, 26, 0), "sglang": (0, 5, 15)}
KEY = "engine.k_per_batch_size"
Schedule = tuple[tuple[int, int, int], ...]


def _release(version: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(x or 0) for x in m.groups()) if m else ()


def check(rows: Sequence[object], k: int, engine: str, version: str) -> tuple[str, str] | None:
    """(problem, what is allowed) for the first broken rule of a stack's k_per_batch_size, or None when it holds."""
    if not rows:
        return None
    need = MIN_VERSION.get(engine)
    if need is None or _release(version) < need:
        known = ", ".join(f"{e} >= {'.'.join(map(str, v))}" for e, v in MIN_VERSION.items())
        return f"{engine} {version} is not known to choose k per batch size", f"an engine release with it ({known}), or no {KEY}"
    end = 0
    drafted: set[int] = set()  # each row's k, once checked
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in row)):
            return f"entry {i} is {row!r}", "[first batch size, last batch size, k] of integers"
        first, last, kk = row
        if first != end + 1:
            where = "start at batch size 1" if i == 0 else f"start right after the entry before (at {end + 1})"
            return f"entry {i} starts at {first}", f"ranges that {where}: increasing in batch size, no gap, no overlap"
        if last < first:
            return f"entry {i} ends at {last}, before its start {first}", "a last batch size >= the first"
        if not 0 <= kk <= k:
            return f"entry {i} drafts k = {kk}", f"a k from 0 (plain decoding) to smoke.num_speculative_tokens ({k})"
        if kk == 0 and engine == "sglang":
            return (
                f"entry {i} drafts k = 0, which SGLang does not run as plain decoding",
                f"a k from 1 to {k}: SGLang {version} still runs a k = 0 slot through its EAGLE worker, and on an H100 "
                "(2026-12-07) that was slower at 80 requests at once than drafting k = 1..3",
            )
        end = last
        drafted.add(kk)
    if k not in drafted:
        return (
            f"no range drafts smoke.num_speculative_tokens ({k})",
            "the largest k the drafted engine starts with, in some range",
        )
    return None


def as_schedule(rows: Sequence[Sequence[int]]) -> Schedule:
    return tuple((int(a), int(b), int(c)) for a, b, c in rows)


def k_for_batch(schedule: Schedule, batch_size: int, k: int) -> int:
    """The k the schedule drafts at `batch_size` (past the last range: its k), as vLLM's lookup does; no schedule: k."""
    chosen = k
    for first, _last, kk in schedule:
        if batch_size >= first:
            chosen = kk
    return min(chosen, k)


def vllm_speculative_config(schedule: Schedule) -> dict[str, list[list[int]]]:
    return {"num_speculative_tokens_per_batch_size": [list(r) for r in schedule]} if schedule else {}


def sglang_adaptive_config(schedule: Schedule) -> dict[str, dict[str, list[int]]]:
    """SGLang's adaptive-config document: one slot per range, keyed by its first batch size, one candidate step."""
    return {str(first): {"candidate_steps": [kk]} for first, _last, kk in schedule}


def write_sglang_adaptive_config(schedule: Schedule, folder: Path) -> Path:
    """The adaptive-config file for SGLang (it takes a path), named by its content, written whole."""
    text = json.dumps(sglang_adaptive_config(schedule), sort_keys=True, indent=1) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sglang-adaptive-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path
