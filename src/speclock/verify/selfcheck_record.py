"""The self-check's record, selfcheck.json: its typed model (#38) and its reader.

`speclock selfcheck` writes it into its output folder (speclock.verify.selfcheck: every stage's exit code and what
went wrong, and the verdict recorded with the image); `speclock upgrade` reads it back through `read_selfcheck`,
which validates it against SelfcheckRecord (speclock.core.docmodel: strict types, errors naming the file and the
dotted key path, exit 2). build-image's reader (speclock.build.image) takes the image's file open-ended, a damaged
one counting as a failed self-check.

Unknown keys: a WARN naming them, the key ignored. The file is written inside an image by that image's speclock and
read on the host by the host's, which may be older. `schema` came with the model: a record of an older image lacks
it. Its schema is not published.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal, NotRequired, cast

from speclock.core.docmodel import (
    DocModel,
    TypedDict,  # typing_extensions' where pydantic is (it validates the record)
    validate,
)
from speclock.core.files import read_json

SELFCHECK_SCHEMA: Final = "speclock.selfcheck/v1"
SELFCHECK_FILE: Final = "selfcheck.json"
SELFCHECK_HINT: Final = "run `speclock selfcheck` (or build-image's self-check) again; the file is its output, unedited"

Stage = Literal["doctor", "smoke", "gate", "attestation"]
Verdict = Literal["pass", "fail", "smoke-skipped"]


class StageResult(TypedDict, total=False):
    """One stage in selfcheck.json: its exit code and what went wrong, and what the stage itself adds."""

    exit_code: int | None
    error: str | None
    # a stage that did not run
    skipped: bool
    note: str
    # smoke
    verdict: str
    failures: list[str]
    warnings: list[str]  # smoke's, and the gate's
    # gate
    baseline: str | None
    # attestation (speclock.verify.attest.AttestationInfo)
    file: str
    keyid: str
    subject: dict[str, Any]


class SelfcheckStages(TypedDict, total=False):
    doctor: StageResult
    smoke: StageResult
    gate: StageResult
    attestation: StageResult


class SelfcheckRecord(TypedDict):
    """selfcheck.json: every stage's result and the verdict recorded with the image."""

    schema: NotRequired[Literal["speclock.selfcheck/v1"]]
    run_id: str  # this run's id, also report.json's run.id
    stages: SelfcheckStages
    verdict: Verdict
    exit_code: NotRequired[int]  # absent where smoke was skipped (no GPU): the exit code is doctor's


SELFCHECK = DocModel(
    SelfcheckRecord,
    SELFCHECK_SCHEMA,
    "",  # not published: build-image and upgrade read it
    "self-check record",
    "warn",
    SELFCHECK_HINT,
)


def read_selfcheck(path: Path) -> SelfcheckRecord:
    """selfcheck.json, validated against SelfcheckRecord; BadInput (exit 2) naming the file and the key path."""
    doc = read_json(path, what="self-check record", expect=dict, hint=SELFCHECK_HINT)
    validate(SELFCHECK, doc, str(path))
    return cast(SelfcheckRecord, doc)
