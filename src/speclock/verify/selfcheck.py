"""`speclock selfcheck`: the image's default command: doctor, then smoke, then gate.

Writes doctor.json, report.json, gate.json, junit.xml, summary.md and selfcheck.json (the
verdict recorded with the image), and with --sign-key KEY attestation.intoto.json (the report signed
as an in-toto statement in a DSSE envelope, docs/attestation.md), to the output folder (default /tmp/speclock-out, since an
image's root filesystem is read-only). Every stage runs even when an earlier one failed, so
one run shows everything that is wrong. Exit: 3 if any stage met an environment problem,
else 2 for bad input, else 1 if anything failed, else 0.

On a GPU host without a container runtime: `speclock host-env --stack S --dest DIR` builds the
stack's locked environment laid out like the image; then `DIR/bin/speclock selfcheck` (or
`speclock selfcheck --env DIR`, which runs exactly that) takes the stack, lock, target, drafter and
prompts from DIR as an image run takes them from /opt/speclock (docs/host-env.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, TypedDict

from speclock.build.hostenv import env_command, read_record
from speclock.core import dsse
from speclock.core.errors import BadInput, SpeclockError
from speclock.core.files import atomic_write_text, os_error, read_json
from speclock.spec.stack import load_stack
from speclock.verify import attest
from speclock.verify.doctor import DOCTOR_SCHEMA, DoctorOptions, build_context, run_doctor
from speclock.verify.gate import lock_beside, resolve_stack, run_gate, table
from speclock.verify.report import human_table
from speclock.verify.smoke.inputs import SmokeOptions, add_smoke_arguments, resolve_inputs
from speclock.verify.smoke.run import run_smoke


class StageResult(TypedDict, total=False):
    """One stage in selfcheck.json: its exit code and what went wrong, and what the stage itself adds."""

    exit_code: int | None
    error: str | None
    # smoke
    skipped: bool
    note: str
    verdict: str
    failures: list[str]
    warnings: list[str]
    # gate
    baseline: str | None
    # attestation (speclock.verify.attest.AttestationInfo)
    file: str
    keyid: str
    subject: dict[str, Any]


class SelfcheckStages(TypedDict, total=False):
    doctor: StageResult
    smoke: StageResult
    gate: StageResult
    attestation: StageResult


class SelfcheckSummary(TypedDict, total=False):
    """selfcheck.json: every stage's result and the verdict recorded with the image."""

    stages: SelfcheckStages
    verdict: str  # pass | fail | smoke-skipped
    exit_code: int
    warnings: bool


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
        ctx = build_context(DoctorOptions(stack=opts.stack, target=opts.target, draft=opts.draft, json=True))
        checks = run_doctor(ctx)
    except SpeclockError as err:
        return err.exit_code, {"ok": False, "error": str(err)}
    rows = [asdict(c) for c in checks]
    failed = [r["name"] for r in rows if r.get("status") == "fail"]
    code = 3 if ctx.python is None else (1 if failed else 0)
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


def sign_stage(report_path: Path, key, stack_arg: str | None) -> attest.AttestationInfo:
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
    out = Path(opts.smoke.out or "/tmp/speclock-out")
    smoke_opts = replace(opts.smoke, out=str(out))
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is a file, where the output folder belongs", hint="give a folder for the outputs")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, out, "create the output folder") from None
    stages: SelfcheckStages = {}
    summary: SelfcheckSummary = {"stages": stages}
    codes: list[int] = []

    _log("doctor")
    code, doc = run_doctor_stage(smoke_opts)
    atomic_write_text(out / "doctor.json", json.dumps(doc, indent=2, default=str) + "\n")
    stages["doctor"] = {"exit_code": code, "error": doc.get("error")}
    codes.append(code)
    _log(f"doctor: {'ok' if code == 0 else f'FAILED (exit {code})'}{': ' + doc['error'] if doc.get('error') else ''}")

    smoke_code, report_path = None, out / "report.json"
    try:
        inp = resolve_inputs(smoke_opts)
        if inp.stack.is_gpu and not gpu_visible() and not inp.server_url:
            note = f"stack {inp.stack.name} needs a GPU and none is visible: smoke test and gate skipped (doctor ran)"
            _log(note)
            stages["smoke"] = {"skipped": True, "note": note}
            summary["verdict"] = "smoke-skipped" if code == 0 else "fail"
            atomic_write_text(out / "selfcheck.json", json.dumps(summary, indent=2) + "\n")
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
    except SpeclockError as err:
        smoke_code = err.exit_code
        stages["smoke"] = {"exit_code": smoke_code, "error": str(err)}
        _log(f"smoke: {err}")
    codes.append(smoke_code)

    if report_path.is_file():
        _log("gate")
        try:
            result = run_gate(
                report_path, baseline=opts.baseline, stack=opts.smoke.stack, junit=out / "junit.xml", md=out / "summary.md"
            )
            atomic_write_text(out / "gate.json", json.dumps(result.to_json(), indent=2) + "\n")
            print(table(result.checks))
            stages["gate"] = {
                "exit_code": 0 if result.ok else 1,
                "baseline": result.baseline,
                "warnings": result.warnings,
            }
            for w in result.warnings:
                _log(f"gate: WARN: {w}")
            codes.append(0 if result.ok else 1)
        except SpeclockError as err:
            stages["gate"] = {"exit_code": err.exit_code, "error": str(err)}
            codes.append(err.exit_code)
            _log(f"gate: {err}")
    if sign_key is not None and report_path.is_file():
        try:
            signed = sign_stage(report_path, sign_key, opts.smoke.stack)
            stages["attestation"] = {"exit_code": 0, **signed}
            _log(f"attestation: {signed['file']} (key {signed['keyid'][:16]}, subject {signed['subject']['name']})")
        except SpeclockError as err:
            stages["attestation"] = {"exit_code": err.exit_code, "error": str(err)}
            codes.append(err.exit_code)
            _log(f"attestation: {err}")
    final = _combine(codes)
    summary["verdict"] = "pass" if final == 0 else "fail"
    summary["exit_code"] = final
    atomic_write_text(out / "selfcheck.json", json.dumps(summary, indent=2) + "\n")
    warned = bool((stages.get("gate") or {}).get("warnings") or (stages.get("smoke") or {}).get("warnings"))
    summary["warnings"] = warned
    print(
        f"selfcheck: {summary['verdict'].upper()}{' with WARN' if warned and final == 0 else ''} (doctor {codes[0]}, smoke {smoke_code}"
        f"{f', gate {codes[2]}' if len(codes) > 2 else ''}); outputs in {out}"
    )
    return final


def env_args(opts: SmokeOptions, baseline: str) -> list[str]:
    """The selfcheck flags that give `opts` and `baseline` again (for running selfcheck inside a host environment)."""
    argv = []
    defaults = SmokeOptions()
    for f in fields(SmokeOptions):
        value = getattr(opts, f.name)
        if value is not None and value != getattr(defaults, f.name) and f.name not in ("min_speedup", "max_reference_gap"):
            argv += [f"--{f.name.replace('_', '-')}", str(value)]
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


def add_commands(sub) -> None:
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
