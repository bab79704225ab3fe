"""The image's SBOM as an OCI referrer: read from the pushed image, pushed beside it, listed and pulled (see build/registry/referrers.py)."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path
from typing import Any

from speclock.build.registry import referrers
from speclock.build.registry.client import RegistryClient
from speclock.build.sbom.format import SBOM_IN_IMAGE, SBOM_MEDIA_TYPE
from speclock.core.errors import BadInput, CheckFailed
from speclock.core.jsonread import loads


def sbom_from_image(reg: RegistryClient, digest: str) -> bytes:
    """The SBOM file as the pushed image holds it: read from its layers, topmost first (a few small layers)."""
    got = reg.manifest(digest)
    if got is None:
        raise BadInput(f"registry {reg.host} has no manifest {digest} in {reg.name}", hint="push the image first")
    media_type, body = got
    manifest = referrers.registry_json(reg, body, f"manifest {digest}")
    if "layers" not in manifest:
        raise BadInput(
            f"{reg.name}@{digest} is an index ({media_type}), not an image manifest",
            hint="pass the digest of the image manifest that push-image printed",
        )
    want = SBOM_IN_IMAGE.lstrip("/")
    for layer in reversed(manifest["layers"]):
        data = reg.blob(layer["digest"])
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for member in tar:
                    name = member.name.lstrip("./")
                    fh = tar.extractfile(member) if name == want and member.isfile() else None
                    if fh is not None:
                        return fh.read()
                    if name == f"{Path(want).parent}/.wh.{Path(want).name}" or name == f"{Path(want).parent}/.wh..wh..opq":
                        break
        except tarfile.TarError as err:
            raise CheckFailed(
                f"layer {layer['digest'][:19]} of {reg.name}@{digest} is not a tar this reader takes ({err})",
                hint="push with gzip or no compression (zstd layers are not read here), or pass sbom=",
            ) from None
    raise CheckFailed(
        f"{reg.name}@{digest} holds no {SBOM_IN_IMAGE}",
        hint="rebuild the image with this speclock (build-image stages the SBOM), then push it again",
    )


def push_sbom_referrer(
    registry: str, repository: str, digest: str, *, insecure: bool, sbom: bytes | None = None
) -> dict[str, Any]:  # the referrer's OCI descriptor (registry JSON)
    """Push the image's SBOM beside it as an OCI referrer: an artifact manifest (artifactType
    application/vnd.cyclonedx+json) whose `subject` is the image manifest `digest`, in REGISTRY/repository.

    `sbom`: the document; default the image's own /opt/speclock/sbom.cdx.json, read from the pushed layers.
    A registry without the referrers API (no OCI-Subject answer) gets the tag-schema fallback: the index
    tagged sha256-<hex> lists the referrer. Returns {"digest", "sbom_digest", "size", "subject", "referrers"}."""
    reg = RegistryClient(registry, repository, insecure=insecure)
    subject = referrers.subject_manifest(reg, digest, then="its SBOM")
    data = sbom if sbom is not None else sbom_from_image(reg, digest)
    try:
        doc = loads(data)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("bomFormat") != "CycloneDX":
        raise BadInput(
            "the SBOM to push is not a CycloneDX JSON document",
            hint=f"pass the file {SBOM_IN_IMAGE} of the image (or nothing: it is read from the image)",
        )
    created = (doc.get("metadata") or {}).get("timestamp")
    pushed = referrers.push_referrer(
        reg,
        digest,
        data,
        artifact_type=SBOM_MEDIA_TYPE,
        title=Path(SBOM_IN_IMAGE).name,
        subject=subject,
        annotations={"org.opencontainers.image.created": created} if created else None,
    )
    pushed["sbom_digest"] = pushed.pop("blob_digest")
    return pushed


def sbom_referrers(registry: str, repository: str, digest: str, *, insecure: bool) -> list[dict[str, Any]]:  # OCI descriptors
    """The CycloneDX referrers of an image manifest: the referrers API, or the tag-schema index where it is missing."""
    return referrers.list_referrers(RegistryClient(registry, repository, insecure=insecure), digest, SBOM_MEDIA_TYPE)


def pull_sbom_referrer(registry: str, repository: str, digest: str, *, insecure: bool) -> bytes:
    """The SBOM pushed beside the image `digest` (its newest CycloneDX referrer), checked against its digests."""
    return referrers.pull_referrer(
        RegistryClient(registry, repository, insecure=insecure),
        digest,
        SBOM_MEDIA_TYPE,
        what="CycloneDX",
        push_hint="push it with push_sbom_referrer (push-image does after the image)",
    )
