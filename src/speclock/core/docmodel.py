"""A document's typed model put to work: validating what core.jsonread parsed, and writing the JSON Schema.

A model is a TypedDict (speclock.verify.report_types, speclock.spec.lock_types); pydantic validates a parsed
document against it, strict: no coercion ("3" is no int), bool is no number, an int is a number, numbers are
finite. Its errors carry the location of each fault, and `validate` turns the first into speclock's message: the file, the dotted key path
(`metrics.accepted_per_position[1]`), what was found there, what belongs there (read from the model's own JSON
Schema) and the fix (the document's hint).

A key the model does not know is decided per document (`DocModel.unknown`, written into its schema): "warn" (a
newer speclock's key: a WARN naming it, the key ignored) or "refuse" (exit 2 naming it).

pydantic is imported on first use: commands that read no document (--help) do not pay for it. A stack that fits is
checked through its model's field table without pydantic (spec.validate.check_types: every command reads one). A list
stops at its first bad item, so a huge bad document costs one error per list, not one per value; a key in a list
of objects that the model does not know is named for the first object that holds it.
"""

from __future__ import annotations

import importlib
import json
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import atomic_write_text, short_repr
from speclock.core.jsonread import json_type

# A model's TypedDict: pydantic reads typing.TypedDict only from Python 3.12 on, so typing_extensions' where it is
# installed (pydantic needs it: wherever a document is validated, it is). speclock also runs where neither is (a
# host environment's bin/speclock with an engine's packages only): the models are then plain TypedDicts.
if TYPE_CHECKING:
    from typing_extensions import TypedDict as TypedDict
else:
    try:
        TypedDict = importlib.import_module("typing_extensions").TypedDict
    except ImportError:  # no pydantic either: nothing validates against a model here
        TypedDict = typing.TypedDict

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMAS_DIR = "schemas"  # in speclock's source tree: the generated files, one per document
_NO_DEFAULT: Any = object()


@dataclass(frozen=True)
class Key:
    """A model key's default and description, as `Annotated[int, Key(80, "prompts per run")]` (a NotRequired key with
    a default is filled in by `validate`'s output; the default is validated too, so a section's default {} gets its
    keys' defaults). Defining it needs no pydantic: pydantic asks it for its schemas when it builds a validator."""

    default: Any = _NO_DEFAULT
    doc: str = ""
    # the only values of a key of the type given (a Literal[1] would take True and 1.0, which equal 1): a wrong one
    # is a literal_error, as a Literal's
    only: tuple[Any, ...] = ()

    def __get_pydantic_core_schema__(self, source: Any, handler: Callable[[Any], Any]) -> Any:
        schema = handler(source)
        from pydantic_core import PydanticCustomError, core_schema  # with pydantic: see adapter()

        if self.only:
            only = self.only

            def one_of(value: Any) -> Any:
                if value not in only:
                    raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": repr(only)})
                return value

            schema = core_schema.no_info_after_validator_function(one_of, schema)
        if self.default is _NO_DEFAULT:
            return schema
        return core_schema.with_default_schema(schema, default=self.default, validate_default=True)

    def __get_pydantic_json_schema__(self, schema: Any, handler: Callable[[Any], Any]) -> Any:
        out = dict(handler(schema))
        if self.doc:
            out["description"] = self.doc
        if self.only:
            out.update({"const": self.only[0]} if len(self.only) == 1 else {"enum": list(self.only)})
        return out


@dataclass(frozen=True)
class Fault:
    """The first fault `validate` found, for a document that words its own messages (`DocModel.phrase`)."""

    kind: str  # pydantic's error type: "missing", "extra_forbidden", "literal_error", "string_type", ...
    path: list[str | int]  # the key path, as far as the document has it
    found: Any  # the value there (None when not present)
    present: bool
    want: str  # what the model puts there, in words ("" where the path leaves the model)


