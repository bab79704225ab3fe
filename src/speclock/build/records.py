"""Build records: what `speclock build-image` built (tag, ref, image id, labels), one JSON file per
tag and builder under $SPECLOCK_CACHE/images/<stack>; run-image, push-image and upgrade read them."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast, get_args, get_origin, get_type_hints, is_typeddict

from speclock.core.errors import BadInput
from speclock.core.files import atomic_write_text, clean_stale_temps, expect, file_where_folder_belongs, os_error, read_json
from speclock.core.layout import cache_dir

# A content tag: the first 16 hex digits of the inputs hash (a docker tag's grammar allows more; a
# record's tag names files and images, so it must stay one plain name).
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
BUILDERS = ("buildah", "docker")
STALE_TEMP_S = 600.0  # a record is written in milliseconds: a temp this old was left by a killed run


class ImageLayer(TypedDict):
    """One layer of a built image, oldest first (Builder.layers)."""

    created_by: str
    size: int  # bytes (buildah: compressed, as pushed)


class DoctorSummary(TypedDict):
    """The image's doctor, as the self-check records it."""

    verdict: str
    failed: list[str]
    checks: dict[str, str]  # check name -> status


class SelfcheckResult(TypedDict):
    """The verdict of the image's self-check (build.image.selfcheck_image), kept in its build record."""

    verdict: str  # "pass", "smoke-skipped", "fail", ...
    exit_code: int
    seconds: float
    outputs: str  # the host folder the image wrote its reports to
    error: NotRequired[str]
    doctor: NotRequired[DoctorSummary]
    smoke_skipped: NotRequired[str]  # why smoke did not run (a GPU stack on a host without a GPU)


class ImageInfo(TypedDict):
    """What an image is built from: config/image.json in the image, and the start of its build record."""

    stack: str
    tag: str
    ref: str
    inputs_sha256: str
    lock_sha256: str
    labels: dict[str, str]
    patches: list[str]


class BuildRecord(TypedDict):
    """A build record ($SPECLOCK_CACHE/images/<stack>/<tag>.<builder>.json): RECORD_KEYS always, the rest as the
    build that wrote it knew them (check_record checks the JSON type of each that is there)."""

    stack: str
    tag: str
    ref: str  # localhost/speclock-<stack>:<tag>
    builder: str  # one of BUILDERS
    image_id: str
    inputs_sha256: NotRequired[str]
    lock_sha256: NotRequired[str]
    labels: NotRequired[dict[str, str]]
    patches: NotRequired[list[str]]
    build_seconds: NotRequired[float]
    total_seconds: NotRequired[float]
    no_cache: NotRequired[bool]
    built_at: NotRequired[str]
    layers: NotRequired[list[ImageLayer]]
    candidate: NotRequired[bool]  # an upgrade candidate's image: never the stack's latest
    lock_file: NotRequired[str]  # ... and the candidate lock it was built from
    selfcheck: NotRequired[SelfcheckResult]
    builder_version: NotRequired[str]  # the builder's version: an input too (build.reuse)
    reused: NotRequired[bool]  # answered from the store by the inputs hash, the builder not called (build.reuse)


def _json_kinds(model: type) -> tuple[dict[str, type], dict[str, type]]:
    """A TypedDict's keys with the JSON type each holds (a nested TypedDict or dict: dict; list[...]: list), the
    required ones and the NotRequired ones: the record's contract is written once, in BuildRecord."""
    required: dict[str, type] = {}
    optional: dict[str, type] = {}
    for key, hint in get_type_hints(model, include_extras=True).items():
        into = required
        if get_origin(hint) is NotRequired:
            into, hint = optional, get_args(hint)[0]
        kind = get_origin(hint) or hint
        into[key] = dict if is_typeddict(kind) else kind
    return required, optional


# Keys every build record holds, and those it may hold, with their JSON types (run-image, push-image and upgrade
# read them; check_record checks each that is there).
RECORD_KEYS, RECORD_OPTIONAL = _json_kinds(BuildRecord)
SELFCHECK_KINDS = {k: v for part in _json_kinds(SelfcheckResult) for k, v in part.items()}  # each checked where present


def check_tag(tag: str, *, what: str = "--tag") -> str:
    if not isinstance(tag, str) or not TAG_RE.fullmatch(tag):
        raise BadInput(
            f"{what} {tag!r} is not an image tag (letters, digits, '_', '.', '-'; no '/')",
            hint="give the content tag a build printed, e.g. from `speclock build-image --json`",
        )
    return tag


