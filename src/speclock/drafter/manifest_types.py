"""A drafter's speclock-manifest.json as speclock reads it: its typed model (#38).

`speclock train export` writes every key (speclock.drafter.manifest.DrafterManifest); a reader takes less: only
`aux_layers_after` (the layers the drafter was trained on) is required, and a key that is null reads as absent
(a hand-made drafter folder, an older export). speclock.drafter.models.check_drafter_manifest validates a manifest
against ManifestDoc (speclock.core.docmodel: strict types, errors naming the file and the dotted key path), then
checks what a key holds beyond its type (the schema id, counts and layer indices not below 0, a recorded
reference's key counts of at least 1, its rates in range). Unknown keys: a WARN naming them (the manifest travels
with the drafter, which a newer speclock may have exported). Its schema is not published.
"""

from __future__ import annotations

from typing import Any, Final, NotRequired

from speclock.core.docmodel import (
    DocModel,
    TypedDict,  # typing_extensions' where pydantic is (it validates the manifest)
)

MANIFEST_SCHEMA: Final = "speclock.drafter/v1"
MANIFEST_HINT: Final = (
    "the drafter manifest is written by `speclock train export` (and `speclock train reference --record`); "
    "export the drafter again, or restore the file from git"
)


class ReferenceKey(TypedDict):
    """What a recorded reference result was measured on: equal keys, comparable results."""

    target_sha256: str
    drafter_sha256: str
    prompts_sha256: str
    num_prompts: int
    k: int
    max_tokens: int


class RecordedMetrics(TypedDict):
    """A recorded reference result's counters (speclock.drafter.counters.SpecCounters.metrics): a mean alone is
    enough to judge a gap; per-position figures come with every counter."""

    mean_acceptance_length: float
    acceptance_rate: NotRequired[float | None]
    num_drafts: NotRequired[int | None]
    num_draft_tokens: NotRequired[int | None]
    num_accepted_tokens: NotRequired[int | None]
    accepted_per_position: NotRequired[list[int] | None]
    per_position_rate: NotRequired[list[float] | None]


class ReferenceRecord(TypedDict):
    """One entry of `reference`: what the reference decoder measured, on what, and how it ran."""

    key: ReferenceKey
    metrics: RecordedMetrics
    run: NotRequired[dict[str, Any]]  # device, dtype, workers, ... (speclock train reference --record)


class ManifestTargetInfo(TypedDict, total=False):
    """`target`: the target the drafter was trained on (checked against the served one by its weights' hash)."""

    name: str | None
    sha256: str | None
    sha256_of: str | None
    architecture: str | None
    num_hidden_layers: int | None
    hidden_size: int | None
    vocab_size: int | None


class ManifestDoc(TypedDict):
    """speclock-manifest.json as speclock reads it (schema speclock.drafter/v1). The keys in the order a refusal
    names the first fault: the first wrong key in this order."""

    schema: NotRequired[str | None]  # when present, speclock.drafter/v1 (train's own reads require it)
    target: NotRequired[ManifestTargetInfo | None]
    engine_layer_ids: NotRequired[dict[str, list[int]] | None]  # per engine: the layer ids its config takes
    drafter_sha256: NotRequired[str | None]
    reference: NotRequired[list[ReferenceRecord] | None]
    aux_layers_after: list[int]  # the target's layers whose outputs the drafter was trained on
    aux_layers_meaning: NotRequired[str]
    draft_vocab_size: NotRequired[int]
    data: NotRequired[dict[str, Any]]  # how the training data was made (train/)
    training: NotRequired[dict[str, Any]]  # how the drafter was trained (train/)


MANIFEST = DocModel(
    ManifestDoc,
    MANIFEST_SCHEMA,
    "",  # not published
    "drafter manifest",
    "warn",
    MANIFEST_HINT,
    wording="path",  # the manifest's readers' words before the model: "target.num_hidden_layers is string ('30'), ..."
)