@dataclass(frozen=True)
class DocModel:
    """One document: its model, its schema id (the value of its `schema` key) and file, and its unknown-key rule."""

    model: type
    schema_id: str
    schema_file: str  # under schemas/; "" for a document whose schema is not published
    title: str
    unknown: Literal["warn", "refuse"]
    hint: str  # the fix, for every refusal
    # how a message names a key and its fault: "key 'a.b[1]': expected integer, got string ('x')", or in
    # core.files.expect's words "a.b[1] is string ('x'), where integer belongs" ("path"; "quoted-path": "key 'a.b[1]'
    # is ..."), for documents whose readers said so before their model
    wording: Literal["key", "path", "quoted-path"] = "key"
    id_key: str = "schema"  # the key whose value is schema_id (an in-toto statement's: predicateType)
    refuse_why: str = "a reader that skipped a key it does not know could misread the verdict"  # the schema says it
    # the document's own words for a fault: (the message after the file's name, the hint), or None for the wording's
    phrase: Callable[[Fault], tuple[str, str] | None] | None = None
    inline: bool = False  # the published schema with every $ref replaced by what it names (editors read it so)

    def config(self) -> dict[str, Any]:
        # pydantic's ConfigDict is a TypedDict: a plain dict here, so defining a model needs no pydantic.
        # Nested models inherit it; one with its own __pydantic_config__ (ReferenceMetrics) keeps that.
        return {"strict": True, "allow_inf_nan": False, "extra": "forbid"}


_ADAPTERS: dict[type, Any] = {}
_VALIDATORS: dict[tuple[type, str], Any] = {}


def adapter(doc: DocModel) -> Any:
    """The pydantic TypeAdapter of the document's model, built once per process."""
    found = _ADAPTERS.get(doc.model)
    if found is None:
        try:
            # pydantic: 0.2-0.3 s to import and 0.3-0.5 s to build a report's validator on this loaded 2-core machine
            # (docs/benchmarks.md, "Document models (#38)"), paid only where a document is read
            from pydantic import TypeAdapter
        except ImportError:
            raise EnvironmentProblem(
                f"pydantic is not installed here, and speclock checks a {doc.title} against its model with it",
                hint="install speclock's dependencies (`pip install 'pydantic>=2.14.4'`; every engine's environment has it)",
            ) from None

        doc.model.__pydantic_config__ = doc.config()  # type: ignore[attr-defined]
        found = _ADAPTERS[doc.model] = TypeAdapter(doc.model)
    return found


def _tuned(node: Any, extra: str) -> Any:
    """A copy of a pydantic-core schema where every list stops at its first bad item (a 64 MiB report of wrong
    tokens would otherwise make millions of errors: minutes and gigabytes) and, with extra="ignore", the
    models that forbid unknown keys ignore them instead."""
    if isinstance(node, list):
        return [_tuned(v, extra) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _tuned(v, extra) for k, v in node.items()}
    if out.get("type") == "list":
        out["fail_fast"] = True
    if extra == "ignore" and out.get("type") == "typed-dict" and out.get("extra_behavior") == "forbid":
        out["extra_behavior"] = "ignore"
    return out


def validator(doc: DocModel, extra: str = "forbid") -> Any:
    """The model's pydantic-core validator: unknown keys are errors ("forbid") or passed over ("ignore")."""
    found = _VALIDATORS.get((doc.model, extra))
    if found is None:
        core_schema = _tuned(adapter(doc).core_schema, extra)  # first: EnvironmentProblem without pydantic
        from pydantic_core import SchemaValidator  # with pydantic: see adapter()

        found = _VALIDATORS[(doc.model, extra)] = SchemaValidator(core_schema)
    return found


