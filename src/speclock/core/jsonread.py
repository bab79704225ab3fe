"""JSON text to Python data: the one parser, for files (through `files.read_json`) and for what is not a file
(engines' and registries' replies, subprocess output, envelope payloads, JSONL lines).

It refuses what no input of speclock needs and what would hurt a reader: text over MAX_READ_BYTES, an object with
a key twice (json keeps the last one silently, other readers the first), and nesting deeper than MAX_DEPTH (the
parser and every reader after it recurse; deep enough, that is a RecursionError). `loads` raises ValueError, as
json does, so a caller that catches json's errors keeps its message; `parse_json` raises the caller's error class
naming the source.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import math
import os
import re
from itertools import accumulate
from typing import Any, NoReturn

from speclock.core.errors import BadInput, SpeclockError

# No JSON or text that speclock writes comes near this (a full smoke report is ~1 MB, a lock ~0.5 MB): a bigger
# file is not one of ours, and reading it whole would cost several times its size in memory.
MAX_READ_BYTES = 64 << 20

# Nothing speclock reads nests past ~10 levels (a report's deepest is 6); 100 leaves room and stays far below
# Python's recursion limit in every reader of the data.
MAX_DEPTH = 100


class JSONRefused(ValueError):
    """JSON refused before or while parsing: too big, too deep, a key twice. `msg` completes "the JSON ..."."""

    def __init__(self, msg: str, *, hint: str, lineno: int | None = None):
        super().__init__(f"the JSON {msg}" + (f" (line {lineno})" if lineno else ""))
        self.msg = msg
        self.hint = hint
        self.lineno = lineno


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


# Any in this module: parsed JSON is open-ended until the caller checks its shape (files.expect, a reader's checks).


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:  # one JSON object, any keys and values
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"{literal} is not a finite number")
    return value


# A string token, linear whatever the text (possessive loops; an unterminated string runs to the end of the text).
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _check_depth(text: str, max_depth: int) -> None:
    if text.count("[") + text.count("{") <= max_depth:  # cannot nest deeper than it has brackets
        return
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if max(accumulate(map(_STEP.__getitem__, brackets)), default=0) <= max_depth:
        return
    depth, line = 0, None
    for m in re.finditer(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)|[\[\]{}]', text, re.S):
        if m[0][0] != '"':
            depth += _STEP[m[0]]
            if depth > max_depth:
                line = text.count("\n", 0, m.start()) + 1
                break
    raise JSONRefused(
        f"nests deeper than {max_depth} levels",
        hint=f"no file speclock reads nests that deep: give the file speclock wrote (at most {max_depth} levels)",
        lineno=line,
    )


def _check_size(text: str | bytes | bytearray, max_bytes: int) -> None:
    size = len(text)
    if isinstance(text, str) and max_bytes // 4 < size <= max_bytes:  # UTF-8 takes up to 4 bytes a character
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise JSONRefused(
            f"is {size / 2**20:.1f} MiB, more than the {max_bytes / 2**20:.0f} MiB speclock reads",
            hint="no JSON speclock reads is that big: give the file speclock wrote",
        )


def _duplicate_line(text: str, key: str) -> int | None:
    """The line of the repeated `key` (an error path: parses again with json's pure-Python scanner, which
    tells where each object starts)."""
    starts: list[int] = []
    decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates)

    def parse_object(s_and_end: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        starts.append(s_and_end[1])
        result = json.decoder.JSONObject(s_and_end, *args, **kwargs)  # type: ignore[attr-defined]
        starts.pop()
        return result

    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    try:
        decoder.decode(text)
    except _DuplicateKey:
        return _second_key_line(text, starts[-1], key) if starts else None
    except Exception:  # only a line number is at stake here
        return None
    return None


_WS = re.compile(r"[ \t\n\r]*")


def _skip_ws(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    return m.end() if m else pos


def _second_key_line(text: str, start: int, key: str) -> int | None:
    """Walk the object that starts at `start` (after its '{') to the second `key`."""
    plain = json.JSONDecoder()
    seen = False
    pos = _skip_ws(text, start)
    while pos < len(text) and text[pos] == '"':
        name, end = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
        if name == key:
            if seen:
                return text.count("\n", 0, pos) + 1
            seen = True
        pos = _skip_ws(text, _skip_ws(text, end) + 1)  # past the ':'
        _, pos = plain.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
    return None


def loads(
    text: str | bytes | bytearray, *, max_bytes: int = MAX_READ_BYTES, max_depth: int = MAX_DEPTH, allow_nan: bool = True
) -> Any:
    """json.loads, refusing text over `max_bytes`, nesting over `max_depth` and a key twice in an object (JSONRefused,
    a ValueError). allow_nan=False refuses NaN, Infinity and numbers too big for a float, as no JSON holds them."""
    _check_size(text, max_bytes)
    if not isinstance(text, str):
        text = bytes(text).decode(json.detect_encoding(text), "surrogatepass")  # as json.loads does with bytes
    _check_depth(text, max_depth)
    try:
        return json.loads(  # json.loads passes on only the hooks that are not None
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=None if allow_nan else _no_constant,
            parse_float=None if allow_nan else _finite_float,
        )
    except _DuplicateKey as dup:
        raise JSONRefused(
            f"has the key {dup.key!r} twice in one object",
            hint="keep one of the two (JSON readers differ on which one they take)",
            lineno=_duplicate_line(text, dup.key),
        ) from None


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)


def decode_at(text: str, pos: int, *, max_depth: int = MAX_DEPTH) -> tuple[Any, int]:
    """(the JSON value that starts at `pos`, where it ends): a stream of records read piece by piece, each under the
    rules of `loads`; the caller caps what it reads. ValueError (JSONRefused for a key twice or deep nesting)."""
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise JSONRefused(f"nests deeper than {max_depth} levels", hint="give the file speclock wrote") from None
    except _DuplicateKey as dup:
        raise JSONRefused(f"has the key {dup.key!r} twice in one object", hint="keep one of the two") from None
    _check_depth(text[pos:end], max_depth)
    return value, end


def parse_json(
    text: str | bytes | bytearray,
    path: str | os.PathLike[str],
    *,
    what: str = "JSON file",
    expect: type | tuple[type, ...] = dict,
    hint: str | None = None,
    error: type[SpeclockError] = BadInput,
    allow_nan: bool = False,
    max_bytes: int = MAX_READ_BYTES,
) -> Any:
    """Parse JSON text from `path` (a file, or what names a source that is not one: a URL, a command) and check its
    top-level type (expect=object: any). Every refusal is `error` naming `path`: BadInput for what the user gave,
    the caller's class for an engine's, a registry's or a tool's reply. NaN and Infinity are refused unless allowed."""
    fix = hint or f"fix the {what} or write it again with the command that made it"
    try:
        data = loads(text, max_bytes=max_bytes, allow_nan=allow_nan)
    except json.JSONDecodeError as err:
        where = _at(path, err.lineno, err.colno)
        raise error(f"{where}: the {what} is not valid JSON: {err.msg}", hint=fix) from None
    except JSONRefused as err:
        raise error(f"{_at(path, err.lineno)}: the {what} {err.msg}", hint=hint or err.hint) from None
    except (ValueError, RecursionError) as err:
        raise error(f"{path}: the {what} is not valid JSON: {err}", hint=fix) from None
    if not isinstance(data, expect):
        raise error(
            f"{path}: the {what} holds a JSON {json_type(data)}, where {type_names(expect)} belongs",
            hint=hint or f"give the {what} that speclock wrote",
        )
    return data


def _at(source: str | os.PathLike[str], line: int | None, column: int | None = None) -> str:
    """file:line:column for a file; a URL or a command (it has '://' or a space) gets its line in words."""
    name = str(source)
    if line is None:
        return name
    if "://" in name or " " in name:
        return f"{name} (line {line}" + (f", column {column})" if column else ")")
    return f"{name}:{line}" + (f":{column}" if column else "")


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def type_names(expect: type | tuple[type, ...]) -> str:
    types = expect if isinstance(expect, tuple) else (expect,)
    return " or ".join(_NAMES.get(t, "null" if t is type(None) else t.__name__) for t in types)
