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