def records_dir(stack_name: str) -> Path:
    """$SPECLOCK_CACHE/images/<stack>: the build records; temps a killed run left are removed here."""
    path = None
    try:
        path = cache_dir() / "images" / stack_name
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        where = path or os.environ.get("SPECLOCK_CACHE") or "the speclock cache"
        if err.errno in (errno.EEXIST, errno.ENOTDIR):
            raise BadInput(
                f"the build records folder {file_where_folder_belongs(where)}",
                hint="remove or rename that file, or point SPECLOCK_CACHE at a folder",
            ) from None
        raise os_error(err, where, "create the build records folder") from None
    clean_stale_temps(path, older_than_s=STALE_TEMP_S)
    return path


def _record_hint(stack_name: str, builder: str) -> str:
    return (
        f"build it again: `speclock build-image --stack {stack_name} --builder {builder}` writes a new record "
        "over this one (a candidate's: run the same `speclock upgrade` again)"
    )


def check_record(record: Any, path: Path, stack_name: str, builder: str, tag: str | None = None) -> BuildRecord:
    """A build record's shape, and that it names this stack's own image: its tag names files and its
    ref is run and pushed, so a record can only point at `localhost/speclock-<stack>:<tag>`."""
    hint = _record_hint(stack_name, builder)
    if not isinstance(record, dict):
        raise BadInput(f"{path}: the build record holds a JSON {type(record).__name__}, where an object belongs", hint=hint)
    for key, kind in RECORD_KEYS.items():
        if key not in record:
            raise BadInput(f"{path}: the build record has no key {key!r}", hint=hint)
        expect(record[key], kind, f"key {key!r}", path=path, hint=hint)
    for key, kind in RECORD_OPTIONAL.items():
        if key in record:
            expect(record[key], kind, f"key {key!r}", path=path, hint=hint)
    if not TAG_RE.fullmatch(record["tag"]):
        raise BadInput(
            f"{path}: key 'tag' {record['tag']!r} is not an image tag (a plain name: letters, digits, '_.-')", hint=hint
        )
    if tag is not None and record["tag"] != tag:
        raise BadInput(f"{path}: key 'tag' is {record['tag']!r}, but the file is the record of tag {tag!r}", hint=hint)
    if record["builder"] != builder:
        raise BadInput(f"{path}: key 'builder' is {record['builder']!r}, but the file is a {builder} record", hint=hint)
    if record["stack"] != stack_name:
        raise BadInput(f"{path}: key 'stack' is {record['stack']!r}, but the file is a record of stack {stack_name!r}", hint=hint)
    want = f"localhost/speclock-{stack_name}:{record['tag']}"
    if record["ref"] != want:
        raise BadInput(f"{path}: key 'ref' is {record['ref']!r}; a record of stack {stack_name} names {want}", hint=hint)
    if not record["image_id"] or record["image_id"].startswith("-") or any(c.isspace() for c in record["image_id"]):
        raise BadInput(f"{path}: key 'image_id' {record['image_id']!r} is not an image id", hint=hint)
    sc = record.get("selfcheck")
    if sc is not None:
        for key, kind in SELFCHECK_KINDS.items():
            if key in sc:
                expect(sc[key], kind, f"key 'selfcheck.{key}'", path=path, hint=hint)
    # The keys every record holds, and the JSON type of each other one it holds, checked above.
    return cast(BuildRecord, record)


def write_record(stack_name: str, record: BuildRecord) -> Path:
    """The record under its tag and (not for candidates) as the stack's latest: each written whole
    (fsynced temp, then rename), over whatever was there, a corrupt file included."""
    tag = check_tag(record["tag"], what="the record's tag")
    builder = record["builder"]
    if builder not in BUILDERS:
        raise BadInput(f"unknown builder {builder!r} in a build record", hint=f"use one of {', '.join(BUILDERS)}")
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    path = records_dir(stack_name) / f"{tag}.{builder}.json"
    atomic_write_text(path, text)
    if record.get("candidate"):  # an upgrade candidate never becomes the stack's latest (push-image's default)
        return path
    atomic_write_text(records_dir(stack_name) / f"latest.{builder}.json", text)
    return path


def record_path(stack_name: str, builder: str, tag: str | None = None) -> Path:
    if builder not in BUILDERS:
        raise BadInput(f"unknown builder {builder!r}", hint=f"use one of {', '.join(BUILDERS)}")
    if tag is not None:
        check_tag(tag)
    return records_dir(stack_name) / (f"{tag}.{builder}.json" if tag else f"latest.{builder}.json")


def read_record(stack_name: str, builder: str, tag: str | None = None) -> BuildRecord:
    path = record_path(stack_name, builder, tag)
    if not path.exists() and not path.is_symlink():
        raise BadInput(
            f"no {builder} build of stack {stack_name}{' with --tag ' + repr(tag) if tag else ''} is recorded (no {path})",
            hint=f"run `speclock build-image --stack {stack_name} --builder {builder}` first",
        )
    hint = _record_hint(stack_name, builder)
    record = read_json(path, what="build record", expect=dict, hint=hint)
    return check_record(record, path, stack_name, builder, tag)
