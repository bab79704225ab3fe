"""DSSE envelopes (github.com/secure-systems-lab/dsse: envelope.md, protocol.md) signed with Ed25519 keys from PEM
files: the one place that knows the wire format (PAE, base64 fields, keyid). The signing itself is the
`cryptography` package's (pinned in the image's lock); where it is missing, only signing and verifying fail (exit 3).

keyid: the hex sha256 of the public key's DER SubjectPublicKeyInfo (`openssl pkey -pubin -outform DER | sha256sum`).
It only names the key; trust comes from the key the verifier is given, never from the envelope.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from speclock.core.docmodel import DocModel, validate
from speclock.core.docmodel import TypedDict as ModelTypedDict
from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import read_text
from speclock.core.jsonread import parse_json

try:  # optional: only signing and verifying need it; its absence is exit 3 then, never at import (~30 ms)
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    _MISSING: ImportError | None = None
except ImportError as _err:
    _MISSING = _err

INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
INSTALL = "pip install cryptography (images have it: the lock pins it; a host venv may not)"


class Signature(TypedDict):
    keyid: str
    sig: str  # base64


class Envelope(TypedDict):
    """A DSSE envelope as written: payload and signatures in standard base64."""

    payload: str
    payloadType: str
    signatures: list[Signature]


KEYGEN = (
    "make a key pair with `openssl genpkey -algorithm ed25519 -out key.pem` and "
    "`openssl pkey -in key.pem -pubout -out key.pub.pem`"
)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed, so a signature binds the type as well as the bytes."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _crypto() -> argparse.Namespace:
    if _MISSING is not None:
        raise EnvironmentProblem(
            f"signing and verifying reports needs the `cryptography` package, which does not import here ({_MISSING})",
            hint=INSTALL,
        )
    return argparse.Namespace(
        InvalidSignature=InvalidSignature,
        UnsupportedAlgorithm=UnsupportedAlgorithm,
        serialization=serialization,
        Ed25519PrivateKey=Ed25519PrivateKey,
        Ed25519PublicKey=Ed25519PublicKey,
    )


def _pem(path: str | Path, option: str) -> bytes:
    return read_text(path, what=f"{option} key file").encode()


def load_private_key(path: str | Path, option: str = "--sign-key") -> Ed25519PrivateKey:
    """The Ed25519 private key of a PEM file (PKCS#8, no passphrase); BadInput naming the option and file otherwise."""
    c = _crypto()
    try:
        key = c.serialization.load_pem_private_key(_pem(path, option), password=None)
    except TypeError:
        raise BadInput(
            f"{option} {path}: the private key is encrypted",
            hint="give an unencrypted PEM key (`openssl pkey -in KEY -out plain.pem`), kept where only the signer reads it",
        ) from None
    except (ValueError, c.InvalidSignature) as err:
        raise BadInput(f"{option} {path}: not a PEM private key ({err})", hint=KEYGEN) from None
    except c.UnsupportedAlgorithm as err:  # a curve OpenSSL does not know: the key is of no use here either way
        raise BadInput(f"{option} {path}: not an Ed25519 key ({err})", hint=KEYGEN) from None
    if not isinstance(key, Ed25519PrivateKey):  # _crypto() above: the import succeeded
        raise BadInput(f"{option} {path}: a {type(key).__name__}, not an Ed25519 key", hint=KEYGEN)
    return key


def load_public_key(path: str | Path, option: str = "--verify-key") -> Ed25519PublicKey:
    """The Ed25519 public key of a PEM file (SubjectPublicKeyInfo); BadInput naming the option and file otherwise."""
    c = _crypto()
    data = _pem(path, option)
    if b"PRIVATE KEY" in data:
        raise BadInput(
            f"{option} {path} holds a private key",
            hint="give the public key: `openssl pkey -in KEY -pubout -out key.pub.pem`; keep the private one secret",
        )
    try:
        key = c.serialization.load_pem_public_key(data)
    except ValueError as err:
        raise BadInput(f"{option} {path}: not a PEM public key ({err})", hint=KEYGEN) from None
    except c.UnsupportedAlgorithm as err:
        raise BadInput(f"{option} {path}: not an Ed25519 key ({err})", hint=KEYGEN) from None
    if not isinstance(key, Ed25519PublicKey):  # _crypto() above: the import succeeded
        raise BadInput(f"{option} {path}: a {type(key).__name__}, not an Ed25519 key", hint=KEYGEN)
    return key


def keyid(public_key: Ed25519PublicKey) -> str:
    c = _crypto()
    der = public_key.public_bytes(c.serialization.Encoding.DER, c.serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def sign(payload: bytes, payload_type: str, private_key: Ed25519PrivateKey) -> Envelope:
    """The envelope {payload, payloadType, signatures: [{keyid, sig}]} (standard base64, as the DSSE examples)."""
    sig = private_key.sign(pae(payload_type, payload))
    return {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": payload_type,
        "signatures": [{"keyid": keyid(private_key.public_key()), "sig": base64.b64encode(sig).decode()}],
    }


def _b64(text: object, where: str) -> bytes:
    """DSSE allows standard or URL-safe base64, padded or not."""
    if not isinstance(text, str):
        raise BadInput(f"{where} is not a base64 string", hint="the file is not a DSSE envelope speclock can read")
    text = text.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise BadInput(f"{where} is not valid base64", hint="the envelope is damaged: sign the report again") from None


# dict[str, Any], not a TypedDict: verify/attest.py takes the parsed envelope as dict[str, Any] (its shape is in the
# docstring); a TypedDict here is for when verify/ is typed as strictly.
def parse(data: bytes, source: str) -> dict[str, Any]:
    """{"payloadType", "payload" (bytes), "signatures": [{"keyid", "sig" (bytes)}]} of an envelope file's bytes."""
    doc = parse_json(
        data, source, what="DSSE envelope", expect=object, hint="give the DSSE envelope `speclock selfcheck --sign-key` wrote"
    )
    if not isinstance(doc, dict) or not isinstance(doc.get("payloadType"), str) or "payload" not in doc:
        raise BadInput(
            f"{source}: not a DSSE envelope (keys 'payload' and 'payloadType' missing)",
            hint="give the DSSE envelope `speclock selfcheck --sign-key` wrote",
        )
    sigs = doc.get("signatures")
    if not isinstance(sigs, list) or not sigs or not all(isinstance(s, dict) for s in sigs):
        raise BadInput(f"{source}: key 'signatures' holds no signature", hint="sign the report (selfcheck --sign-key)")
    return {
        "payloadType": doc["payloadType"],
        "payload": _b64(doc["payload"], f"{source}: key 'payload'"),
        "signatures": [
            {
                "keyid": s.get("keyid") if isinstance(s.get("keyid"), str) else "",
                "sig": _b64(s.get("sig"), f"{source}: key 'signatures[{i}].sig'"),
            }
            for i, s in enumerate(sigs)
        ],
    }


class Subject(ModelTypedDict):
    """One subject of an in-toto Statement v1 (an in-toto ResourceDescriptor): a digest, by algorithm, of what the
    statement is about; the descriptor's other fields as in-toto types them."""

    digest: dict[str, str]  # algorithm -> hex digest ("sha256": ...)
    name: NotRequired[str]
    uri: NotRequired[str]
    downloadLocation: NotRequired[str]
    mediaType: NotRequired[str]
    content: NotRequired[str]
    annotations: NotRequired[dict[str, Any]]


class _Subjects(ModelTypedDict):
    subject: list[Subject]


# A statement's subjects, whatever its predicate (push-image reads any in-toto statement's; verify.attest types the
# whole of a smoke report's). In-toto: a consumer ignores the fields it does not know, so an unknown key passes.
SUBJECTS = DocModel(
    _Subjects,
    "https://in-toto.io/Statement/v1",
    "in-toto-subjects.schema.json",  # not published: verify.attest's statement is
    "in-toto subjects",
    "warn",
    "",
    wording="quoted-path",  # statement_subjects' messages before its model: "key 'subject[0].digest' is string (...)"
)


def statement_subjects(statement: dict[str, Any], source: str, *, hint: str) -> list[Subject]:
    """The `subject` list of an in-toto statement, each entry of in-toto's types (name a string, digest an object of
    algorithm -> hex string: the model Subject); BadInput naming the file and the key otherwise."""
    validate(replace(SUBJECTS, hint=hint), {"subject": statement.get("subject")}, source, warn=_ignored)
    subjects: list[Subject] = statement["subject"]
    return subjects


def _ignored(message: str) -> None:
    """An unknown key of a subject: in-toto's consumers ignore it."""


def verify(envelope: dict[str, Any], public_key: Ed25519PublicKey, source: str) -> None:  # envelope: parse's
    """BadInput unless one of the envelope's signatures verifies over PAE(payloadType, payload) with `public_key`."""
    c = _crypto()
    message = pae(envelope["payloadType"], envelope["payload"])
    for s in envelope["signatures"]:
        try:
            public_key.verify(s["sig"], message)
            return
        except c.InvalidSignature:
            continue
    mine = keyid(public_key)
    named = [s["keyid"] for s in envelope["signatures"] if s["keyid"]]
    if named and mine not in named:
        why = f"it was signed by key {', '.join(k[:16] for k in named)}, not by the given key {mine[:16]}"
    else:
        why = f"the signature of key {mine[:16]} does not match the payload (the envelope or its payload was changed)"
    raise BadInput(
        f"{source}: signature: {why}",
        hint="verify with the public key of the signer; a changed envelope is not to be trusted: sign again",
    )
