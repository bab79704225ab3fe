"""A rebuild answered from the store, as a Nix build is: when the inputs hash already names an image this
builder made, and that image is still there under its tag, build-image returns its record without
calling the builder (a buildah call costs 0.6 s even when every layer is cached, docs/benchmarks.md).

Never a stale image: the record must name the same full inputs hash (every input: lock, Containerfile,
patches, drafter, prompts via the lock, speclock's source), the same builder version, the same labels
(the revision and dirty flag are labels), and the image under the tag must still have the recorded id
(a tag moved or removed by hand is built again). --no-cache always builds."""

from __future__ import annotations

from speclock.build.builders import Builder
from speclock.build.records import BuildRecord, read_record
from speclock.core.errors import SpeclockError


def mismatch(record: BuildRecord, *, ref: str, inputs: str, version: str, labels: dict[str, str]) -> str | None:
    """Why the recorded image is not this build's (the first input that differs), or None when it is."""
    if record["ref"] != ref:
        return "another ref"
    if record.get("inputs_sha256") != inputs:
        return "other inputs"
    if record.get("builder_version") != version:
        return f"another builder version ({record.get('builder_version')} then, {version} now)"
    if record.get("labels") != labels:
        return "other labels"
    return None


def reusable_record(
    stack_name: str, builder: Builder, version: str, *, ref: str, tag: str, inputs: str, labels: dict[str, str]
) -> BuildRecord | None:
    """The record of an image built from exactly these inputs and still in the store, or None (build it)."""
    try:
        record = read_record(stack_name, builder.name, tag)
    except SpeclockError:  # none, or damaged: build (and write a sound one)
        return None
    if mismatch(record, ref=ref, inputs=inputs, version=version, labels=labels):
        return None
    try:
        image_id = builder.image_id(ref)
    except SpeclockError:  # no image under the tag (removed, or a build that never finished)
        return None
    return record if image_id == record["image_id"] else None
