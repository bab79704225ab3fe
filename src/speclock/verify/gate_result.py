"""The gate's result: `GateResult` as `speclock gate` returns it, and gate.json / `gate --json` as its typed
model (speclock.verify.report_types.GateRecord, schema speclock.gate/v1, schemas/gate-result.schema.json).

A key the model does not know is refused: a consumer that skipped it could misread the verdict, so a new key
comes with a new schema id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from speclock.core import files
from speclock.core.docmodel import DocModel, validate
from speclock.core.errors import BadInput
from speclock.verify.checks import Check, failures_of
from speclock.verify.report_types import GATE_SCHEMA_ID, GateRecord

GATE_RESULT = DocModel(
    GateRecord,
    GATE_SCHEMA_ID,
    "gate-result.schema.json",
    "speclock gate result",
    "refuse",
    "give the gate.json `speclock gate --json` or `speclock selfcheck` wrote, unedited",
)


def read_gate_result(path: str | Path) -> GateRecord:
    """Read and validate a gate result (gate.json); BadInput naming the file and the key path."""
    data = files.read_json(path, what="gate result", expect=object, hint=GATE_RESULT.hint)
    if not isinstance(data, dict):
        raise BadInput(f"{path}: not a JSON object (a {files.json_type(data)})", hint=GATE_RESULT.hint)
    validate(GATE_RESULT, data, str(path))
    return cast(GateRecord, data)


@dataclass
class GateResult:
    ok: bool
    checks: list[Check]
    baseline: str | None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> GateRecord:
        return {
            "schema": GATE_SCHEMA_ID,
            "verdict": "pass" if self.ok else "fail",
            "baseline": self.baseline,
            "warnings": list(self.warnings),
            "checks": [c.to_json() for c in self.checks],
            "failures": failures_of(self.checks),
        }
