"""`speclock gate REPORT [--baseline REPORT]`: pass or fail a smoke report against the stack's thresholds.

The same `evaluate` decides a smoke run's own verdict (without a baseline), so the image's
self-check and CI apply one set of rules. Outputs: a table, JUnit XML and Markdown for CI.
Baseline reports live in `baselines/<stack>/<engine package>-<version>.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from speclock.errors import BadInput
from speclock.report import load_report, write_atomic

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    value: Any
    limit: str
    kind: str  # engine | lossless | drafter | integration | speed | regression
    detail: str = ""

    def reason(self) -> str:
        return f"{self.name}: {self.detail or f'{_fmt(self.value)} (limit {self.limit})'}"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _rel_drop(base: float, cur: float) -> float:
    return (base - cur) / base if base else 0.0


def check_baseline_matches(report: dict, baseline: dict, source: str) -> None:
    """A baseline must measure the same thing: same stack, engine family, k, prompts and length."""
    pairs = [("stack", report["stack"], baseline["stack"]),
             ("engine.name", report["engine"]["name"], baseline["engine"]["name"]),
             ("num_speculative_tokens", report["num_speculative_tokens"], baseline["num_speculative_tokens"]),
             ("prompts.count", report["prompts"]["count"], baseline["prompts"]["count"]),
             ("max_tokens", report.get("max_tokens"), baseline.get("max_tokens"))]
    for key, mine, theirs in pairs:
        if mine != theirs:
            raise BadInput(f"{source}: baseline key '{key}' is {theirs!r}, the report has {mine!r}",
                           hint="compare against a baseline of the same stack, engine, k, prompts and max_tokens "
                                "(baselines/<stack>/<engine package>-<version>.json)")
    # A baseline measured with another drafter says nothing about this one: a retrained drafter
    # needs a new baseline, not a silent pass (or fail) against the old one's acceptance.
    mine, theirs = _drafter_sha(report), _drafter_sha(baseline)
    if mine and theirs and mine != theirs:
        raise BadInput(f"{source}: the baseline was measured with drafter {theirs[:12]}, the report with {mine[:12]}",
                       hint="record a baseline for this drafter: check a passing report by hand and copy it to "
                            "baselines/<stack>/<engine package>-<version>.json")


def _drafter_sha(report: dict) -> str | None:
    key = (report.get("reference") or {}).get("key") or {}
    return key.get("drafter_sha256")


def evaluate(report: dict[str, Any], thresholds: dict[str, Any], baseline: dict[str, Any] | None = None) -> list[Check]:
    """Every check the report must pass; a failed check's `kind` says where the fault most likely is."""
    m, ll, tp = report["metrics"], report["lossless"], report["throughput"]
    run = report.get("run") or {"completed": True, "error": None}
    checks = [Check("engine run completed", bool(run.get("completed")), run.get("completed"), "true", "engine",
                    "" if run.get("completed") else f"the engine failed: {run.get('error')}")]
    checks.append(Check("lossless (spec == plain, token for token, up to numeric ties)", ll["checked"] > 0 and ll["mismatches"] == 0,
                        f"{ll['mismatches']}/{ll['checked']} differ", "0 differ", "lossless",
                        "" if ll["checked"] else "no outputs were compared"))
    k = report["num_speculative_tokens"]
    mal = m["mean_acceptance_length"]
    floor = thresholds.get("min_mean_acceptance_length", 1.0)
    checks.append(Check("mean acceptance length", mal >= floor, mal, f">= {floor}", "drafter"))
    drafts = m["num_drafts"]
    rates = [a / drafts if drafts else 0.0 for a in m["accepted_per_position"]]
    for i, pos_floor in enumerate(thresholds.get("min_acceptance_per_position") or []):
        rate = rates[i] if i < len(rates) else 0.0
        checks.append(Check(f"acceptance at position {i + 1} of {k}", rate >= pos_floor, rate, f">= {pos_floor}", "drafter"))
    min_speedup = thresholds.get("min_speedup", 0.0)
    if min_speedup:
        sp = tp.get("speedup")
        checks.append(Check("speedup (spec / plain tok/s)", sp is not None and sp >= min_speedup, sp, f">= {min_speedup}", "speed"))
    ref = report.get("reference") or {}
    if ref.get("gap") is not None:
        limit = thresholds.get("max_reference_gap", 0.15)
        rm = ref["metrics"]["mean_acceptance_length"]
        checks.append(Check("engine vs reference acceptance (integration)", ref["gap"] <= limit, ref["gap"], f"<= {limit}",
                            "integration", "" if ref["gap"] <= limit else
                            f"engine mean acceptance length {mal:.3f} vs reference {rm:.3f} on the same drafter and prompts "
                            f"(gap {ref['gap']:.3f} > {limit}): the engine integration is broken (e.g. wrong aux layers "
                            f"captured), not the drafter"))
    if baseline is not None:
        limit = thresholds.get("max_relative_drop", 0.05)
        base_mal = baseline["metrics"]["mean_acceptance_length"]
        drop = _rel_drop(base_mal, mal)
        checks.append(Check(f"acceptance length vs baseline ({baseline['engine']['version']})", drop <= limit, drop,
                            f"<= {limit} relative drop", "regression",
                            "" if drop <= limit else f"{mal:.3f} vs baseline {base_mal:.3f}: dropped {drop:.1%} (limit {limit:.0%})"))
        if min_speedup and baseline["throughput"].get("speedup") and tp.get("speedup") is not None:
            sdrop = _rel_drop(baseline["throughput"]["speedup"], tp["speedup"])
            checks.append(Check("speedup vs baseline", sdrop <= limit, sdrop, f"<= {limit} relative drop", "regression"))
    return checks


