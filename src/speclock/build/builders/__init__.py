"""Image builders behind one small interface; chosen by name from BUILDERS.

buildah gives reproducible digests (fixed --timestamp, pinned storage driver); docker BuildKit
is the builder most users have. Both read the same Containerfile and staged context.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from speclock.build.builders import buildah, docker
from speclock.build.records import BuildRecord, ImageLayer
from speclock.core.errors import BadInput


class Builder(Protocol):
    name: str

    def check_available(self) -> str:
        """Return a version string, or raise EnvironmentProblem saying how to install/start it."""

    def image_exists(self, ref: str) -> bool: ...

    def build(
        self,
        *,
        containerfile: Path,
        context: Path,
        tag: str,
        build_args: dict[str, str],
        labels: dict[str, str],
        target: str | None,
        no_cache: bool,
        timestamp: int,
        layers: bool = True,
    ) -> str:
        """Build and tag; stream progress to stdout; return the local image id. `layers=False` (buildah): one
        commit for all steps, no layer cache (build.tail's tail)."""

    def image_id(self, ref: str) -> str: ...

    def layers(self, ref: str) -> list[ImageLayer]:
        """[{"size": bytes, "created_by": str}] from the image history, oldest first."""

    def labels(self, ref: str) -> dict[str, str]:
        """The labels the image's config carries."""

    def push(self, ref: str, dest: str, *, insecure: bool) -> str:
        """Push to a registry; return the pushed manifest digest (sha256:...)."""

    def remove(self, ref: str) -> None: ...

    def copy_to_docker(self, ref: str) -> str:
        """Make this builder's image `ref` runnable in docker (where images run); return the ref there."""


BUILDERS: dict[str, Builder] = {"buildah": buildah.BUILDER, "docker": docker.BUILDER}
_VERSIONS: dict[str, str] = {}  # what check_available said in this process (one call per builder)


def get_builder(name: str) -> Builder:
    if name not in BUILDERS:
        raise BadInput(f"unknown builder {name!r}", hint=f"use one of: {', '.join(BUILDERS)}")
    builder = BUILDERS[name]
    _VERSIONS[name] = builder.check_available()
    return builder


def builder_version(builder: Builder) -> str:
    """The builder's version (checked once per process): a new builder may make other layers from the same inputs."""
    if builder.name not in _VERSIONS:
        _VERSIONS[builder.name] = builder.check_available()
    return _VERSIONS[builder.name]


def ensure_in_docker(record: BuildRecord) -> str:
    """The recorded build's image ref in docker's store, copied there by the builder that made it.

    The builder itself need not work here (only docker must): a copied image is found in docker first."""
    if record["builder"] not in BUILDERS:
        raise BadInput(f"unknown builder {record['builder']!r} in a build record", hint=f"use one of: {', '.join(BUILDERS)}")
    return BUILDERS[record["builder"]].copy_to_docker(record["ref"])
