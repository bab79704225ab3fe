"""The typed models of the JSON documents verify writes and reads: the smoke report (`speclock.smoke/v1`,
docs/smoke.md), the gate's result (`speclock.gate/v1`) and the soak's result (`speclock.soak/v1`).

Each model is its document's one contract: code indexes the documents with ["key"] (they are TypedDicts, so the
files keep their format), speclock.core.docmodel validates a parsed document against the model (pydantic, strict:
no coercion, bool is no number, numbers finite) and writes its JSON Schema (schemas/*.schema.json, generated from
these classes by `speclock schemas`). A key `speclock smoke` always writes but an older report may lack is
NotRequired; when such a key became mandatory is speclock.verify.report_dates (the plausibility rules judge it).

What a key holds beyond its type (counters that agree, a gap that is the one its numbers give) is judged by
speclock.verify.report and speclock.verify.plausibility, on a document that already fits its model.
"""

from __future__ import annotations

from typing import Any, Final, Literal, NotRequired

from speclock.core.docmodel import TypedDict  # typing_extensions' where pydantic is (it validates the report)

# the drafter manifest's reference key (smoke writes it into the report's reference.key)
from speclock.drafter.manifest import ReferenceKey as ReferenceKey

SMOKE_SCHEMA_ID: Final = "speclock.smoke/v1"
GATE_SCHEMA_ID: Final = "speclock.gate/v1"
SOAK_SCHEMA_ID: Final = "speclock.soak/v1"


class ImageIdentity(TypedDict):
    ref: str
    digest: str


class EngineInfo(TypedDict):
    name: str
    version: str  # "" when the engine package is not installed
    package: NotRequired[str]
    pinned_version: NotRequired[str]
    mode: NotRequired[str]  # offline | server
    concurrency: NotRequired[int]  # server mode: requests in flight at once


class IdentityCheck(TypedDict):
    """`target.identity` / `draft.identity`: the served folder against the identity its lock pins (verify.model_pin);
    absent where the lock pins the model by a wheel (target.package)."""

    pinned: bool  # false: the lock records no identity (the folder was not there when it was locked)
    matches: bool | None  # None: not compared (not pinned)
    allowed_other: bool  # it differs and ran anyway: --allow-other-model
    differs: list[str]  # "file: what differs", one per file
    note: NotRequired[str]


class TargetInfo(TypedDict):
    path: str
    arch: str
    num_layers: NotRequired[int]
    identity: NotRequired[IdentityCheck]


class DraftInfo(TypedDict):
    path: str
    aux_layer_ids: list[int]
    captured_layers: list[int] | None
    aux_layer_ids_source: NotRequired[str]
    identity: NotRequired[IdentityCheck]


class PromptsInfo(TypedDict):
    source: str
    count: int


class Metrics(TypedDict):
    """The counters of a run (speclock.drafter.counters.SpecCounters.metrics) and the rates derived from them."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int]
    acceptance_rate: float
    mean_acceptance_length: float
    acceptance_per_position: NotRequired[list[float]]


class SeedMetrics(Metrics):
    """One seed's counters in a sampled run (`sampled.per_seed`)."""

    seed: NotRequired[int]  # smoke writes it; the counters are what the rules read


class Spread(TypedDict):
    """Mean, sample standard deviation, range and 95% interval of the mean (speclock.verify.profiles.spread)."""

    n: int
    mean: float
    stdev: float
    min: float | None
    max: float | None
    ci95: list[float] | None


class SeedSpread(TypedDict):
    mean_acceptance_length: Spread
    acceptance_per_position: list[Spread]


class SampledSection(TypedDict):
    """A sampled run's counters per seed; together they are the report's pooled `metrics`."""

    per_seed: list[SeedMetrics]
    temperature: NotRequired[float]
    seeds: NotRequired[list[int]]
    per_request_seed: NotRequired[bool]
    spread: NotRequired[SeedSpread]


class Divergence(TypedDict):
    """Where a prompt's plain and speculative outputs first part (speclock.verify.lossless)."""

    prompt: int
    position: int
    plain: list[int]
    spec: list[int]
    # added by the float32 judge
    margin: NotRequired[float]
    float32_argmax: NotRequired[int]
    tie: NotRequired[bool]


class TieJudgement(TypedDict):
    """The float32 judge's verdict on one divergence (speclock.verify.lossless.float32_judge)."""

    margin: float
    float32_argmax: int
    tie: bool


