"""Reports that prove their origin (issue #26, docs/attestation.md): a smoke report signed as an in-toto Statement v1
in a DSSE envelope (Ed25519), written beside report.json, and checked by `speclock gate --verify-key`.

The statement's subject is what the report was measured on: the image by digest (name = the image ref), or, for a
host environment or a checkout (no image digest), the lock by its sha256 (name host-env:<stack>@<hostname>). The
predicate is the report itself, so any edit of a signed report, or a report carried to another image, is refused.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from speclock.core import dsse
from speclock.core.docmodel import DocModel, validate
from speclock.core.docmodel import TypedDict as ModelTypedDict
from speclock.core.errors import BadInput
from speclock.core.files import MAX_READ_BYTES, atomic_write_text, read_bytes, read_json
from speclock.core.jsonread import loads
from speclock.spec.lock import read_lock
from speclock.verify.report_types import SmokeReport

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # optional (core.dsse)

    from speclock.spec.stack import Stack

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://speclock.dev/smoke/v1"
ATTESTATION_FILE = "attestation.intoto.json"
_HEX_DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
_SIGN_HINT = "sign the report again (`speclock selfcheck --sign-key KEY` writes report.json and its attestation together)"


class SmokeStatement(ModelTypedDict):
    """The payload of attestation.intoto.json: an in-toto Statement v1 whose predicate (predicateType
    https://speclock.dev/smoke/v1) is the smoke report it signs, as `speclock smoke` wrote it (docs/attestation.md)."""

    _type: Literal["https://in-toto.io/Statement/v1"]
    subject: list[dsse.Subject]  # the image by digest, or the lock by its sha256 (subject_for)
    predicateType: Literal["https://speclock.dev/smoke/v1"]
    predicate: SmokeReport


# Unknown keys: a WARN naming them, as in the report the predicate is (in-toto: a consumer ignores the fields it does
# not know). schemas/attestation-predicate.schema.json is generated from it: the predicate's type and its statement.
ATTESTATION = DocModel(
    SmokeStatement,
    PREDICATE_TYPE,
    "attestation-predicate.schema.json",
    "speclock attestation: an in-toto Statement v1 whose predicate is a smoke report",
    "warn",
    _SIGN_HINT,
    id_key="predicateType",
)


def lock_identity(lock_file: Path, stack: Stack | None = None) -> str:
    """The sha256 that names a lock: the full lock's, also for a host environment's per-target view (lock_from)."""
    doc = read_lock(Path(lock_file), stack=stack)
    return doc.get("lock_from") or doc["lock_sha256"]


def image_digest(report: dict[str, Any]) -> str | None:
    """The hex sha256 of the image the report names, or None (a host run, or an image that knows no digest)."""
    found = _HEX_DIGEST.fullmatch(str((report.get("image") or {}).get("digest") or ""))
    return found.group(1) if found else None


def host_name(report: dict[str, Any], host: str | None = None) -> str:
    return f"host-env:{report['stack']}@{host or socket.gethostname()}"


def subject_for(report: dict[str, Any], lock_sha256: str | None, host: str | None = None) -> dict[str, Any]:
    digest = image_digest(report)
    if digest:
        return {"name": (report.get("image") or {}).get("ref") or f"speclock-{report['stack']}", "digest": {"sha256": digest}}
    if not lock_sha256:
        raise BadInput(
            f"the report of stack {report['stack']} names no image digest and no lock was found to name it by",
            hint=f"run where the stack's lock is (locks/{report['stack']}.lock, or the image's lock.json)",
        )
    return {"name": host_name(report, host), "digest": {"sha256": lock_sha256}}


def statement(report: dict[str, Any], subject: dict[str, Any]) -> dict[str, Any]:
    return {"_type": STATEMENT_TYPE, "subject": [subject], "predicateType": PREDICATE_TYPE, "predicate": report}


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class AttestationInfo(TypedDict):
    """What sign_report wrote, or what verify_report checked: the envelope's file, the key's id and the subject."""

    file: str
    keyid: str
    subject: dict[str, Any]  # an in-toto subject (dsse.Subject's shape), as selfcheck's record of it types it


def sign_report(
    report_path: Path,
    private_key: Ed25519PrivateKey,
    *,
    lock_sha256: str | None,
    dest: Path | None = None,
    host: str | None = None,
) -> AttestationInfo:
    """Sign report.json's content as it is on disk; write the envelope (default: beside it). Returns what was written."""
    report = read_json(report_path, what="report file")
    subject = subject_for(report, lock_sha256, host)
    envelope = dsse.sign(_canonical(statement(report, subject)), dsse.INTOTO_PAYLOAD_TYPE, private_key)
    dest = Path(dest) if dest else Path(report_path).parent / ATTESTATION_FILE
    atomic_write_text(dest, json.dumps(envelope, indent=2) + "\n")
    return {"file": str(dest), "keyid": envelope["signatures"][0]["keyid"], "subject": subject}


def first_difference(a: Any, b: Any, at: str = "") -> str:
    """The dotted key where two JSON documents first differ (sorted keys), for a message a person can act on."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b or _canonical(a[key]) != _canonical(b[key]):
                return first_difference(a.get(key), b.get(key), f"{at}.{key}" if at else key)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):  # equal lengths: checked just above
            if _canonical(x) != _canonical(y):
                return first_difference(x, y, f"{at}[{i}]")
    return at or "(the whole document)"


def _statement_of(envelope: dict[str, Any], source: str) -> dict[str, Any]:
    if envelope["payloadType"] != dsse.INTOTO_PAYLOAD_TYPE:
        raise BadInput(f"{source}: payloadType is {envelope['payloadType']!r}, not {dsse.INTOTO_PAYLOAD_TYPE}", hint=_SIGN_HINT)
    try:
        doc = loads(envelope["payload"])
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        raise BadInput(f"{source}: the payload is not an in-toto Statement v1 (key '_type')", hint=_SIGN_HINT)
    if doc.get("predicateType") != PREDICATE_TYPE:
        raise BadInput(
            f"{source}: predicateType is {doc.get('predicateType')!r}, not {PREDICATE_TYPE} (a smoke report)",
            hint="give the attestation of a smoke report",
        )
    validate(ATTESTATION, doc, source, warn=_statement_warn)  # a digest that is a string is exit 2 naming the key
    return doc


def _statement_warn(message: str) -> None:
    """A WARN for a key the statement's model does not know, but the predicate's: the predicate is the report (checked
    equal to it next), whose own reader names them."""
    if "key 'predicate." not in message:
        print(f"WARN: {message}", file=sys.stderr)


def check_subject(
    report: dict[str, Any], subjects: list[dict[str, Any]], source: str, report_source: str, lock_sha256: Callable[[], str]
) -> dict[str, Any]:
    """The subject that names what the report names; BadInput naming both otherwise. `lock_sha256`: a callable,
    asked only for a report without an image digest."""
    named = ", ".join(f"{s.get('name')}@sha256:{str((s.get('digest') or {}).get('sha256'))[:16]}" for s in subjects)
    digest = image_digest(report)
    if digest:
        ref = (report.get("image") or {}).get("ref") or f"speclock-{report['stack']}"
        want = f"image {ref}@sha256:{digest[:16]}"
        match = [s for s in subjects if (s.get("digest") or {}).get("sha256") == digest]
        if match and match[0].get("name") != ref:
            raise BadInput(
                f"{source}: subject: the attestation names {match[0].get('name')!r}, the report {report_source} "
                f"names image {ref!r} (key 'image.ref')",
                hint=_SIGN_HINT,
            )
    else:
        lock = lock_sha256()
        want = f"{host_name(report, '<host>')} with lock sha256:{lock[:16]}"
        match = [
            s
            for s in subjects
            if (s.get("digest") or {}).get("sha256") == lock and str(s.get("name", "")).startswith(f"host-env:{report['stack']}@")
        ]
    if not match:
        raise BadInput(
            f"{source}: subject: the attestation is for {named or 'nothing'}, but the report {report_source} names {want}",
            hint="a report is valid only for the image (or lock) it was measured on: gate the report with its own attestation",
        )
    return match[0]


def verify_report(
    report_path: Path, key_path: str | Path, *, envelope_path: Path | None, lock_sha256: Callable[[], str]
) -> AttestationInfo:
    """BadInput unless the envelope is signed by `key_path`'s key, its predicate is the report's content and its
    subject is what the report names. Returns {"file", "keyid", "subject"}."""
    envelope_path = Path(envelope_path) if envelope_path else Path(report_path).parent / ATTESTATION_FILE
    source = str(envelope_path)
    if not envelope_path.exists() and not envelope_path.is_symlink():  # a folder or a FIFO: read_bytes names it
        raise BadInput(
            f"--verify-key: no attestation {envelope_path} for the report {report_path}",
            hint="sign the report (`speclock selfcheck --sign-key KEY`), or pass --attestation FILE",
        )
    key = dsse.load_public_key(key_path)
    envelope = dsse.parse(read_bytes(envelope_path, what="attestation", max_bytes=MAX_READ_BYTES), source)
    dsse.verify(envelope, key, source)  # first: nothing in an unverified payload is trusted
    doc = _statement_of(envelope, source)
    report = read_json(report_path, what="report file")
    if _canonical(doc.get("predicate")) != _canonical(report):
        key_at = first_difference(doc.get("predicate"), report)
        raise BadInput(
            f"{source}: predicate: the report {report_path} is not the one that was signed (key '{key_at}' differs)",
            hint="gate the report exactly as it was signed; an edited report needs a new run",
        )
    subject = check_subject(report, doc["subject"], source, str(report_path), lock_sha256)
    return {"file": source, "keyid": dsse.keyid(key), "subject": subject}