def failures_of(checks: list[Check]) -> list[str]:
    return [c.reason() for c in checks if not c.ok]


def table(checks: list[Check]) -> str:
    w = max(len(c.name) for c in checks)
    lines = [f"{'check':<{w}}  {'result':<6}  {'value':<14}  limit"]
    for c in checks:
        lines.append(f"{c.name:<{w}}  {'PASS' if c.ok else 'FAIL':<6}  {_fmt(c.value):<14}  {c.limit}")
    return "\n".join(lines)


def junit_xml(checks: list[Check], suite: str = "speclock.gate") -> str:
    fails = sum(not c.ok for c in checks)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites><testsuite name={quoteattr(suite)} tests="{len(checks)}" failures="{fails}" errors="0">']
    for c in checks:
        out.append(f'  <testcase classname={quoteattr(suite + "." + c.kind)} name={quoteattr(c.name)}>')
        if not c.ok:
            out.append(f'    <failure message={quoteattr(c.reason())} type={quoteattr(c.kind)}>{escape(c.reason())}</failure>')
        out.append(f"    <system-out>{escape(f'value {_fmt(c.value)}, limit {c.limit}')}</system-out>")
        out.append("  </testcase>")
    out.append("</testsuite></testsuites>")
    return "\n".join(out) + "\n"


def markdown(report: dict[str, Any], checks: list[Check], baseline_source: str | None) -> str:
    ok = all(c.ok for c in checks)
    m = report["metrics"]
    lines = [f"### speclock gate: {'PASS' if ok else 'FAIL'}: {report['stack']} on {report['engine']['name']} {report['engine']['version']}",
             "",
             f"mean acceptance length **{m['mean_acceptance_length']:.3f}**, acceptance rate {m['acceptance_rate']:.3f}, "
             f"speedup {_fmt(report['throughput'].get('speedup'))}, lossless {report['lossless']['checked'] - report['lossless']['mismatches']}"
             f"/{report['lossless']['checked']}; baseline: {baseline_source or 'none'}",
             "", "| check | result | value | limit |", "|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c.name} | {'pass' if c.ok else '**FAIL**'} | {_fmt(c.value)} | {c.limit} |")
    fails = [c for c in checks if not c.ok]
    if fails:
        lines += ["", "Failures:"] + [f"- ({c.kind}) {c.reason()}" for c in fails]
    return "\n".join(lines) + "\n"


def baseline_path(baselines_dir: Path, stack: str, engine_package: str, engine_version: str) -> Path:
    return baselines_dir / stack / f"{engine_package}-{engine_version}.json"