class LosslessSection(TypedDict):
    checked: int
    mismatches: int
    numeric_ties: NotRequired[int]
    tie_check: NotRequired[str]
    first_mismatches: NotRequired[list[Divergence]]
    first_ties: NotRequired[list[Divergence]]
    mode: NotRequired[str]  # greedy (the default) | sampled
    note: NotRequired[str]
    plain_from: NotRequired[str]  # the plain-output cache the no-drafter outputs came from


class Batch1(TypedDict):
    """`throughput.batch1`: the batch-1 speed (speclock.verify.speed.summarize_batch1)."""

    prompts: int
    max_tokens: int
    repeats: int
    plain_before_tok_s: list[float]
    spec_tok_s: list[float]
    plain_after_tok_s: list[float]
    plain_tok_s_median: float
    spec_tok_s_median: float
    speedup: float
    speedup_low: float
    speedup_high: float
    spread: float | None
    interval_method: NotRequired[str]  # "runs" (both spreads) or, absent, "medians" (before 2026-12-07)
    warmup_tok_s: NotRequired[dict[str, list[float]]]  # per engine run: the runs before the kept ones
    steady: NotRequired[dict[str, bool]]  # per engine run: whether its kept runs agreed (speclock.verify.speed)


class Loaded(Batch1):
    """`throughput.loaded`: `requests` at once (smoke.speed_concurrent), runs of at least MIN_LOADED_RUN_S each."""

    requests: int
    batches_per_run_min: int


class Concurrent(TypedDict):
    """`throughput.concurrent`: all prompts at once (offline: one batch; a server: --concurrency in flight)."""

    requests: int
    baseline_tok_s: float
    spec_tok_s: float
    speedup: float
    baseline_s: NotRequired[float]  # the seconds each run took (smoke writes them; the gate reads the rates)
    spec_s: NotRequired[float]


class Throughput(TypedDict):
    baseline_tok_s: float | None
    spec_tok_s: float | None
    speedup: float | None
    measured_at: NotRequired[str | None]  # "batch 1" when the keys above hold batch1's figures
    batch1: NotRequired[Batch1 | None]
    concurrent: NotRequired[Concurrent]
    loaded: NotRequired[Loaded | None]  # smoke.speed_concurrent requests at once (speclock.verify.speed); null: off
    note: NotRequired[str]
    baseline_s: NotRequired[float]  # reports before 2026-12-06: the timed runs' seconds (now in batch1/concurrent)
    spec_s: NotRequired[float]


class ReportReferenceKey(TypedDict, total=False):
    """`reference.key`: what the reference was measured on (speclock.drafter.manifest.ReferenceKey). Each key may be
    absent here; comparing a report with a baseline requires the drafter's (speclock.verify.baseline)."""

    target_sha256: str
    drafter_sha256: str
    prompts_sha256: str
    num_prompts: int
    k: int
    max_tokens: int


class ReferenceMetrics(TypedDict, total=False):
    """`reference.metrics`: the reference decoder's counters as the drafter's manifest records them (a mean alone is
    allowed; per-position figures come with every counter). The manifest's other keys are carried as they are."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int]
    acceptance_rate: float
    mean_acceptance_length: float
    per_position_rate: list[float]


# its own config: strict like the report's, but the manifest's other keys pass (they are the drafter's contract)
setattr(ReferenceMetrics, "__pydantic_config__", {"strict": True, "allow_inf_nan": False, "extra": "allow"})  # noqa: B010


class ReferenceSection(TypedDict):
    status: NotRequired[str]  # recorded | live | not computed
    key: NotRequired[ReportReferenceKey | None]
    metrics: NotRequired[ReferenceMetrics | None]
    gap: NotRequired[float | None]
    note: NotRequired[str]


class RunState(TypedDict):
    completed: bool  # which rules apply depends on it: written from smoke's first day
    id: NotRequired[str]  # this smoke run's id (selfcheck binds its gate and signature to it)
    stage: NotRequired[str]
    error: NotRequired[str | None]
    seconds: NotRequired[float | None]


class GpuInfo(TypedDict, total=False):
    name: str
    driver: str
    cuda: str
    arch: str | None


class ProfileRecord(TypedDict):
    """The smoke profile as a report records it (speclock.verify.profiles.Profile.describe); `{"name": "quick"}`
    alone where no profile was resolved."""

    name: str
    num_prompts: NotRequired[int]
    max_tokens: NotRequired[int]
    temperature: NotRequired[float]
    seeds: NotRequired[list[int]]
    max_mean_drift: NotRequired[float | None]
    max_position_drift: NotRequired[float | list[float]]
    two_sided: NotRequired[bool]
    position_drift: NotRequired[bool]
    per_request_seed: NotRequired[bool]


class BackendRun(TypedDict):
    """One attention backend's run (`attention_backends[i]`)."""

    backend: str
    metrics: Metrics
    lossless: NotRequired[LosslessSection]
    sampled: NotRequired[SampledSection]


