"""The stack model's checks where pydantic is not installed: a host environment whose engine brings none (speclock's
own tests build such environments from tiny wheels), where `bin/speclock stack check` and doctor still read a stack.

Everything here comes from the model through spec.schema.SCHEMA (types, required keys, defaults, allowed values):
nothing about a key is written twice. The words are the model's (spec.schema's wording of a fault), so a stack is
refused the same way, exit 2 naming the file and the key, with pydantic or without. Where pydantic is installed
(every engine's environment, speclock's own) spec.validate uses the model through pydantic instead.
"""

from __future__ import annotations

import copy
from typing import Any

from speclock.core.errors import BadInput
from speclock.core.files import json_type, short_repr
from speclock.spec.schema import OPTIONAL_SECTIONS, SCHEMA


def _fits(kind: str, value: Any) -> bool:
    """Whether `value` is of SCHEMA's `kind` (strict: bool is no number; an int is a float; finiteness was checked)."""
    if kind.startswith("list[") and kind.endswith("]"):
        return isinstance(value, list) and all(_fits(kind[5:-1], v) for v in value)
    if kind in ("int", "float"):
        return isinstance(value, int if kind == "int" else (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"str": str, "bool": bool, "table": dict}[kind])


def check_plain(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """`raw` checked against SCHEMA: the validated copy, shaped as pydantic gives it (nested tables, defaults filled
    in); BadInput naming the file and the first key at fault otherwise."""

    def bad(key: str, problem: str, allowed: str) -> BadInput:
        return BadInput(f"{source}: key '{key}': {problem}", hint=f"allowed: {allowed}. See `speclock stack schema`.")

    def table(section: str, body: dict[str, Any]) -> dict[str, Any]:
        prefix = f"{section}." if section else ""
        fields = SCHEMA[section]
        for key, value in body.items():
            if key not in fields and f"{prefix}{key}" not in SCHEMA:
                if not section and isinstance(value, dict):
                    raise bad(key, "unknown section", "sections " + ", ".join(s for s in SCHEMA if s))
                raise bad(f"{prefix}{key}", "unknown key", ", ".join(fields))
        out: dict[str, Any] = {}
        for key, (kind, required, default, desc, allowed) in fields.items():
            if key not in body:
                if required:
                    raise bad(f"{prefix}{key}", "missing", f"{kind}: {desc}")
                out[key] = copy.deepcopy(default)
                continue
            value = body[key]
            if not _fits(kind, value):
                got = f"{json_type(value)} {short_repr(value)}"
                raise bad(f"{prefix}{key}", f"expected {kind}, got {got}", f"{kind}: {desc}")
            for v in value if isinstance(value, list) else [value]:
                if allowed is not None and (v not in allowed or isinstance(v, bool)):
                    raise bad(f"{prefix}{key}", f"{v!r} is not allowed", ", ".join(map(str, allowed)))
            out[key] = value
        for name in [s for s in SCHEMA if s and s.rpartition(".")[0] == section]:  # the sections inside this one
            key = name.rpartition(".")[2]
            if key not in body and name not in OPTIONAL_SECTIONS:
                raise bad(name, "missing", f"a [{name}] section")
            inner = body.get(key, {})
            if not isinstance(inner, dict):
                raise bad(name, f"expected a table [{name}], got {json_type(inner)} {short_repr(inner)}", f"a [{name}] section")
            out[key] = table(name, inner)
        return out

    return table("", raw)
