"""A host environment's record, DIR/speclock/host-env.json: its typed model (#38) and its reader.

`speclock host-env` writes it (build.hostenv.venv.build_env, every key); doctor (which packages came from the host,
which pruned ones the host still shows), selfcheck --env (the environment's stack and target) and a second host-env
(is DIR already this environment?) read it through `read_record`, which validates it against HostEnvRecord
(speclock.core.docmodel: strict types, errors naming the file and the dotted key path). The keys a record of an
older speclock lacks (kernels, pruned_from_host, target_folder, draft_folder came later) are NotRequired.

Unknown keys: a WARN naming them, the key ignored. The record lives in the environment, and the speclock that reads
it (the host's, for `selfcheck --env`) may be older than the one that wrote it. Its schema is not published.

This module imports only core/: doctor reads the record inside an environment without the rest of host-env.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal, NotRequired, cast

from speclock.core.docmodel import (
    DocModel,
    TypedDict,  # typing_extensions' where pydantic is (it validates the record)
    validate,
)
from speclock.core.errors import BadInput
from speclock.core.files import read_json

HOST_ENV_SCHEMA: Final = "speclock.host-env/v1"
HOME: Final = "speclock"  # DIR/speclock: the image's /opt/speclock
RECORD: Final = "host-env.json"  # DIR/speclock/host-env.json
RECORD_HINT: Final = "re-create it with `speclock host-env --force`"


class HashCheckedRow(TypedDict):
    """A wheel installed from the wheelhouse, hash-checked."""

    name: str
    version: str
    sha256: str


class HostPackageRow(TypedDict):
    """A package taken from the host's Python (--use-host-packages): version-checked, as host-env.json records it."""

    name: str
    lock_version: str
    host_version: str
    location: str
    checked: str  # "version"


class PrunedFromHost(TypedDict):
    """A [prune].packages package the env's Python still sees in the host's site-packages."""

    name: str
    version: str
    location: str


class HostEnvRecord(TypedDict):
    """DIR/speclock/host-env.json: what `speclock host-env` built (doctor, selfcheck and a second host-env read it)."""

    schema: Literal["speclock.host-env/v1"]
    stack: str
    stack_sha256: str
    lock_sha256: str  # the full lock's
    lock_file: str
    target: str
    target_lock_sha256: str  # lock.json's: the target's own view (spec.lock.target_lock)
    python: str
    machine: str
    interpreter: str
    speclock_version: str
    hash_checked: list[HashCheckedRow]
    version_checked: list[HostPackageRow]
    host_packages_requested: list[str]
    engine_env: dict[str, str]
    created: str
    # {"source": "copied", "from": DIR} or {"source": "built", "toolchain": [...]}; None: the stack builds no kernels
    kernels: NotRequired[dict[str, Any] | None]
    pruned_from_host: NotRequired[list[PrunedFromHost]]
    target_folder: NotRequired[str | None]  # where DIR/speclock/target links to (--model, or target.path); None: converted in it
    draft_folder: NotRequired[str | None]  # where DIR/speclock/draft links to (--draft); None: the stack's drafter copied in


HOST_ENV = DocModel(
    HostEnvRecord,
    HOST_ENV_SCHEMA,
    "",  # not published: speclock's own record inside an environment
    "host environment record",
    "warn",
    RECORD_HINT,
)


def read_record(env_dir: Path) -> HostEnvRecord:
    """DIR/speclock/host-env.json, validated against HostEnvRecord; BadInput (exit 2) when DIR is not a host
    environment, or naming the file and the key path of what does not fit the model."""
    path = Path(env_dir) / HOME / RECORD
    if not path.is_file():
        raise BadInput(
            f"{env_dir} is not a speclock host environment (no {HOME}/{RECORD})",
            hint="make one with `speclock host-env --stack S --dest DIR`",
        )
    doc = read_json(path, what="host environment record", expect=dict, hint=RECORD_HINT)
    if doc.get("schema") != HOST_ENV_SCHEMA:  # another document, or another version of this one
        raise BadInput(f"{path}: schema is {str(doc.get('schema'))[:40]!r}, expected {HOST_ENV_SCHEMA!r}", hint=RECORD_HINT)
    validate(HOST_ENV, doc, str(path))
    return cast(HostEnvRecord, doc)