def find_baseline(baselines_dir: Path, report: dict[str, Any]) -> Path | None:
    """The stored baseline for the report's stack and engine version, if one is stored."""
    pkg = report["engine"].get("package") or report["engine"]["name"]
    path = baseline_path(baselines_dir, report["stack"], pkg, report["engine"]["version"])
    return path if path.is_file() else None


def thresholds_for(report: dict[str, Any], stack_arg: str | None) -> tuple[dict[str, Any], str]:
    """The stack's thresholds: from --stack, else the image's stack file, else stacks/<report's stack>.toml."""
    from speclock.layout import IMAGE, in_image
    from speclock.stack import load_stack

    if stack_arg:
        stack = load_stack(stack_arg)
    elif in_image():
        stack = load_stack(IMAGE.stack_file)
    else:
        stack = load_stack(report["stack"])
    if stack.name != report["stack"]:
        raise BadInput(f"the report is for stack {report['stack']!r}, the thresholds are from {stack.name!r}",
                       hint="pass the report's own stack with --stack")
    return dict(stack.thresholds), str(stack.path)


@dataclass
class GateResult:
    ok: bool
    checks: list[Check]
    baseline: str | None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": "pass" if self.ok else "fail", "baseline": self.baseline,
                "checks": [asdict(c) for c in self.checks], "failures": failures_of(self.checks)}


def run_gate(report_path: Path, *, baseline: str | None = "auto", stack: str | None = None,
             baselines_dir: Path | None = None, junit: Path | None = None, md: Path | None = None) -> GateResult:
    """Gate one report; write JUnit/Markdown when asked. Raises BadInput for bad reports or baselines."""
    report = load_report(report_path)
    thresholds, _ = thresholds_for(report, stack)
    base_doc, base_src = None, None
    if baseline == "auto":
        from speclock.layout import IMAGE, in_image

        bdir = baselines_dir or (IMAGE.baselines_dir if in_image() else REPO_ROOT / "baselines")
        found = find_baseline(bdir, report)
        baseline = str(found) if found else None
    if baseline and baseline != "none":
        base_doc, base_src = load_report(baseline), str(baseline)
        check_baseline_matches(report, base_doc, base_src)
    checks = evaluate(report, thresholds, base_doc)
    result = GateResult(all(c.ok for c in checks), checks, base_src)
    if junit:
        write_atomic(junit, junit_xml(checks))
    if md:
        write_atomic(md, markdown(report, checks, base_src))
    return result


def _cmd_gate(args: argparse.Namespace) -> int:
    result = run_gate(Path(args.report), baseline=args.baseline, stack=args.stack,
                      baselines_dir=Path(args.baselines_dir) if args.baselines_dir else None,
                      junit=Path(args.junit) if args.junit else None, md=Path(args.markdown) if args.markdown else None)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(table(result.checks))
        print(f"baseline: {result.baseline or 'none'}")
        print(f"gate: {'PASS' if result.ok else 'FAIL'}")
        for f in failures_of(result.checks):
            print(f"  - {f}", file=sys.stderr)
    return 0 if result.ok else 1


def add_commands(sub) -> None:
    p = sub.add_parser("gate", help="pass/fail a smoke report against the stack's thresholds and a baseline",
                       description="Check a smoke report (speclock.smoke/v1) against the thresholds of its stack "
                                   "([smoke.thresholds]) and, when one is given or stored, a baseline report. "
                                   "Exit 0 pass, 1 fail, 2 bad report/baseline.")
    p.add_argument("report", help="report.json written by `speclock smoke`")
    p.add_argument("--baseline", default="auto",
                   help="baseline report; 'auto' (default) = baselines/<stack>/<engine package>-<version>.json if stored; 'none' = skip")
    p.add_argument("--baselines-dir", help="where 'auto' looks (default: the repo's baselines/, or the image's)")
    p.add_argument("--stack", help="stack name or path for the thresholds (default: the report's stack)")
    p.add_argument("--junit", help="write JUnit XML here (one test case per check)")
    p.add_argument("--markdown", help="write a Markdown summary here (for a CI comment)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cmd_gate)
