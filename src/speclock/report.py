"""The smoke report (`"schema": "speclock.smoke/v1"`, DESIGN.md): validation, reading, writing, a table.

`speclock smoke` writes it, `speclock gate` and CI read it. `validate_report` is the one
definition of what a valid report is; errors name the key that is wrong.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from speclock.errors import BadInput

SCHEMA_ID = "speclock.smoke/v1"

_NUM = (int, float)
# Required keys: dotted path -> allowed types (None as a type = JSON null allowed).
REQUIRED: dict[str, tuple] = {
    "schema": (str,),
    "stack": (str,),
    "image": (dict,),
    "image.ref": (str,),
    "image.digest": (str,),
    "engine": (dict,),
    "engine.name": (str,),
    "engine.version": (str,),
    "target": (dict,),
    "target.path": (str,),
    "target.arch": (str,),
    "draft": (dict,),
    "draft.path": (str,),
    "draft.aux_layer_ids": (list,),
    "draft.captured_layers": (list, type(None)),
    "num_speculative_tokens": (int,),
    "prompts": (dict,),
    "prompts.source": (str,),
    "prompts.count": (int,),
    "metrics": (dict,),
    "metrics.num_drafts": (int,),
    "metrics.num_draft_tokens": (int,),
    "metrics.num_accepted_tokens": (int,),
    "metrics.accepted_per_position": (list,),
    "metrics.acceptance_rate": _NUM,
    "metrics.mean_acceptance_length": _NUM,
    "throughput": (dict,),
    "throughput.baseline_tok_s": _NUM + (type(None),),
    "throughput.spec_tok_s": _NUM + (type(None),),
    "throughput.speedup": _NUM + (type(None),),
    "lossless": (dict,),
    "lossless.checked": (int,),
    "lossless.mismatches": (int,),
    "verdict": (str,),
    "failures": (list,),
}


def _get(data: dict, dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def validate_report(data: Any, source: str = "report") -> dict[str, Any]:
    """Check a parsed report against the contract; raise BadInput naming the wrong key."""
    hint = "a report written by `speclock smoke` (schema speclock.smoke/v1); see docs/smoke.md"
    if not isinstance(data, dict):
        raise BadInput(f"{source}: not a JSON object", hint=hint)
    if data.get("schema") != SCHEMA_ID:
        raise BadInput(f"{source}: key 'schema': {data.get('schema')!r} is not {SCHEMA_ID!r}", hint=hint)
    for key, types in REQUIRED.items():
        found, value = _get(data, key)
        if not found:
            raise BadInput(f"{source}: key '{key}': missing", hint=hint)
        if isinstance(value, bool) or not isinstance(value, types):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise BadInput(f"{source}: key '{key}': expected {want}, got {type(value).__name__} {value!r:.60}", hint=hint)
    if data["verdict"] not in ("pass", "fail"):
        raise BadInput(f"{source}: key 'verdict': {data['verdict']!r} is not 'pass' or 'fail'", hint=hint)
    m = data["metrics"]
    for i, v in enumerate(m["accepted_per_position"]):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise BadInput(f"{source}: key 'metrics.accepted_per_position[{i}]': expected a count, got {v!r}", hint=hint)
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        if m[key] < 0:
            raise BadInput(f"{source}: key 'metrics.{key}': negative ({m[key]})", hint=hint)
    if m["num_accepted_tokens"] > m["num_draft_tokens"]:
        raise BadInput(f"{source}: key 'metrics.num_accepted_tokens': {m['num_accepted_tokens']} exceeds num_draft_tokens "
                       f"{m['num_draft_tokens']}", hint=hint)
    if not all(isinstance(f, str) for f in data["failures"]):
        raise BadInput(f"{source}: key 'failures': expected a list of strings", hint=hint)
    if data["verdict"] == "pass" and data["failures"]:
        raise BadInput(f"{source}: key 'verdict': 'pass' with {len(data['failures'])} failures listed", hint=hint)
    return data


def load_report(path: str | Path) -> dict[str, Any]:
    """Read and validate a report file."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"no report file {path}", hint="give the JSON written by `speclock smoke --out DIR` (DIR/report.json)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadInput(f"{path}: not valid JSON: {err}", hint="give the JSON written by `speclock smoke`") from None
    return validate_report(data, str(path))


def write_atomic(path: str | Path, text: str) -> Path:
    """Write via a temp file and rename, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_report(path: str | Path, report: dict[str, Any]) -> Path:
    return write_atomic(path, json.dumps(report, indent=2, sort_keys=False) + "\n")


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def human_table(report: dict[str, Any]) -> str:
    """A short table for people: what ran, what it measured, the verdict."""
    m, t, ll = report["metrics"], report["throughput"], report["lossless"]
    ref = report.get("reference") or {}
    per_pos = ", ".join(f"{r:.2f}" for r in m.get("acceptance_per_position", [])) or "-"
    rows = [
        ("stack", report["stack"]),
        ("engine", f"{report['engine']['name']} {report['engine']['version']}"),
        ("draft", f"{report['draft']['path']}  aux layers {report['draft']['aux_layer_ids']} "
                  f"captured {report['draft']['captured_layers']}"),
        ("prompts", f"{report['prompts']['count']} from {report['prompts']['source']}, k={report['num_speculative_tokens']}"),
        ("lossless", f"{ll['checked'] - ll['mismatches'] - ll.get('numeric_ties', 0)}/{ll['checked']} identical, "
                     f"{ll.get('numeric_ties', 0)} part at numeric ties, {ll['mismatches']} mismatched"),
        ("mean acceptance length", _fmt(m["mean_acceptance_length"])),
        ("acceptance rate", _fmt(m["acceptance_rate"])),
        ("acceptance per position", per_pos),
        ("reference acceptance length", _fmt((ref.get("metrics") or {}).get("mean_acceptance_length")) + (f"  ({ref.get('status')})" if ref else "")),
        ("reference gap", _fmt(ref.get("gap"))),
        ("tok/s plain -> spec", f"{_fmt(t['baseline_tok_s'], 1)} -> {_fmt(t['spec_tok_s'], 1)}  (speedup {_fmt(t['speedup'], 2)})"),
        ("verdict", report["verdict"].upper()),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"  - {f}" for f in report["failures"]]
    return "\n".join(lines)
