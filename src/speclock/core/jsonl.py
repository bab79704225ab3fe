"""The one JSONL reader: records with their line numbers, a check per record, and the torn-last-line rule.

Resumable outputs (appended line by line, so a kill can leave half a line) pass `torn_last=True`:
an unterminated last line is cut off the file (and with `bad_last_is_torn`, a complete last line the
check refuses is too). Any other line the check refuses is BadInput naming file:line, exit 2.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from speclock.core.errors import BadInput
from speclock.core.files import os_error, read_bytes

_R = TypeVar("_R")


def split_lines(data: bytes) -> list[bytes]:
    """Lines split at b"\\n" only (the JSONL separator), each with its newline; the last may lack it."""
    parts = data.split(b"\n")
    return [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def read_jsonl(
    path: str | os.PathLike[str],
    check: Callable[[bytes, int], _R],
    *,
    what: str = "JSONL file",
    hint: str | None = None,
    torn_last: bool = False,
    bad_last_is_torn: bool = False,
) -> list[tuple[int, _R]]:
    """[(line number, check(line, line number))] for each non-blank line of `path`.

    `check` gets the raw line (bytes, with its newline) and raises BadInput naming `path:lineno`
    to refuse it. With `torn_last`, a last line without its newline is cut off the file instead
    of read; with `bad_last_is_torn` as well, so is a last line that `check` refuses.
    """
    path = Path(path)
    data = read_bytes(path, what=what, hint=hint)
    lines = split_lines(data)
    out: list[tuple[int, _R]] = []
    good = 0
    for lineno, line in enumerate(lines, 1):
        last = lineno == len(lines)
        if torn_last and last and not line.endswith(b"\n"):
            break
        if line.strip():
            try:
                out.append((lineno, check(line, lineno)))
            except BadInput:
                if not (torn_last and bad_last_is_torn and last):
                    raise
                break
        good += len(line)
    if good != len(data):
        try:
            with open(path, "r+b") as f:
                f.truncate(good)
        except OSError as err:
            raise os_error(err, path, "cut the torn last line of") from None
    return out