def dotted(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "(top level)"


def _resolve(data: Any, loc: tuple[str | int, ...], missing: bool) -> tuple[list[str | int], Any, bool]:
    """The key path an error location names in `data`, the value found there, and whether it was found.

    pydantic adds the name of the union branch it tried (`float`, `list[float]`) to a location: a part that is
    no key of the value reached ends the path there."""
    node: Any = data
    path: list[str | int] = []
    for i, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif missing and i == len(loc) - 1 and isinstance(node, dict):
            return [*path, part], None, False
        else:
            break
        path.append(part)
    return path, node, True


def _deref(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = root["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _child(root: dict[str, Any], node: dict[str, Any], part: str | int) -> dict[str, Any] | None:
    node = _deref(root, node)
    for branch in node.get("anyOf", [node]):
        branch = _deref(root, branch)
        found: Any = None
        if isinstance(part, int):
            found = branch.get("items")
        elif part in branch.get("properties", {}):
            found = branch["properties"][part]
        else:
            found = branch.get("additionalProperties")
        if isinstance(found, dict):
            return found
    return None


_JSON_NAMES = {"integer": "integer", "number": "number", "string": "string", "boolean": "true or false", "null": "null"}


def _describe(root: dict[str, Any], node: dict[str, Any]) -> str:
    """What a schema node admits, in words: "integer or null", "array of integer", "'pass' or 'fail'"."""
    node = _deref(root, node)
    if "anyOf" in node:
        return " or ".join(dict.fromkeys(_describe(root, b) for b in node["anyOf"]))
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return " or ".join(json.dumps(v) for v in node["enum"])
    kind = node.get("type")
    if kind == "array":
        items = node.get("items")
        return f"array of {_describe(root, items)}" if isinstance(items, dict) and items else "array"
    if kind == "object":
        return f"object ({node['title']})" if node.get("properties") and node.get("title") else "object"
    return _JSON_NAMES.get(str(kind), "any JSON value")


def expected_at(doc: DocModel, path: list[str | int]) -> str:
    """What the model puts at a key path, in words ("" where the path leaves the model)."""
    root = json_schema(doc, plain=True)
    node: dict[str, Any] | None = root
    for part in path:
        node = _child(root, node, part) if node is not None else None
    return _describe(root, node) if node is not None else ""


def _problem(doc: DocModel, data: Any, err: Mapping[str, Any]) -> tuple[str, str, str]:
    """(dotted key path, the message after the file's name, the hint) for one pydantic error, in the document's
    wording."""
    key, message = _worded(doc, data, err)
    if doc.phrase is not None:
        path, found, present = _resolve(data, tuple(err["loc"]), missing=err["type"] == "missing")
        own = doc.phrase(Fault(err["type"], path, found, present, expected_at(doc, path)))
        if own is not None:
            return key, own[0], own[1]
    return key, message, doc.hint


def _worded(doc: DocModel, data: Any, err: Mapping[str, Any]) -> tuple[str, str]:
    kind = err["type"]
    path, found, present = _resolve(data, tuple(err["loc"]), missing=kind == "missing")
    want = expected_at(doc, path)
    key = dotted(path)
    if kind == "extra_forbidden":
        published = f" ({SCHEMAS_DIR}/{doc.schema_file})" if doc.schema_file else ""
        return key, f"key '{key}': not a key of {doc.schema_id}{published}"
    if doc.wording != "key":  # core.files.expect's words, which this document's readers used before its model
        if not present:
            where = f"{dotted(path[:-1])}: " if len(path) > 1 else ""
            return key, f"{where}key '{path[-1]}' is missing" + (f" ({want} belongs there)" if want else "")
        name = key if doc.wording == "path" else f"key '{key}'"
        if kind == "finite_number":
            return key, f"{name} is {found}, where a finite number belongs"
        return key, f"{name} is {json_type(found)} {short_repr(found)}, where {want or err['msg']} belongs"
    if not present:
        return key, f"key '{key}': missing" + (f" ({want} belongs there)" if want else "")
    if kind == "finite_number":
        return key, f"key '{key}': {found} is not a finite number"
    return key, f"key '{key}': expected {want or err['msg']}, got {json_type(found)} {short_repr(found)}"


def validate(doc: DocModel, data: Any, source: str, warn: Callable[[str], None] | None = None) -> Any:
    """Check a parsed document against its model: BadInput naming the file, the key path, what was found and what
    belongs there; an unknown key is a WARN passed to `warn` ("warn" documents) or BadInput ("refuse").

    Returns the validated copy (unknown keys left out, Key defaults filled in, a float key's int as a float); readers
    that need no defaults keep the document they passed."""
    check = validator(doc)  # first: EnvironmentProblem where pydantic is not installed
    from pydantic_core import ValidationError  # with pydantic: see adapter()

    try:
        return check.validate_python(data)
    except ValidationError as err:
        errors = err.errors(include_url=False, include_context=False, include_input=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    wrong = [e for e in errors if e["type"] != "extra_forbidden"] or (unknown if doc.unknown == "refuse" else [])
    out: Any = None
    if not wrong:
        # Only unknown keys so far, but a list stops at its first bad item, unknown keys included: check every item
        # again with unknown keys passed over (a second pass only for documents that hold unknown keys).
        try:
            out = validator(doc, "ignore").validate_python(data)
        except ValidationError as err:
            wrong = err.errors(include_url=False, include_context=False, include_input=False)
    if wrong:
        key, problem, hint = _problem(doc, data, wrong[0])
        others = {dotted(_resolve(data, tuple(e["loc"]), e["type"] == "missing")[0]) for e in wrong[1:]} - {key}
        more = (
            f" (and {len(others)} more key{'s' if len(others) > 1 else ''}: {', '.join(sorted(others)[:3])}{', ...' if len(others) > 3 else ''})"
            if others
            else ""
        )
        raise BadInput(f"{source}: {problem}{more}", hint=hint)
    for e in unknown:
        key = dotted(_resolve(data, tuple(e["loc"]), False)[0])
        (warn or _stderr_warn)(f"{source}: key '{key}' is not in {doc.schema_id} (written by a newer speclock?): ignored")
    return out


def _stderr_warn(message: str) -> None:
    print(f"WARN: {message}", file=sys.stderr)


_SCHEMAS: dict[tuple[type, bool], dict[str, Any]] = {}


def json_schema(doc: DocModel, *, plain: bool = False) -> dict[str, Any]:
    """The document's JSON Schema (draft 2020-12), generated from its model; what schemas/<file> holds.

    `plain`: pydantic's own output, which error messages read (unknown keys still forbidden everywhere)."""
    cached = _SCHEMAS.get((doc.model, plain))
    if cached is not None:
        return cached
    from pydantic.json_schema import GenerateJsonSchema  # see adapter()

    warn = doc.unknown == "warn" and not plain

    class _Gen(GenerateJsonSchema):
        def typed_dict_schema(self, schema: Any) -> Any:
            out = super().typed_dict_schema(schema)
            if warn and out.get("additionalProperties") is False:
                del out["additionalProperties"]  # another key is allowed: a reader WARNs naming it
            return out

    body: dict[str, Any] = adapter(doc).json_schema(schema_generator=_Gen)
    if plain:
        _SCHEMAS[(doc.model, plain)] = body
        return body
    rule = (
        "Unknown keys: a key this schema does not name is allowed, for forward compatibility (a newer speclock's "
        "key): speclock reads the document with a WARN naming the key, and ignores it."
        if doc.unknown == "warn"
        else f"Unknown keys: refused (additionalProperties: false): {doc.refuse_why}, so a new key comes with a new schema id."
    )
    head = {
        "$schema": SCHEMA_DIALECT,
        "$id": f"{SCHEMAS_DIR}/{doc.schema_file}",
        "title": doc.title,
        "description": f"{body.pop('description', '').strip()}\n\nSchema id (the document's `{doc.id_key}` key): "
        f"{doc.schema_id}. {rule} Generated from {doc.model.__module__}.{doc.model.__name__} by `speclock schemas`; "
        "do not edit.".strip(),
        "x-speclock-schema-id": doc.schema_id,
        "x-speclock-unknown-keys": doc.unknown,
    }
    body.pop("title", None)
    if doc.inline:
        body = _inlined(body, body.pop("$defs", {}))
    out = {**head, **body}
    _SCHEMAS[(doc.model, plain)] = out
    return out


def _inlined(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with each {"$ref": "#/$defs/X", ...} replaced by X (and the ref's own keys); a model has no cycles."""
    if isinstance(node, list):
        return [_inlined(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        named = defs[node["$ref"].rsplit("/", 1)[-1]]
        return _inlined({**named, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    return {k: _inlined(v, defs) for k, v in node.items()}


def schema_text(doc: DocModel) -> str:
    return json.dumps(json_schema(doc), indent=2, ensure_ascii=False) + "\n"


def write_schemas(docs: list[DocModel], root: Path, *, check: bool) -> list[Path]:
    """Write each document's schema under root/schemas (check: write nothing); the files that differed."""
    stale = []
    for doc in docs:
        path = root / SCHEMAS_DIR / doc.schema_file
        text = schema_text(doc)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, text)
    return stale
