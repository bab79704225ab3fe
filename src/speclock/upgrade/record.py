"""The typed shape of upgrade.json (schema speclock.upgrade/v1, speclock.upgrade.steps.UpgradeResult.to_json), the
record `speclock upgrade` writes beside summary.md and junit.xml and prints with --json; and the Step each of its
steps fills (here, below steps and soak, which both fill one)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, TypedDict

from speclock.verify.report_types import CheckRecord, SoakDrift


class PinChange(TypedDict):
    before: str
    after: str


class CandidateFiles(TypedDict):
    folder: str
    stack: str
    lock: str


class UpgradeImage(TypedDict, total=False):
    """The candidate image (empty until it is built or found)."""

    ref: str
    tag: str
    builder: str
    image_id: str | None


class DoctorRow(TypedDict):
    """One check of the image's doctor.json, as the doctor step keeps it (values as the image wrote them)."""

    name: Any
    status: Any
    reason: Any


class SoakWindowSummary(TypedDict):
    """One soak window as upgrade.json shows it (None where the image's soak.json lacks the key)."""

    t_start_s: float | None
    mean_acceptance_length: float | None
    acceptance_rate: float | None
    tok_s: float | None
    outputs_same: bool | None
    numeric_ties: int | None
    mismatches: int | None


class SoakSummary(TypedDict):
    """What upgrade.json and summary.md show of a soak (speclock.upgrade.soak.soak_summary)."""

    verdict: str
    seconds: float
    max_drift: float | None
    prompts: int | None
    max_tokens: int | None
    drift: SoakDrift
    windows: list[SoakWindowSummary]
    failures: list[str]


class StepData(TypedDict, total=False):
    """A step's details: lock (lock_sha256, packages, changed), patches (results), doctor (checks), soak (the rest)."""

    lock_sha256: str
    packages: int  # how many packages the candidate lock installs
    changed: list[str]  # the packages it installs otherwise than the current lock (candidate_lock.lock_changes)
    results: list[dict[str, Any]]  # speclock.patches.series: each patch's lifecycle result
    checks: list[DoctorRow]
    # soak: what was asked, how the image's soak exited, and its SoakSummary
    soak_s: float
    max_drift: float | None
    exit_code: int
    outputs: str
    verdict: str
    seconds: float
    prompts: int | None
    max_tokens: int | None
    drift: SoakDrift
    windows: list[SoakWindowSummary]
    failures: list[str]


class StepRecord(TypedDict):
    name: str
    status: str  # pass | fail | skipped
    detail: str
    seconds: float
    data: StepData


@dataclasses.dataclass
class Step:
    name: str
    status: str = "skipped"  # pass | fail | skipped
    detail: str = ""
    seconds: float = 0.0
    data: StepData = dataclasses.field(default_factory=StepData)

    def to_json(self) -> StepRecord:
        """The step as upgrade.json records it (dataclasses.asdict's, typed)."""
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "seconds": self.seconds,
            "data": copy.deepcopy(self.data),
        }


class SoakStepRecord(StepData):
    """upgrade.json's `soak`: the soak step's status and detail with its data."""

    status: str
    detail: str


class UpgradeMetrics(TypedDict):
    """The numbers an upgrade compares, from one smoke report (speclock.upgrade.steps.metrics_of)."""

    engine: str
    image: str | None
    mean_acceptance_length: float
    acceptance_rate: float
    per_position: list[float]
    num_drafts: int
    speedup: float | None
    spec_tok_s: float | None
    baseline_tok_s: float | None
    lossless: str  # "identical/checked"
    captured_layers: list[int] | None
    aux_layer_ids: list[int] | None


class UpgradeRecord(TypedDict):
    """upgrade.json."""

    schema: str
    stack: str
    verdict: str  # pass | fail
    changes: dict[str, PinChange]  # "engine.version" -> its value before and after
    candidate: CandidateFiles
    baseline: str
    image: UpgradeImage
    steps: list[StepRecord]
    before: UpgradeMetrics | None  # the baseline report's
    after: UpgradeMetrics | None  # the candidate's report's
    gate_checks: list[CheckRecord]
    soak: SoakStepRecord | None
    failures: list[str]
    promoted: bool
