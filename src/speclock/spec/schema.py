"""The stack file's field table (SCHEMA), its faults in a stack's words, and its JSON Schema, all derived from the
model (spec.stack_types.StackDoc, #38): `speclock stack schema` prints the schema, `speclock schemas` writes it to
schemas/stack.schema.json, and spec.validate checks a stack with STACK.

SCHEMA: section ('' = top level, 'smoke.thresholds' nested) -> key -> (kind, required, default, description,
allowed), for the code that asks about one key (spec.path_keys, the tests); nothing writes it by hand.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Final, Literal, NotRequired, get_args, get_origin

from speclock.core.docmodel import DocModel, Fault, Key, dotted
from speclock.core.docmodel import json_schema as model_schema
from speclock.core.files import json_type, short_repr
from speclock.spec.stack_types import ARCH_MIN_CUDA as ARCH_MIN_CUDA
from speclock.spec.stack_types import KNOWN_ENGINES as KNOWN_ENGINES
from speclock.spec.stack_types import KNOWN_KERNELS as KNOWN_KERNELS
from speclock.spec.stack_types import SmokeProfiles, SmokeThresholds, StackDoc

STACK_SCHEMA_ID: Final = "speclock.stack/1"  # a stack's `schema` key is 1
STACK_HINT: Final = "see `speclock stack schema` (or schemas/stack.schema.json) for every key"

Field = tuple[str, bool, object, str, list[object] | None]  # (kind, required, default, description, allowed)
_NESTED = {"profiles": SmokeProfiles, "thresholds": SmokeThresholds}  # smoke's sub-tables: sections "smoke.<key>"


def _kind(hint: Any) -> tuple[str, list[object] | None]:
    """("str", "list[str]", "int", "float", "list[float]", "list[list[int]]" or "table"; the allowed values or None)."""
    origin = get_origin(hint)
    if origin is Literal:
        values = list(get_args(hint))
        return ("int" if isinstance(values[0], int) else "str"), values
    if origin is list:
        inner, allowed = _kind(get_args(hint)[0])
        return f"list[{inner}]", allowed
    if origin is dict:
        return "table", None
    return {str: "str", int: "int", float: "float", bool: "bool"}[hint], None


def _fields(model: type) -> dict[str, Field]:
    out: dict[str, Field] = {}
    for key, hint in typing.get_type_hints(model, include_extras=True).items():
        # (the hint, not __required_keys__: with postponed annotations a TypedDict cannot see NotRequired itself)
        required = get_origin(hint) is not NotRequired
        if not required:
            hint = get_args(hint)[0]
        args = get_args(hint) if get_origin(hint) is Annotated else (hint,)
        inner, key_info = args[0], next((m for m in args[1:] if isinstance(m, Key)), Key())
        if isinstance(inner, type) and hasattr(inner, "__required_keys__"):
            continue  # a section: a table of its own
        kind, allowed = _kind(inner)
        allowed = list(key_info.only) if key_info.only else allowed
        out[key] = (kind, required, None if required else key_info.default, key_info.doc, allowed)
    return out


_SECTIONS: dict[str, type] = {
    name: hint
    for name, hint in typing.get_type_hints(StackDoc).items()
    if isinstance(hint, type) and hasattr(hint, "__required_keys__")
}
# the sections a stack may leave out (every key of theirs has a default)
OPTIONAL_SECTIONS: Final = frozenset(
    name for name, hint in typing.get_type_hints(StackDoc, include_extras=True).items() if get_origin(hint) is NotRequired
) | {f"smoke.{name}" for name in _NESTED}
SCHEMA: Final[dict[str, dict[str, Field]]] = {
    "": _fields(StackDoc),
    **{name: _fields(model) for name, model in _SECTIONS.items()},
    **{f"smoke.{name}": _fields(model) for name, model in _NESTED.items()},
}


def _table(path: list[str | int]) -> tuple[str, str]:
    """(the section, the key) a key path names in SCHEMA's terms: ['smoke', 'thresholds', 'min_speedup', ...] is
    ("smoke.thresholds", "min_speedup"); list positions and deeper keys of a table are dropped."""
    keys = [p for p in path if isinstance(p, str)]
    if len(keys) >= 2 and f"{keys[0]}.{keys[1]}" in SCHEMA:
        return f"{keys[0]}.{keys[1]}", (keys[2] if len(keys) > 2 else "")
    if keys and keys[0] in SCHEMA:
        return keys[0], (keys[1] if len(keys) > 1 else "")
    return "", (keys[0] if keys else "")


def _phrase(fault: Fault) -> tuple[str, str] | None:
    """A stack's words for a fault: "unknown key", "unknown section", "'tgi' is not allowed", "missing", "expected
    a table [engine]", with the hint `allowed: ...` (what the key takes, from the model)."""
    key = dotted(fault.path)
    section, name = _table(fault.path)
    sections = "sections " + ", ".join(s for s in SCHEMA if s)
    field = SCHEMA.get(section, {}).get(name)
    about = f"{field[0]}: {field[3]}" if field else ""
    see = ". See `speclock stack schema`."
    if fault.kind == "extra_forbidden":
        if len(fault.path) == 1 and isinstance(fault.found, dict):
            return f"key '{key}': unknown section", f"allowed: {sections}{see}"
        parent = dotted(fault.path[:-1])
        return f"key '{key}': unknown key", f"allowed: {', '.join(SCHEMA.get(parent, SCHEMA.get(section, {})))}{see}"
    if len(fault.path) == 1 and key in _SECTIONS:  # a section that is missing, or no table
        if not fault.present:
            return f"key '{key}': missing", f"allowed: a [{key}] section{see}"
        return (
            f"key '{key}': expected a table [{key}], got {json_type(fault.found)} {short_repr(fault.found)}",
            f"allowed: a [{key}] section{see}",
        )
    if fault.kind == "literal_error" and field and field[4] is not None:
        return f"key '{key}': {fault.found!r} is not allowed", f"allowed: {', '.join(map(str, field[4]))}{see}"
    if not fault.present:
        return f"key '{key}': missing", f"allowed: {about or fault.want}{see}"
    want = fault.want or (field[0] if field else "another value")
    return (
        f"key '{key}': expected {want}, got {json_type(fault.found)} {short_repr(fault.found)}",
        f"allowed: {about or want}{see}",
    )


STACK = DocModel(
    StackDoc,
    STACK_SCHEMA_ID,
    "stack.schema.json",
    "speclock stack file",
    "refuse",
    STACK_HINT,
    refuse_why="a stack is written by people, and a misspelled key passed over would leave its setting at the default",
    phrase=_phrase,
    inline=True,  # editors (taplo, Even Better TOML) and `speclock stack schema` readers take it without $refs
)


def json_schema() -> dict[str, Any]:  # a JSON Schema document: open-ended by nature
    """The JSON Schema of stack files (draft 2020-12, no $refs), generated from the model (editors validate TOML with it)."""
    return model_schema(STACK)