class SmokeReport(TypedDict):
    """report.json, what `speclock smoke` writes and `speclock gate` reads (docs/smoke.md)."""

    schema: Literal["speclock.smoke/v1"]
    stack: str
    image: ImageIdentity
    engine: EngineInfo
    target: TargetInfo
    draft: DraftInfo
    num_speculative_tokens: int
    # the run's size bounds its counters (speclock.verify.plausibility), and whether it completed decides which
    # rules apply: both written from smoke's first day, so never optional
    max_tokens: int
    run: RunState
    prompts: PromptsInfo
    metrics: Metrics
    throughput: Throughput
    lossless: LosslessSection
    verdict: Literal["pass", "fail"]
    failures: list[str]
    created: NotRequired[str]
    profile: NotRequired[ProfileRecord]  # a report without one is a quick (greedy) one
    reference: NotRequired[ReferenceSection | None]
    thresholds: NotRequired[dict[str, Any]]  # the stack's smoke.thresholds the run was judged by
    warnings: NotRequired[list[str]]
    gpu: NotRequired[GpuInfo]
    sampled: NotRequired[SampledSection]
    attention_backends: NotRequired[list[BackendRun]]


# ---------------------------------------------------------------- the gate's result (gate.json)


class CheckRecord(TypedDict):
    """One gate check as JSON (speclock.verify.checks.Check.to_json)."""

    name: str
    ok: bool
    value: Any
    limit: str
    kind: str  # engine | lossless | drafter | integration | speed | regression
    detail: str
    warn: bool
    status: Literal["PASS", "WARN", "FAIL"]


class GateRecord(TypedDict):
    """gate.json and `speclock gate --json` (speclock.verify.gate_result.GateResult.to_json): the verdict on one report."""

    schema: NotRequired[Literal["speclock.gate/v1"]]  # absent in gate.json written before 2026-12-08
    verdict: Literal["pass", "fail"]
    baseline: str | None
    warnings: list[str]
    checks: list[CheckRecord]
    failures: list[str]
    attestation: NotRequired[dict[str, Any]]  # --verify-key: the envelope checked (speclock.verify.attest)


# ---------------------------------------------------------------- the soak's result (soak.json)


class SoakWindow(TypedDict):
    """One window of a soak; `speclock soak` writes every key, a reader checks the required ones."""

    t_start_s: float
    mean_acceptance_length: float
    acceptance_rate: float
    tok_s: float
    seconds: NotRequired[float]
    per_position: NotRequired[list[float]]
    num_drafts: NotRequired[int]
    outputs_same: NotRequired[bool]
    numeric_ties: NotRequired[int]
    mismatches: NotRequired[int]
    first_mismatches: NotRequired[list[Divergence]]


class SoakDrift(TypedDict):
    worst_drop: float
    last_drop: float
    worst_window: NotRequired[int]  # `speclock soak` writes it; the upgrade reads the drops


class SoakDoc(TypedDict):
    """soak.json (schema speclock.soak/v1), written by `speclock soak` with every key. The required keys are the
    ones the upgrade's reader reads by key (speclock.upgrade.soak.read_soak validates against this model; summary.md
    prints max_drift); the others it reads with .get. Unknown keys: a WARN naming them."""

    schema: Literal["speclock.soak/v1"]
    verdict: Literal["pass", "fail"]
    failures: list[str]
    windows: list[SoakWindow]
    drift: SoakDrift
    seconds: float
    max_drift: float
    stack: NotRequired[str]
    engine: NotRequired[str]
    minutes: NotRequired[float]
    prompts: NotRequired[int]
    max_tokens: NotRequired[int]
    num_speculative_tokens: NotRequired[int]
