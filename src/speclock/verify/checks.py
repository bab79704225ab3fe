"""The gate's checks and how they are shown: one verdict per check (PASS, WARN or FAIL), a table, JUnit XML and
Markdown for CI.

Three levels: FAIL (ok false) fails the gate (exit 1); WARN (ok true, warn true) passes it but is shown in every
output (table, JSON `warnings`, JUnit as a skipped case, Markdown as a WARN line): something could not be judged
(no baseline; a speed interval that straddles its limit); PASS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from speclock.core.junit import Case
from speclock.core.junit import junit_xml as write_junit
from speclock.verify.report_types import CheckRecord, SmokeReport


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    value: Any
    limit: str
    kind: str  # engine | lossless | drafter | integration | speed | regression
    detail: str = ""
    warn: bool = False  # not failed, but not judged either (no baseline, a spread too wide): shown as WARN everywhere

    @property
    def status(self) -> Literal["PASS", "WARN", "FAIL"]:
        return "WARN" if self.warn else ("PASS" if self.ok else "FAIL")

    def reason(self) -> str:
        return f"{self.name}: {self.detail or f'{fmt(self.value)} (limit {self.limit})'}"

    def to_json(self) -> CheckRecord:
        """The check as gate.json and upgrade.json record it: its fields and its status."""
        return {
            "name": self.name,
            "ok": self.ok,
            "value": self.value,
            "limit": self.limit,
            "kind": self.kind,
            "detail": self.detail,
            "warn": self.warn,
            "status": self.status,
        }


def warning(name: str, value: Any, limit: str, kind: str, detail: str) -> Check:
    return Check(name, True, value, limit, kind, detail, warn=True)


def fmt_number(v: Any, digits: int = 3, missing: str = "-") -> str:
    """A number for a table (floats to `digits` places); `missing` for None."""
    if v is None:
        return missing
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def fmt(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return fmt_number(v)


def failures_of(checks: list[Check]) -> list[str]:
    return [c.reason() for c in checks if not c.ok]


def warnings_of(checks: list[Check]) -> list[str]:
    return [c.reason() for c in checks if c.warn]


def table(checks: list[Check]) -> str:
    w = max(len(c.name) for c in checks)
    lines = [f"{'check':<{w}}  {'result':<6}  {'value':<14}  limit"]
    for c in checks:
        lines.append(f"{c.name:<{w}}  {c.status:<6}  {fmt(c.value):<14}  {c.limit}")
    return "\n".join(lines)


def junit_xml(checks: list[Check], suite: str = "speclock.gate") -> str:
    cases = []
    for c in checks:
        out = f"value {fmt(c.value)}, limit {c.limit}" + (f"; WARN: {c.detail}" if c.warn else "")
        cases.append(
            Case(
                f"{suite}.{c.kind}",
                c.name,
                failure=None if c.ok else c.reason(),
                failure_type=c.kind,
                # CI shows a skipped case: the check could not judge
                skipped="WARN: " + c.detail if c.warn else None,
                system_out=out,
            )
        )
    return write_junit(suite, cases)


def markdown(report: SmokeReport, checks: list[Check], baseline_source: str | None, warnings: list[str] | None = None) -> str:
    ok = all(c.ok for c in checks)
    warnings = warnings if warnings is not None else [c.detail for c in checks if c.warn]
    m, tp = report["metrics"], report["throughput"]
    lines = [
        f"### speclock gate: {'PASS' if ok else 'FAIL'}{' with WARN' if warnings else ''}: {report['stack']} on "
        f"{report['engine']['name']} {report['engine']['version']}",
        "",
    ]
    lines += [f"> **WARN**: {w}" for w in warnings] + ([""] if warnings else [])
    lines += [
        f"mean acceptance length **{m['mean_acceptance_length']:.3f}**, acceptance rate {m['acceptance_rate']:.3f}, "
        f"speedup {fmt(tp.get('speedup'))}{' at batch 1' if tp.get('measured_at') == 'batch 1' else ''}, "
        f"lossless {report['lossless']['checked'] - report['lossless']['mismatches']}"
        f"/{report['lossless']['checked']}; baseline: {baseline_source or 'none'}"
    ]
    if tp.get("note"):
        lines += ["", f"> {tp['note']}"]
    lines += ["", "| check | result | value | limit |", "|---|---|---|---|"]
    for c in checks:
        result = {"PASS": "pass", "FAIL": "**FAIL**", "WARN": "**WARN**"}[c.status]
        lines.append(f"| {c.name} | {result} | {fmt(c.value)} | {c.limit} |")
    fails = [c for c in checks if not c.ok]
    if fails:
        lines += ["", "Failures:"] + [f"- ({c.kind}) {c.reason()}" for c in fails]
    return "\n".join(lines) + "\n"
