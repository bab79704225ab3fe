"""`speclock selfcheck`: the image's default command: doctor, then smoke, then gate.

Writes doctor.json, report.json, gate.json, junit.xml, summary.md and selfcheck.json (the
verdict recorded with the image), and with --sign-key KEY attestation.intoto.json (the report signed
as an in-toto statement in a DSSE envelope, docs/attestation.md), to the output folder (default: /tmp/speclock-out in
an image, whose root filesystem is read-only and whose /tmp is its own; on a host /tmp/speclock-out-<uid>, made
private to the user). Outputs of an earlier run in that folder are removed first.

A signature vouches for this run only: each run has an id (run.id in report.json, run_id in selfcheck.json), and the
gate and the signature take report.json only if it carries this run's id and is byte for byte what this run's smoke
wrote. A stage that could not do its work stops the later ones: a doctor that could not check (exit 2/3: bad input,
an engine that does not import) skips smoke, gate and signature; a smoke refused or broken (exit 2/3: no report of
this run) skips gate and signature; a gate refusal (exit 2/3) skips the signature. A stage that ran and found
failures (exit 1) does not stop the measurement: after doctor's failed checks smoke and gate still run (the same
drafter judged twice, statically and measured: the upgrade's wrong-layers candidate is caught by both), but nothing
is signed; a smoke that FAILED its checks is gated and, with a passing doctor, signed: the signed verdict is "fail".
Exit: 3 if a stage met an environment problem, else 2 for bad input, else 1 if anything failed, else 0.

On a GPU host without a container runtime: `speclock host-env --stack S --dest DIR` builds the
stack's locked environment laid out like the image; then `DIR/bin/speclock selfcheck` (or
`speclock selfcheck --env DIR`, which runs exactly that) takes the stack, lock, target, drafter and
prompts from DIR as an image run takes them from /opt/speclock (docs/host-env.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speclock.build.hostenv.command import env_command, read_record
from speclock.core import dsse
from speclock.core.errors import BadInput, SpeclockError
from speclock.core.files import atomic_write_text, os_error, read_bytes, read_json
from speclock.core.layout import in_image
from speclock.spec.stack import load_stack
from speclock.verify import attest
from speclock.verify.checks import table
from speclock.verify.doctor import DOCTOR_SCHEMA, DoctorOptions, build_context, exit_code_of, run_doctor
from speclock.verify.gate import lock_beside, resolve_stack, run_gate
from speclock.verify.report import human_table
from speclock.verify.selfcheck_record import SELFCHECK_FILE, SELFCHECK_SCHEMA, SelfcheckRecord, SelfcheckStages, Stage
from speclock.verify.smoke.inputs import SmokeOptions, add_smoke_arguments, resolve_inputs
from speclock.verify.smoke.run import run_smoke

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def _log(msg: str) -> None:
    print(f"selfcheck: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SelfcheckOptions:
    smoke: SmokeOptions  # the smoke flags; stack, target and draft also go to doctor
    baseline: str = "auto"  # the gate's --baseline
    sign_key: str | None = None  # PEM Ed25519 private key: sign report.json (attestation.intoto.json beside it)


def run_doctor_stage(opts: SmokeOptions) -> tuple[int, dict[str, Any]]:
    """Doctor on the stack, target and drafter smoke will use; (exit code, doctor.json's content)."""
    try:
        doctor_opts = DoctorOptions(
            stack=opts.stack, target=opts.target, draft=opts.draft, json=True, allow_other_model=opts.allow_other_model
        )
        ctx = build_context(doctor_opts)
        checks = run_doctor(ctx)
    except SpeclockError as err:
        return err.exit_code, {"ok": False, "error": str(err)}
    rows = [asdict(c) for c in checks]
    failed = [r["name"] for r in rows if r.get("status") == "fail"]
    code = exit_code_of(checks) or (3 if ctx.python is None else (1 if failed else 0))  # 2: a model other than the lock's
    return code, {
        "schema": DOCTOR_SCHEMA,
        "checks": rows,
        "failed": failed,
        "verdict": "fail" if code else "pass",
        "error": f"failed checks: {', '.join(failed)}" if failed else None,
    }


def gpu_visible() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*")) or bool(os.environ.get("SPECLOCK_ASSUME_GPU"))


def _combine(codes: list[int]) -> int:
    for c in (3, 2, 1):
        if c in codes:
            return c
    return 0


# What a self-check writes into its output folder: removed at the start of a run, so nothing of an earlier run is
# read, gated or signed as this one's.
OUTPUT_FILES = (
    "doctor.json",
    "report.json",
    "gate.json",
    "junit.xml",
    "summary.md",
    SELFCHECK_FILE,
    attest.ATTESTATION_FILE,
)


def default_out() -> Path:
    """An image's /tmp is its own; a host's is shared, so the default there is a folder of this user's."""
    return Path("/tmp/speclock-out") if in_image() else Path(f"/tmp/speclock-out-{os.getuid()}")


def prepare_out(out: Path, private: bool) -> list[str]:
    """Make the output folder (private: mode 0700, and refused when it is a link or another user's) and remove the
    outputs of an earlier run from it; returns the names removed."""
    if out.is_symlink() and private:
        raise BadInput(f"the output folder {out} is a symbolic link", hint="remove it, or give --out a folder of yours")
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is a file, where the output folder belongs", hint="give a folder for the outputs")
    try:
        out.mkdir(parents=True, exist_ok=True, mode=0o700 if private else 0o777)
        if private:
            st = out.stat()
            if st.st_uid != os.getuid():
                raise BadInput(
                    f"the output folder {out} belongs to user {st.st_uid}, not to you ({os.getuid()})",
                    hint="give --out a folder of yours",
                )
            os.chmod(out, 0o700)
        removed = []
        for name in OUTPUT_FILES:
            if (out / name).is_file() or (out / name).is_symlink():
                (out / name).unlink()
                removed.append(name)
    except OSError as err:
        raise os_error(err, out, "prepare the output folder") from None
    return removed


def this_runs_report(report_path: Path, run_id: str) -> str:
    """The sha256 of report.json when it is this run's (run.id == run_id); BadInput naming what it is otherwise."""
    data = read_bytes(report_path, what="report file")
    found = (read_json(report_path, what="report file").get("run") or {}).get("id")
    if found != run_id:
        raise BadInput(
            f"{report_path} is not this run's report (run.id {found!r}, this run {run_id!r}): it is not gated or signed",
            hint="run selfcheck again with an output folder nothing else writes to",
        )
    return hashlib.sha256(data).hexdigest()


def unchanged(report_path: Path, sha256: str, stage: str) -> None:
    """report.json is still the bytes this run's smoke wrote (a file swapped in between is refused)."""
    if hashlib.sha256(read_bytes(report_path, what="report file")).hexdigest() != sha256:
        raise BadInput(
            f"{report_path} changed after this run's smoke wrote it: the {stage} refuses it",
            hint="run selfcheck again with an output folder nothing else writes to",
        )


def sign_stage(report_path: Path, key: Ed25519PrivateKey, stack_arg: str | None) -> attest.AttestationInfo:
    """Sign report.json as written; the subject is the report's image digest, else the stack's lock (attest.py)."""
    report = read_json(report_path, what="report file")
    lock_sha = None
    if attest.image_digest(report) is None:
        stack = resolve_stack(report, stack_arg, str(report_path))
        lock_sha = attest.lock_identity(lock_beside(stack)[0], stack)
    return attest.sign_report(report_path, key, lock_sha256=lock_sha)


def selfcheck(opts: SelfcheckOptions) -> int:
    if opts.smoke.stack:  # a bad --stack is bad input for every stage: refuse it before anything is written
        load_stack(opts.smoke.stack)
    # the key is read first: a bad one is exit 2 (or 3 without `cryptography`) before minutes of smoke test
    sign_key = dsse.load_private_key(opts.sign_key) if opts.sign_key else None
    out = Path(opts.smoke.out) if opts.smoke.out else default_out()
    run_id = uuid.uuid4().hex
    smoke_opts = replace(opts.smoke, out=str(out))
    removed = prepare_out(out, private=not opts.smoke.out and not in_image())
    if removed:
        _log(f"removed the outputs of an earlier run from {out}: {', '.join(removed)}")
    stages: SelfcheckStages = {}
    summary: SelfcheckRecord = {"schema": SELFCHECK_SCHEMA, "run_id": run_id, "stages": stages, "verdict": "fail"}
    codes: list[int] = []

    def skip(why: str, *names: Stage) -> None:
        for stage in names:
            stages[stage] = {"skipped": True, "note": why}
            _log(f"{stage}: skipped ({why})")

    _log(f"doctor (run {run_id})")
    code, doc = run_doctor_stage(smoke_opts)
    atomic_write_text(out / "doctor.json", json.dumps(doc, indent=2, default=str) + "\n")
    stages["doctor"] = {"exit_code": code, "error": doc.get("error")}
    codes.append(code)
    _log(f"doctor: {'ok' if code == 0 else f'FAILED (exit {code})'}{': ' + doc['error'] if doc.get('error') else ''}")

    smoke_code, report_path, report_sha = None, out / "report.json", None
    if code not in (0, 1):
        skip(f"doctor could not check (exit {code})", "smoke", "gate", "attestation")
    else:
        try:
            inp = resolve_inputs(smoke_opts)
            inp.run_id = run_id
            if inp.stack.is_gpu and not gpu_visible() and not inp.server_url:
                note = f"stack {inp.stack.name} needs a GPU and none is visible: smoke test and gate skipped (doctor ran)"
                _log(note)
                stages["smoke"] = {"skipped": True, "note": note}
                summary["verdict"] = "smoke-skipped"
                atomic_write_text(out / SELFCHECK_FILE, json.dumps(summary, indent=2) + "\n")
                return code
            _log("smoke")
            report, smoke_code = run_smoke(inp)
            print(human_table(report))
            stages["smoke"] = {
                "exit_code": smoke_code,
                "verdict": report["verdict"],
                "failures": report["failures"],
                "warnings": report.get("warnings") or [],
            }  # e.g. a batch-1 speedup too spread to judge
            if smoke_code in (0, 1):  # a report of this run: its checks passed or failed
                report_sha = this_runs_report(report_path, run_id)
        except SpeclockError as err:
            smoke_code = err.exit_code
            stages["smoke"] = {"exit_code": smoke_code, "error": str(err)}
            _log(f"smoke: {err}")
        codes.append(smoke_code)

    gate_code = None
    if report_sha is None:
        if code in (0, 1):
            skip(f"smoke did not write a report of this run (exit {smoke_code})", "gate", "attestation")
    else:
        _log("gate")
        try:
            unchanged(report_path, report_sha, "gate")
            result = run_gate(
                report_path, baseline=opts.baseline, stack=opts.smoke.stack, junit=out / "junit.xml", md=out / "summary.md"
            )
            atomic_write_text(out / "gate.json", json.dumps(result.to_json(), indent=2) + "\n")
            print(table(result.checks))
            gate_code = 0 if result.ok else 1
            stages["gate"] = {"exit_code": gate_code, "baseline": result.baseline, "warnings": result.warnings}
            for w in result.warnings:
                _log(f"gate: WARN: {w}")
        except SpeclockError as err:
            gate_code = err.exit_code
            stages["gate"] = {"exit_code": gate_code, "error": str(err)}
            _log(f"gate: {err}")
        codes.append(gate_code)
        if sign_key is None:
            pass
        elif code != 0:
            skip(f"doctor failed (exit {code}): an image whose checks fail is not vouched for", "attestation")
        elif gate_code not in (0, 1):
            skip(f"the gate refused the report (exit {gate_code})", "attestation")
        else:
            try:
                unchanged(report_path, report_sha, "signature")
                signed = sign_stage(report_path, sign_key, opts.smoke.stack)
                stages["attestation"] = {
                    "exit_code": 0,
                    "file": signed["file"],
                    "keyid": signed["keyid"],
                    "subject": signed["subject"],
                }
                _log(f"attestation: {signed['file']} (key {signed['keyid'][:16]}, subject {signed['subject']['name']})")
            except SpeclockError as err:
                stages["attestation"] = {"exit_code": err.exit_code, "error": str(err)}
                codes.append(err.exit_code)
                _log(f"attestation: {err}")
    final = _combine(codes)
    summary["verdict"] = "pass" if final == 0 else "fail"
    summary["exit_code"] = final
    atomic_write_text(out / SELFCHECK_FILE, json.dumps(summary, indent=2) + "\n")
    warned = bool((stages.get("gate") or {}).get("warnings") or (stages.get("smoke") or {}).get("warnings"))
    print(
        f"selfcheck: {summary['verdict'].upper()}{' with WARN' if warned and final == 0 else ''} (doctor {codes[0]}, smoke "
        f"{'skipped' if smoke_code is None else smoke_code}{'' if gate_code is None else f', gate {gate_code}'}); "
        f"outputs in {out} (run {run_id})"
    )
    return final


def env_args(opts: SmokeOptions, baseline: str) -> list[str]:
    """The selfcheck flags that give `opts` and `baseline` again (for running selfcheck inside a host environment)."""
    argv = []
    defaults = SmokeOptions()
    for f in fields(SmokeOptions):
        value = getattr(opts, f.name)
        if value is not None and value != getattr(defaults, f.name) and f.name not in ("min_speedup", "max_reference_gap"):
            flag = f"--{f.name.replace('_', '-')}"
            argv += [flag] if value is True else [flag, str(value)]  # a switch (--allow-other-model) has no value
    return argv + (["--baseline", baseline] if baseline != "auto" else [])


def selfcheck_in_env(env_dir: str, opts: SmokeOptions, baseline: str, sign_key: str | None = None) -> int:
    """Run selfcheck inside a host environment (`speclock host-env`): its bin/speclock, which sets what the image's
    ENV sets; a --stack must be the environment's own."""
    record = read_record(Path(env_dir))
    if opts.stack and load_stack(opts.stack).name != record["stack"]:
        raise BadInput(
            f"--stack {opts.stack}: the environment {env_dir} is stack {record['stack']}'s",
            hint=f"leave out --stack (the environment's stack is used), or build one with `speclock host-env "
            f"--stack {opts.stack} --dest DIR`",
        )
    signing = ["--sign-key", str(Path(sign_key).absolute())] if sign_key else []
    cmd = env_command(Path(env_dir), ["selfcheck", *env_args(replace(opts, stack=None), baseline), *signing])
    _log(f"running in the host environment {env_dir} (stack {record['stack']}, target {record['target']}): {' '.join(cmd)}")
    return subprocess.run(cmd).returncode


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    if args.env:
        return selfcheck_in_env(args.env, SmokeOptions.from_args(args), args.baseline, args.sign_key)
    return selfcheck(SelfcheckOptions(SmokeOptions.from_args(args), baseline=args.baseline, sign_key=args.sign_key))


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "selfcheck",
        help="doctor + smoke + gate: the image's default command",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_smoke_arguments(p)
    p.add_argument(
        "--baseline",
        default="auto",
        help="baseline report for the gate ('auto' = the stored one for this stack and engine version, 'none' = skip)",
    )
    p.add_argument(
        "--env",
        metavar="DIR",
        help="run inside the host environment DIR made by `speclock host-env` (its "
        "stack, lock, target and prompts, as in an image)",
    )
    p.add_argument(
        "--sign-key",
        metavar="KEY",
        help="PEM Ed25519 private key: sign report.json as an in-toto statement "
        f"in a DSSE envelope, {attest.ATTESTATION_FILE} beside it "
        "(`speclock gate --verify-key` checks it; docs/attestation.md)",
    )
    p.set_defaults(func=_cmd_selfcheck)
