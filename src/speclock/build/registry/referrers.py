"""OCI referrers (distribution spec 1.1): an artifact pushed beside an image manifest, naming it as its `subject`,
found again by artifactType. What the SBOM (build/sbom/document.py) and the signed smoke report (attestation) share.

A registry with the referrers API answers OCI-Subject when the artifact manifest is stored and lists it under
/v2/<name>/referrers/<digest>; one without it (Debian's distribution 2.8) gets the tag-schema fallback: the index
tagged <alg>-<hex> lists the subject's referrers.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from typing import Any

from speclock.build.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryClient
from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.jsonread import parse_json

OCI_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"


def registry_json(reg: RegistryClient, body: bytes, what: str) -> dict[str, Any]:
    """A registry's JSON answer (a manifest, an index); a damaged one is the registry's fault (exit 3), named."""
    # OCI JSON from the server: open-ended (media types, annotations), read field by field by the callers
    doc: dict[str, Any] = parse_json(body, f"registry {reg.host}/{reg.name}", what=what, error=EnvironmentProblem, allow_nan=True)
    return doc


def canonical(doc: dict[str, Any]) -> bytes:  # any OCI JSON document
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def subject_manifest(reg: RegistryClient, digest: str, *, then: str) -> tuple[str, bytes]:
    """(media type, bytes) of the image manifest `digest`, checked against the digest; `then`: what to push after it."""
    got = reg.manifest(digest)
    if got is None:
        raise BadInput(
            f"registry {reg.host} has no manifest {digest} in {reg.name}", hint=f"push the image first (push-image), then {then}"
        )
    if sha256_digest(got[1]) != digest:
        raise CheckFailed(
            f"registry {reg.host} answered other bytes for {reg.name}@{digest}",
            hint="the registry's storage is damaged; push the image again",
        )
    return got


def push_referrer(
    reg: RegistryClient,
    digest: str,
    data: bytes,
    *,
    artifact_type: str,
    title: str,
    subject: tuple[str, bytes],
    annotations: dict[str, str] | None = None,
    layer_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:  # the pushed artifact's OCI descriptor (registry JSON)
    """Push `data` as a one-layer artifact manifest (artifactType = the layer's media type) whose subject is the
    manifest `digest` (`subject`: its media type and bytes, from subject_manifest). The same data and annotations
    give the same manifest digest, so pushing again changes nothing.
    Returns {"digest", "blob_digest", "size", "subject", "referrers" ("api" or "tag-schema"), "repository"}."""
    subject_type, subject_body = subject
    reg.put_blob(EMPTY_JSON)
    blob_digest = reg.put_blob(data)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": OCI_EMPTY, "digest": sha256_digest(EMPTY_JSON), "size": len(EMPTY_JSON)},
        "layers": [
            {
                "mediaType": artifact_type,
                "digest": blob_digest,
                "size": len(data),
                "annotations": {"org.opencontainers.image.title": title, **(layer_annotations or {})},
            }
        ],
        "subject": {"mediaType": subject_type, "digest": digest, "size": len(subject_body)},
        "annotations": dict(annotations or {}),
    }
    body = canonical(manifest)
    ref_digest = sha256_digest(body)
    headers = reg.put_manifest(ref_digest, OCI_MANIFEST, body)
    via = "api"
    if headers.get("OCI-Subject") != digest:
        via = "tag-schema"
        add_to_fallback_index(
            reg,
            digest,
            {
                "mediaType": OCI_MANIFEST,
                "digest": ref_digest,
                "size": len(body),
                "artifactType": artifact_type,
                **({"annotations": manifest["annotations"]} if manifest["annotations"] else {}),
            },
        )
    return {
        "digest": ref_digest,
        "blob_digest": blob_digest,
        "size": len(data),
        "subject": digest,
        "referrers": via,
        "repository": f"{reg.host}/{reg.name}",
    }


def fallback_tag(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    return f"{algo}-{hexpart}"


def add_to_fallback_index(reg: RegistryClient, subject: str, descriptor: dict[str, Any]) -> None:  # OCI descriptor
    """The referrers tag schema (OCI distribution spec 1.1): the index tagged <alg>-<hex> lists the subject's referrers."""
    tag = fallback_tag(subject)
    got = reg.manifest(tag)
    index: dict[str, Any] = (
        registry_json(reg, got[1], f"index {tag}") if got else {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    )
    index["manifests"] = [m for m in index.get("manifests", []) if m.get("digest") != descriptor["digest"]] + [descriptor]
    reg.put_manifest(tag, OCI_INDEX, canonical(index))


def list_referrers(reg: RegistryClient, digest: str, artifact_type: str) -> list[dict[str, Any]]:  # OCI descriptors
    """The referrers of `digest` of one artifactType: the referrers API, or the tag-schema index where it is missing."""
    status, headers, body = reg.call(
        "GET", f"/v2/{reg.name}/referrers/{digest}?artifactType=" + urllib.parse.quote(artifact_type, safe=""), absent_ok=True
    )
    if status == 200 and (headers.get("Content-Type") or "").startswith(OCI_INDEX):
        found = registry_json(reg, body, f"referrers of {digest}").get("manifests", [])
    else:
        got = reg.manifest(fallback_tag(digest))
        found = registry_json(reg, got[1], f"index {fallback_tag(digest)}").get("manifests", []) if got else []
    return [m for m in found if m.get("artifactType") == artifact_type]


def pull_referrer(reg: RegistryClient, digest: str, artifact_type: str, *, what: str, push_hint: str) -> bytes:
    """The data of the newest referrer of `digest` of `artifact_type`, its manifest and blob checked by digest."""
    found = list_referrers(reg, digest, artifact_type)
    where = f"{reg.host}/{reg.name}"
    if not found:
        raise CheckFailed(f"{where}@{digest} has no {what} referrer", hint=push_hint)
    ref = found[-1]["digest"]
    got = reg.manifest(ref)
    if got is None or sha256_digest(got[1]) != ref:
        raise CheckFailed(f"the referrer {ref} of {where} is missing or damaged", hint=push_hint)
    manifest = registry_json(reg, got[1], f"manifest {ref}")
    if (manifest.get("subject") or {}).get("digest") != digest:
        raise CheckFailed(f"the referrer {ref} names another subject", hint=push_hint)
    return reg.blob(manifest["layers"][0]["digest"])
