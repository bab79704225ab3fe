"""TOML text for a stack document written by speclock (`stack new`): sections in order, dotted sections
('smoke.thresholds') as [smoke.thresholds], tables inside a section inline, a comment line above a section.

The standard library reads TOML but does not write it; a stack holds only strings, numbers, booleans, lists and
tables, so this writer covers exactly those (spec.validate reads the result back before it is kept)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v} has no place in a stack file")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(str(k))} = {value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"{type(v).__name__} has no place in a stack file")


# dict[str, Any]: any TOML document (a stack file, a pylock); `value` refuses what TOML cannot hold.
def dumps(doc: dict[str, Any], comments: dict[str, str] | None = None) -> str:
    """`doc`: top-level keys with plain values, then sections (dicts) by name, dotted names for nested sections."""
    comments = comments or {}
    lines = [f"{_key(k)} = {value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for name, body in doc.items():
        if not isinstance(body, dict):
            continue
        lines.append("")
        if name in comments:
            lines.append(f"# {comments[name]}")
        lines.append(f"[{'.'.join(_key(p) for p in name.split('.'))}]")
        lines += [f"{_key(k)} = {value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- documents of tables (pylock.toml)
def _string(s: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped, the rest as it is."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif (ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\n": "\\n", "\f": "\\f", "\r": "\\r"}  # a tab stays a tab


def _literal(v: Any, level: int) -> str:
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):  # one item a line, indented by level, a comma after each
        if not v:
            return "[]"
        pad = "    " * (level + 1)
        return "[\n" + "".join(f"{pad}{_literal(x, level + 1)},\n" for x in v) + "    " * level + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_table_key(str(k))} = {_literal(x, level)}" for k, x in v.items()) + " }" if v else "{}"
    return value(v)


def _table_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _is_tables(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _chunks(table: dict[str, Any], name: str, array_item: bool) -> list[str]:
    literals = [(k, v) for k, v in table.items() if not isinstance(v, dict) and not _is_tables(v)]
    nested = [(k, v) for k, v in table.items() if isinstance(v, dict) or _is_tables(v)]
    out = []
    if not name:
        if literals:
            out.append("".join(f"{_table_key(k)} = {_literal(v, 0)}\n" for k, v in literals))
    elif array_item or literals or not nested:  # a table holding only tables needs no header of its own
        head = f"[[{name}]]\n" if array_item else f"[{name}]\n"
        out.append(head + "".join(f"{_table_key(k)} = {_literal(v, 0)}\n" for k, v in literals))
    for k, v in nested:
        sub = f"{name}.{_table_key(k)}" if name else _table_key(k)
        if isinstance(v, dict):
            out += _chunks(v, sub, False)
        else:
            for item in v:
                out += _chunks(item, sub, True)
    return out


def dumps_tables(doc: dict[str, Any]) -> str:
    """TOML text of a document of nested tables and arrays of tables (a pylock.toml): top-level values first, then
    each table under its dotted [header] ([[header]] for an array of tables) with its values, a blank line between
    tables, arrays one item a line. Written here so that `lock` needs nothing beyond the standard library (a GPU
    host's Python may have no TOML writer: 2026-12-07, H100)."""
    return "\n".join(_chunks(doc, "", False))
