"""Prompts written by the target itself: sample its user turn from the chat template's prefix.

An instruction-tuned target has learnt what the user turns of its own tuning data look like. Fed
the chat template up to where a user message starts (its default system prompt included) and
sampled until its end-of-turn token, it writes a plausible user request (the "Magpie" idea:
Xu et al., 2024). A drafter trained on the target's answers to such requests sees the task mix
the target was tuned for (writing, maths, code, advice, ...), which public chat logs such as
ShareGPT cover unevenly. The prompts are only the questions: every training response is still
regenerated greedily by the target, as for any other prompt source.

Output: a JSONL file of chats ({"id": "self:<n>", "conversations": [{"from": "human", "value": ...}]}),
the format `speclock train generate --prompts FILE` reads. Requests that did not end within the
token limit, are too short or too long, repeat themselves, or repeat an earlier request (after
folding case and whitespace) are dropped. Appended and fsynced batch by batch; a rerun keeps what
is there and adds until `n` requests exist (a torn last line from an interrupted run is cut).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from speclock.core.errors import BadInput
from speclock.core.jsonl import read_jsonl
from speclock.core.jsonread import loads
from speclock.spec.prompts import require_chat_template

_MARK = "\x00speclock-user-text\x00"


def _user_turn_text(tokenizer) -> tuple[str, str]:
    """(template text before a user message, template text after it)."""
    require_chat_template(tokenizer)
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    if _MARK not in text:
        raise BadInput("the chat template does not place the user's text verbatim; cannot find where a user turn starts")
    before, after = text.split(_MARK, 1)
    return before, after


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to the first character of a user message."""
    return tokenizer(_user_turn_text(tokenizer)[0], add_special_tokens=False)["input_ids"]


def user_turn_end(tokenizer) -> list[int]:
    """The token the template closes a user message with (<|im_end|>, <|eot_id|>, ...), as a list."""
    return tokenizer(_user_turn_text(tokenizer)[1], add_special_tokens=False)["input_ids"][:1]


def _fold(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def acceptable(text: str, min_chars: int = 12, max_chars: int = 2000) -> bool:
    """A usable request: long enough, not too long, and not a loop (most words distinct)."""
    t = text.strip()
    if not min_chars <= len(t) <= max_chars:
        return False
    words = t.split()
    if len(words) < 3:
        return False
    return len(set(words)) >= 0.4 * len(words)


def _self_prompt_record(path: Path, hint: str):
    def check(raw: bytes, lineno: int) -> tuple[str, int]:
        try:
            rec = loads(raw.decode("utf-8"))
            text = rec["conversations"][0]["value"]
            number = int(str(rec["id"]).split(":", 1)[1])
            if not isinstance(text, str) or number < 0:
                raise TypeError("'value' must be a string and the id 'self:<n>'")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as err:
            raise BadInput(
                f"{path}:{lineno}: not a self-prompt record (id 'self:<n>', conversations[0].value): "
                f"{type(err).__name__} {str(err)[:100]}",
                hint=hint,
            ) from None
        return text, number

    return check


def _read_existing(path: Path) -> tuple[list[str], int]:
    """(texts already written, next serial number); cuts a torn last line first (a kill mid-write).

    A bad line before the last one is an error naming the line: the file was damaged or is not ours."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return [], 0
    hint = "pass a new --out file, or delete this one (a rerun then starts over)"
    records = [
        rec for _, rec in read_jsonl(path, _self_prompt_record(path, hint), what="self-prompt file", hint=hint, torn_last=True)
    ]
    return [text for text, _ in records], max((number + 1 for _, number in records), default=0)


def synthesize_prompts(
    model,
    tokenizer,
    out_path: Path,
    n: int,
    batch_size: int = 512,
    max_new_tokens: int = 160,
    temperature: float = 1.0,
    min_p: float = 0.05,
    time_budget_s: float = 0.0,
    seed: int = 0,
    log=print,
) -> dict:
    """Sample until `out_path` holds n distinct acceptable requests (or the time budget ends)."""
    # heavy, optional (torch): imported only where it is used
    import torch

    # heavy, optional (torch): imported only where it is used
    from speclock.train.fastgen import StaticLlamaGenerator

    if n <= 0:
        raise BadInput(f"-n must be positive (got {n})")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    texts, serial = _read_existing(out_path)
    seen = {_fold(t) for t in texts}
    prefix = user_turn_prefix(tokenizer)
    gen = StaticLlamaGenerator(
        model,
        tokenizer,
        batch_size,
        len(prefix),
        max_new_tokens,
        temperature=temperature,
        min_p=min_p,
        stop_ids=user_turn_end(tokenizer),
    )
    stop = set(gen.stop)
    # A different stream per rerun, so a resumed run does not redraw the requests it already has.
    torch.manual_seed(seed * 1000003 + serial)
    stats = {"sampled": 0, "unfinished": 0, "rejected": 0, "duplicates": 0}
    t0 = time.perf_counter()
    start = len(texts)
    with open(out_path, "a", encoding="utf-8") as f:
        while len(texts) < n:
            if time_budget_s and time.perf_counter() - t0 > time_budget_s:
                log(f"self-prompts: time budget of {time_budget_s:.0f}s reached at {len(texts)}/{n}")
                break
            rows = gen.generate([prefix] * batch_size)
            lines = []
            for row in rows:
                stats["sampled"] += 1
                if not row or row[-1] not in stop:
                    stats["unfinished"] += 1
                    continue
                text = tokenizer.decode(row[:-1], skip_special_tokens=True).strip()
                if not acceptable(text):
                    stats["rejected"] += 1
                    continue
                key = _fold(text)
                if key in seen:
                    stats["duplicates"] += 1
                    continue
                seen.add(key)
                texts.append(text)
                lines.append(json.dumps({"id": f"self:{serial}", "conversations": [{"from": "human", "value": text}]}) + "\n")
                serial += 1
                if len(texts) >= n:
                    break
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
            log(
                f"self-prompts: {len(texts)}/{n} ({stats['sampled']} sampled, {stats['duplicates']} duplicates, "
                f"{stats['unfinished']} unfinished, {stats['rejected']} rejected) {time.perf_counter() - t0:.0f}s"
            )
    seconds = time.perf_counter() - t0
    return {
        "prompts": len(texts),
        "new": len(texts) - start,
        "seconds": round(seconds, 1),
        **stats,
        "temperature": temperature,
        "min_p": min_p,
        "max_new_tokens": max_new_tokens,
        "prefix_tokens": len(prefix),
    }
