"""`speclock gate REPORT [--baseline REPORT]`: pass or fail a smoke report against the stack's thresholds.

The same `evaluate` decides a smoke run's own verdict (without a baseline), so the image's
self-check and CI apply one set of rules. Outputs: a table, JUnit XML and Markdown for CI.
Baseline reports live in `baselines/<stack>/<engine package>-<version>.json`.

A gate that can be fooled is worse than none, so before any check runs:
- the report must be consistent (speclock.verify.report.validate_report: counters that agree);
- its engine must be the one its stack pins, in the stack file and in the stack's lock
  (a report relabelled to another stack is refused);
- a baseline must be a valid measurement of the same thing: same stack, engine family, k,
  max_tokens, prompt count, and the same drafter, target and prompts by hash (reference.key);
  a side that does not say which drafter it measured cannot be compared (exit 2);
- a requested baseline that is missing is bad input; no baseline at all is a visible WARN
  (table, JSON, JUnit, Markdown), never a silent pass of the regression check.

The baseline side (where one is stored, matching it to the report, acceptance drift) is
speclock.verify.baseline; this module resolves the stack and lock, holds the rules and runs the command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from speclock.core import files
from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.layout import IMAGE, REPO_ROOT, in_image
from speclock.core.names import normalize
from speclock.spec.lock import read_lock
from speclock.spec.stack import Stack, load_stack, load_stack_named, stacks_dir
from speclock.verify import attest
from speclock.verify.baseline import baseline_path as baseline_path
from speclock.verify.baseline import builtin_profile, drift_checks, rel_drop, temperature_of
from speclock.verify.baseline import check_baseline_matches as check_baseline_matches
from speclock.verify.baseline import find_baseline as find_baseline
from speclock.verify.checks import Check, failures_of, junit_xml, markdown, table, warning
from speclock.verify.gate_result import GateResult
from speclock.verify.model_pin import identity_checks
from speclock.verify.plausibility import check_against_stack
from speclock.verify.profiles import Profile, report_profile, resolve_profile
from speclock.verify.report import load_report
from speclock.verify.report_dates import GPU_ARCH_SINCE, GPU_NAME_SINCE
from speclock.verify.report_types import SmokeReport
from speclock.verify.speed import speed_checks
from speclock.verify.speed_load import loaded_checks


def evaluate(
    report: SmokeReport,
    thresholds: dict[str, Any],
    baseline: SmokeReport | None = None,
    profile: Profile | None = None,
    baseline_source: str = "the baseline",
) -> list[Check]:
    """Every check the report must pass; a failed check's `kind` says where the fault most likely is.

    `profile` gives the drift tolerances against the baseline (default: the built-in values of the report's profile)."""
    m, ll = report["metrics"], report["lossless"]
    run = report.get("run") or {"completed": True, "error": None}
    checks = [
        Check(
            "engine run completed",
            bool(run.get("completed")),
            run.get("completed"),
            "true",
            "engine",
            "" if run.get("completed") else f"the engine failed: {run.get('error')}",
        )
    ]
    if not (temperature_of(report) > 0 and ll.get("mode") == "sampled"):  # sampled: see profiles.py (not token by token)
        checks.append(
            Check(
                "lossless (spec == plain, token for token, up to numeric ties)",
                ll["checked"] > 0 and ll["mismatches"] == 0,
                f"{ll['mismatches']}/{ll['checked']} differ",
                "0 differ",
                "lossless",
                "" if ll["checked"] else "no outputs were compared",
            )
        )
    k = report["num_speculative_tokens"]
    mal = m["mean_acceptance_length"]
    floor = thresholds.get("min_mean_acceptance_length", 1.0)
    checks.append(Check("mean acceptance length", mal >= floor, mal, f">= {floor}", "drafter"))
    drafts = m["num_drafts"]
    rates = [a / drafts if drafts else 0.0 for a in m["accepted_per_position"]]
    for i, pos_floor in enumerate(thresholds.get("min_acceptance_per_position") or []):
        rate = rates[i] if i < len(rates) else 0.0
        checks.append(Check(f"acceptance at position {i + 1} of {k}", rate >= pos_floor, rate, f">= {pos_floor}", "drafter"))
    ref = report.get("reference")
    gap = ref.get("gap") if ref else None
    if ref and gap is not None:
        limit = thresholds.get("max_reference_gap", 0.15)
        # a gap is given only with the reference's metrics (speclock.verify.report._check_reference)
        rm = (ref["metrics"] or {})["mean_acceptance_length"]
        checks.append(
            Check(
                "engine vs reference acceptance (integration)",
                gap <= limit,
                gap,
                f"<= {limit}",
                "integration",
                ""
                if gap <= limit
                else f"engine mean acceptance length {mal:.3f} vs reference {rm:.3f} on the same drafter and prompts "
                f"(gap {gap:.3f} > {limit}): the engine integration is broken (e.g. wrong aux layers "
                f"captured), not the drafter",
            )
        )
    if baseline is not None:
        profile = profile or builtin_profile(report)
        limit = thresholds.get("max_relative_drop", 0.05)
        if not profile.two_sided:  # two-sided profiles check the mean both ways in drift_checks
            base_mal = baseline["metrics"]["mean_acceptance_length"]
            drop = rel_drop(base_mal, mal)
            checks.append(
                Check(
                    f"acceptance length vs baseline ({baseline['engine']['version']})",
                    drop <= limit,
                    drop,
                    f"<= {limit} relative drop",
                    "regression",
                    "" if drop <= limit else f"{mal:.3f} vs baseline {base_mal:.3f}: dropped {drop:.1%} (limit {limit:.0%})",
                )
            )
        checks += drift_checks(m, baseline["metrics"], profile, thresholds)
        base_backends = {b["backend"]: b for b in baseline.get("attention_backends") or []}
        for b in (report.get("attention_backends") or [])[1:]:  # the first backend is the top-level metrics
            checks += drift_checks(
                b["metrics"], base_backends[b["backend"]]["metrics"], profile, thresholds, f", attention backend {b['backend']}"
            )
    checks += identity_checks(report)  # the served model against the lock's identity: WARN when allowed to differ
    return checks + speed_checks(report, thresholds, baseline, baseline_source) + loaded_checks(report, thresholds)


def unshown_gpu_checks(report: SmokeReport, stack: Stack) -> list[Check]:
    """A completed GPU-stack report written before smoke recorded a gpu key (report_dates.GPU_ARCH_SINCE,
    GPU_NAME_SINCE) is judged, with a WARN per key saying what it cannot show; a newer one without them is refused
    (plausibility.check_against_stack)."""
    gpu = report.get("gpu") or {}
    if not stack.is_gpu or not report["run"]["completed"]:
        return []
    checks = []
    if "arch" not in gpu:  # only a report from before GPU_ARCH_SINCE gets here without it
        checks.append(
            warning(
                "GPU arch in the report",
                None,
                "gpu.arch",
                "evidence",
                f"the report has no gpu.arch: it was written before smoke recorded it ({GPU_ARCH_SINCE}); whether a "
                f"GPU of the stack's archs ({', '.join(stack.gpu['archs'])}) ran it cannot be told",
            )
        )
    if not gpu.get("name"):  # only a report from before GPU_NAME_SINCE gets here without it
        seen = f"gpu.arch {gpu['arch']} says one was visible" if gpu.get("arch") else "no gpu.arch says one was visible"
        checks.append(
            warning(
                "GPU named in the report",
                None,
                "gpu.name",
                "evidence",
                f"the report names no GPU: it was written before smoke recorded gpu.name ({GPU_NAME_SINCE[:10]}); "
                f"{seen}, but which GPU ran it, and so whose speed it compares with, cannot be told (a report of a "
                "newer smoke names it)",
            )
        )
    return checks


def lock_beside(stack: Stack) -> tuple[Path, bool]:
    """The lock of a stack file: <root>/locks/<name>.lock next to <root>/stacks/. Required for the repo's stacks;
    for a stack elsewhere (an upgrade candidate) it is checked when it is there."""
    if in_image() and stack.path.resolve().parent == (IMAGE.root / "stacks").resolve():
        return IMAGE.lock_file, True  # an image carries its stack's lock as lock.json
    lock = stack.path.parent.parent / "locks" / f"{stack.name}.lock"
    required = stack.path.resolve().parent == stacks_dir().resolve()
    return lock, required


def resolve_stack(report: SmokeReport, stack_arg: str | None, report_source: str = "the report") -> Stack:
    """The stack to judge by: --stack, else the image's, else stacks/<report's stack>.toml (a plain name, confined).

    The report's engine must be the one that stack pins, in the stack file and in its lock.
    """
    if stack_arg:
        stack = load_stack(stack_arg)
        lock, required = lock_beside(stack)
    elif in_image():
        try:
            stack_file = IMAGE.stack_file
        except StopIteration:
            raise EnvironmentProblem(
                f"no stack file in {IMAGE.root / 'stacks'}", hint="run the gate in an image speclock built, or pass --stack"
            ) from None
        stack = load_stack(stack_file)
        lock, required = IMAGE.lock_file, True
    else:
        stack = load_stack_named(report["stack"], source=f"{report_source}: key 'stack'")
        lock, required = lock_beside(stack)
    if stack.name != report["stack"]:
        raise BadInput(
            f"{report_source}: the report is for stack {report['stack']!r}, the thresholds are from "
            f"{stack.name!r} ({stack.path})",
            hint="pass the report's own stack with --stack",
        )
    check_engine_matches(report, stack, lock if (required or lock.is_file()) else None, report_source)
    check_against_stack(report, stack, report_source)  # ran on the stack's kind of machine, in its image
    return stack


def check_engine_matches(report: SmokeReport, stack: Stack, lock: Path | None, report_source: str = "the report") -> None:
    """The report's engine (name, package, version) is the one the stack pins, and the one its lock resolved."""
    eng, pinned = report["engine"], stack.engine
    hint = (
        "gate a report with the stack it was measured on: a report relabelled to another stack is refused, "
        "and a report of another engine version needs that version's stack and lock"
    )
    pairs = [
        ("engine.name", eng["name"], pinned["name"]),
        ("engine.package", eng.get("package", pinned["package"]), pinned["package"]),
        ("engine.version", eng["version"], pinned["version"]),
    ]
    # smoke writes an empty version when the engine is not installed; such a run never completes, so the
    # gate fails it ("engine run completed") and an empty version can never pass.
    not_installed = eng["version"] == "" and report.get("run", {}).get("completed") is False
    if not_installed:
        pairs.pop()
    for key, mine, theirs in pairs:
        if mine != theirs:
            raise BadInput(
                f"{report_source}: key '{key}' is {mine!r}, but stack {stack.name} ({stack.path}) pins {theirs!r}", hint=hint
            )
    if lock is None or not_installed:
        return

    doc = read_lock(lock, stack=stack)  # the stack adds its own index host to the allowed ones
    if doc.get("stack") != stack.name:
        raise BadInput(
            f"{lock}: key 'stack' is {files.short_repr(doc.get('stack'))}, not the stack {stack.name}",
            hint=f"re-create the lock with `invoke lock --stack {stack.name}`",
        )
    versions = [p["version"] for p in doc["packages"] if normalize(p["name"]) == normalize(pinned["package"])]
    if not versions:
        raise BadInput(
            f"{lock}: the engine package {pinned['package']} is not in the lock",
            hint=f"re-create the lock with `invoke lock --stack {stack.name}`",
        )
    if eng["version"] not in versions:
        raise BadInput(
            f"{report_source}: key 'engine.version' is {eng['version']!r}, but the lock {lock} resolved "
            f"{pinned['package']}=={versions[0]}",
            hint=hint,
        )


def thresholds_for(report: SmokeReport, stack_arg: str | None) -> tuple[dict[str, Any], str]:
    """The stack's thresholds (see resolve_stack) and the stack file they came from."""
    stack = resolve_stack(report, stack_arg)
    return dict(stack.thresholds), str(stack.path)


def _stored_baseline(stack: Stack, baselines_dir: Path | None, profile: str = "quick") -> tuple[Path | None, str]:
    """(the stored baseline, None) or (None, why there is none): --baseline auto, for the report's profile."""
    bdir = baselines_dir or (IMAGE.baselines_dir if in_image() else REPO_ROOT / "baselines")
    path = baseline_path(bdir, stack.name, stack.engine["package"], stack.engine["version"], profile)
    if path.exists():
        return path, ""
    if not bdir.is_dir():
        return None, f"no baselines folder {bdir}"
    return None, f"no stored {profile}-profile baseline {path} for {stack.engine['package']} {stack.engine['version']}"


def run_gate(
    report_path: Path,
    *,
    baseline: str | None = "auto",
    stack: str | None = None,
    baselines_dir: Path | None = None,
    junit: Path | None = None,
    md: Path | None = None,
) -> GateResult:
    """Gate one report; write JUnit/Markdown when asked. Raises BadInput for bad reports, stacks or baselines.

    Nothing is written until every input has been read and checked.
    """
    report_src = str(report_path)
    unknown_keys: list[str] = []  # keys the report's model does not know (a newer speclock's): WARN, in the result
    report = load_report(report_path, warn=unknown_keys.append)
    st = resolve_stack(report, stack, report_src)
    thresholds = dict(st.thresholds)
    profile = resolve_profile(st, report_profile(report), source=f"{report_src}: key 'profile.name'")
    if baselines_dir is not None and not Path(baselines_dir).is_dir():
        raise BadInput(
            f"--baselines-dir {baselines_dir}: {'not a folder' if Path(baselines_dir).exists() else 'no such folder'}",
            hint="give the folder that holds <stack>/<engine package>-<version>.json (the repo's baselines/), "
            "or leave --baselines-dir out",
        )
    base_doc: SmokeReport | None = None
    base_src: str | None = None
    warnings: list[str] = []
    if baseline is None or baseline == "none":
        warnings.append("no baseline (--baseline none): the regression check against a baseline was skipped")
    elif baseline == "auto":
        found, why = _stored_baseline(st, Path(baselines_dir) if baselines_dir else None, profile.name)
        if found is None:
            warnings.append(
                f"no baseline: {why}; the regression check against a baseline was skipped "
                "(record one by checking a passing report and copying it there, or pass --baseline REPORT)"
            )
        else:
            base_src = str(found)
    else:
        base_src = str(baseline)
    if base_src is not None:
        base_doc = load_report(base_src, what="baseline report", warn=unknown_keys.append)
        check_baseline_matches(report, base_doc, base_src, report_src)
    checks = evaluate(report, thresholds, base_doc, profile, base_src or "the baseline")
    checks += unshown_gpu_checks(report, st)
    if base_doc is None:
        checks.append(warning("acceptance length vs baseline", None, "a baseline report", "regression", warnings[0]))
    warnings += [c.detail for c in checks if c.warn and c.detail not in warnings]  # speed: no speed baseline, wide spread
    warnings += unknown_keys
    result = GateResult(all(c.ok for c in checks), checks, base_src, warnings)
    if junit:
        files.atomic_write_text(junit, junit_xml(checks))
    if md:
        files.atomic_write_text(md, markdown(report, checks, base_src, warnings))
    return result


def verify_origin(report_path: Path, key: str, *, attestation: str | None, stack: str | None) -> attest.AttestationInfo:
    """--verify-key: the report is the one the key's holder signed, for the image (or lock) it names (attest.py)."""
    st = resolve_stack(load_report(report_path, warn=lambda _: None), stack, str(report_path))  # run_gate warns
    lock, _ = lock_beside(st)
    return attest.verify_report(
        report_path,
        key,
        envelope_path=Path(attestation) if attestation else None,
        lock_sha256=lambda: attest.lock_identity(lock, st),
    )


def _cmd_gate(args: argparse.Namespace) -> int:
    if args.attestation and not args.verify_key:
        raise BadInput(
            "--attestation needs --verify-key (the public key to check it with)",
            hint="pass --verify-key PUBLIC.pem, or leave --attestation out",
        )
    origin = (
        verify_origin(Path(args.report), args.verify_key, attestation=args.attestation, stack=args.stack)
        if args.verify_key
        else None
    )
    result = run_gate(
        Path(args.report),
        baseline=args.baseline,
        stack=args.stack,
        baselines_dir=Path(args.baselines_dir) if args.baselines_dir else None,
        junit=Path(args.junit) if args.junit else None,
        md=Path(args.markdown) if args.markdown else None,
    )
    if args.json:
        print(json.dumps(dict(result.to_json(), **({"attestation": origin} if origin else {})), indent=2))
        for w in result.warnings:
            print(f"WARN: {w}", file=sys.stderr)
    else:
        print(table(result.checks))
        print(f"baseline: {result.baseline or 'none'}")
        if origin:
            print(f"attestation: {origin['file']} signed by key {origin['keyid'][:16]} for {origin['subject']['name']}")
        for w in result.warnings:
            print(f"WARN: {w}")
        print(f"gate: {'PASS' if result.ok else 'FAIL'}{' (with WARN: see above)' if result.warnings else ''}")
        for f in failures_of(result.checks):
            print(f"  - {f}", file=sys.stderr)
    return 0 if result.ok else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "gate",
        help="pass/fail a smoke report against the stack's thresholds and a baseline",
        description="Check a smoke report (speclock.smoke/v1) against the thresholds of its stack "
        "([smoke.thresholds]) and, when one is given or stored, a baseline report of the same "
        "smoke profile (quick, full or sampled; a report without one is quick): mean acceptance "
        "length and each draft position's rate may not drift beyond the profile's tolerance "
        "([smoke.profiles]; both ways in the sampled profile). A baseline of another profile is "
        "exit 2. No baseline is a WARN (the regression check is skipped). "
        "Exit 0 pass, 1 fail, 2 bad report/stack/baseline.",
    )
    p.add_argument("report", help="report.json written by `speclock smoke`")
    p.add_argument(
        "--baseline",
        default="auto",
        help="baseline report; 'auto' (default) = baselines/<stack>/<engine package>-<version>[.<profile>].json "
        "(no suffix for quick) if stored "
        "(else WARN); 'none' = skip (WARN); a path that does not exist is an error",
    )
    p.add_argument("--baselines-dir", help="where 'auto' looks (default: the repo's baselines/, or the image's); must exist")
    p.add_argument(
        "--stack", help="stack name (stacks/<name>.toml) or path to a .toml file for the thresholds (default: the report's stack)"
    )
    p.add_argument("--junit", help="write JUnit XML here (one test case per check)")
    p.add_argument("--markdown", help="write a Markdown summary here (for a CI comment)")
    p.add_argument(
        "--verify-key",
        metavar="PUBKEY",
        help="PEM Ed25519 public key: first check the report's signed "
        "attestation (beside it, or --attestation); any mismatch is exit 2",
    )
    p.add_argument(
        "--attestation", metavar="FILE", help=f"the DSSE envelope to check (default: {attest.ATTESTATION_FILE} beside the report)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cmd_gate)
