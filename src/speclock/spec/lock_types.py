"""The lock document's typed model (schema id, entry lists, TypedDicts), apart from the code that reads, writes and
compares locks.

The model is the lock's one contract: code indexes a lock with ["key"] (TypedDicts, so the file keeps its format);
read_lock validates a parsed lock against LockFile (speclock.core.docmodel: pydantic, strict, errors naming the
file and the dotted key path), and schemas/lock.schema.json is generated from it by `speclock schemas`. A key the
model does not know is refused: the lock is the build's input, and a key an older speclock skipped would be a
part of the image it silently did not build (a new key comes with a new schema id). What a key holds beyond its
type (provenance: plain file names, allowed hosts, wheel names, hashes; the base recipe's values; a target key
and its platform tags) is checked by speclock.spec.provenance and speclock.spec.lock on a lock that fits the model.
"""

from __future__ import annotations

from typing import Any, Final, Literal, NotRequired

from speclock.core.docmodel import TypedDict  # typing_extensions' where pydantic is (it validates the lock)
from speclock.spec.model_identity import ModelIdentity

LOCK_SCHEMA: Final = "speclock.lock/v1"
# The lists of package entries a target holds.
EntryList = Literal["packages", "assets", "excluded", "pruned"]
ENTRY_LISTS: tuple[EntryList, ...] = ("packages", "assets", "excluded", "pruned")


# The lock document, as JSON on disk (`locks/<stack>.lock`, a host environment's lock.json) and in memory. Readers
# index it (doc["packages"]); these types say what they may find. read_lock validates a lock against them (LockFile).
class LockEntry(TypedDict):
    """One locked wheel (in packages, assets, excluded and pruned): every key a non-empty string (provenance)."""

    name: str  # normalized
    version: str
    filename: str  # the basename of url; fetch stores it as <sha256>/<filename>
    url: str  # https on PyPI or a stack's index (a file:// url only in a lock of one machine)
    sha256: str
    mirror_url: NotRequired[str]  # file:///...: the local copy the resolver took it from (fetch prefers it)


class LockPython(TypedDict):
    """The image target's Python: `python` of a lock (a host target's own lock view: that target's)."""

    version: str
    platforms: list[str]  # wheel platform tags, newest first


class PruneRecord(TypedDict):
    """`prune` of a lock: the stack's [prune], packages normalized and sorted, path globs as declared."""

    packages: list[str]
    paths: list[str]


class ModelRecord(TypedDict):
    """One entry of a lock's `models` (spec.lock_models): a model folder no wheel pins, by its identity."""

    path: str  # as the stack gives it (target.path, or an absolute draft.path)
    identity: ModelIdentity | None  # None: the folder was not there when the lock was made (not pinned)
    not_pinned: NotRequired[str]  # with identity None: why


class TargetPlatform(TypedDict):
    """What a target key ('3.12-x86_64') names: its Python, its machine and the wheel platform tags it accepts."""

    python: str
    machine: str
    platforms: list[str]


class HostTarget(TargetPlatform):
    """One entry of a lock's `targets` ('3.12-x86_64'): a host target's resolved package set."""

    packages: list[LockEntry]
    excluded: NotRequired[list[LockEntry]]
    assets: NotRequired[list[LockEntry]]
    pruned: NotRequired[list[LockEntry]]


class TargetView(TargetPlatform):
    """One target as `lock_targets` gives it (the image's from the top-level keys): every list present."""

    packages: list[LockEntry]
    excluded: list[LockEntry]
    assets: list[LockEntry]
    pruned: list[LockEntry]


class BaseRecipe(TypedDict):
    """mmdebstrap's inputs for a debian-rootfs base (spec.baseimage.recipe; provenance.check_base checks a read one)."""

    tool: str  # mmdebstrap
    suite: str
    mirror: str
    variant: str
    packages: list[str]  # Debian package names, sorted
    source_date_epoch: int
    format: str  # tar
    mode: str  # root


class LockBase(TypedDict):
    """`base` and `kernel_base` of a lock (spec.baseimage.lock_base): an image reference (kind "image", `ref`), or a
    debian-rootfs recipe with its tarball's sha256 (kind "debian-rootfs", every key but `ref`)."""

    kind: str
    ref: NotRequired[str]
    recipe: NotRequired[BaseRecipe]
    command: NotRequired[str]  # the recipe as an mmdebstrap command line, for people
    sha256: NotRequired[str]
    size: NotRequired[int]
    source_date_epoch: NotRequired[int]


class CarriedFrom(TypedDict):
    """`resolver.carried_from` of a lock carried from another stack's (spec.lock_carry)."""

    stack: str
    lock_sha256: str


class ResolverRecord(TypedDict, total=False):
    """`resolver` of a lock: what resolved it and from which requirements (spec.resolve), the lock an upgrade kept to,
    the lock it was carried from. Every key optional."""

    tool: str  # pip
    requirements: list[str]
    kept_from: str  # the lock_sha256 of the lock whose versions it kept
    carried_from: CarriedFrom


class _LockBody(TypedDict):
    """Every key of a lock but lock_sha256 (LockDoc in memory, LockFile on disk)."""

    schema: Literal["speclock.lock/v1"]
    stack: str
    stack_sha256: str
    base: LockBase  # the base: spec.baseimage (provenance.check_base checks it)
    packages: list[LockEntry]  # the image target's install set
    assets: list[LockEntry]  # its data wheels (python.build_only)
    excluded: NotRequired[list[LockEntry]]
    stack_data: NotRequired[dict[str, Any]]  # the validated stack it was made from (spec.stack.Stack.data)
    python: NotRequired[LockPython]
    resolver: NotRequired[ResolverRecord]
    kernel_base: NotRequired[LockBase]  # stacks with kernels.build
    source_date_epoch: NotRequired[int]
    targets: NotRequired[dict[str, HostTarget]]  # stacks with python.host_targets
    target: NotRequired[str]  # a target's own view (target_lock): which target
    lock_from: NotRequired[str]  # ... and the lock_sha256 of the full lock it comes from
    prune: NotRequired[PruneRecord]  # stacks with [prune]
    pruned: NotRequired[list[LockEntry]]
    models: NotRequired[dict[str, ModelRecord]]  # stacks with target.path (or an absolute draft.path): lock_models


class LockDoc(_LockBody):
    """A lock document (schema speclock.lock/v1) in memory. Optional keys are absent from locks that do not need them."""

    lock_sha256: NotRequired[str]  # set by finish_lock: every finished, written or read lock has it


class LockFile(_LockBody):
    """A lock file (`locks/<stack>.lock`, a host environment's lock.json) as read_lock reads it: a LockDoc with its
    lock_sha256, the sha256 of everything else in it (spec.stack.canonical_sha256)."""

    lock_sha256: str
