"""The upgrade's outputs: summary.md (for people and PR comments), junit.xml (for CI) and upgrade.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speclock.core.files import atomic_write_text
from speclock.core.jsonread import loads
from speclock.core.junit import Case
from speclock.core.junit import junit_xml as write_junit
from speclock.core.layout import REPO_ROOT
from speclock.spec.lock import lock_path
from speclock.spec.stack import Stack
from speclock.upgrade.candidate import pin_value
from speclock.upgrade.record import SoakStepRecord
from speclock.upgrade.steps import UpgradeResult
from speclock.verify.report import fmt_number


def _cell(v: Any) -> str:
    return fmt_number(v, missing="n/a")  # a summary cell: a metric one side lacks reads n/a


def _delta(before: float | None, after: float | None) -> str:
    if before in (None, 0) or after is None:
        return ""
    return f"{(after - before) / before:+.1%}"


def summary_markdown(res: UpgradeResult) -> str:
    c, j = res.candidate, res.to_json()
    verdict = "PASS" if res.ok else "FAIL"
    title = ", ".join(f"{k.split('.')[0]} {b} → {a}" for k, (b, a) in c.changes.items()) or "same pins (stack edited)"
    lines = [f"## speclock upgrade: {verdict}: {c.stack.name}: {title}", ""]
    if not res.ok:
        lines += ["**Why it failed:**", ""] + [f"- {f}" for f in res.failures()] + [""]
        lines += ["Nothing of the current stack changed (stacks/, locks/, baselines/ untouched).", ""]
    elif res.promoted:
        lines += ["Promoted: the candidate stack, lock and report are now the current ones.", ""]
    else:
        lines += ["The candidate passed; promote it with `--promote` (or commit the candidate's stack, lock and report).", ""]
    lines += ["### Versions", "", "| | before | after |", "|---|---|---|"]
    for section, key in [("engine", "package"), ("engine", "version"), ("torch", "version"), ("gpu", "cuda")]:
        b, a = pin_value(c.current, section, key) or "-", pin_value(c.stack, section, key) or "-"
        mark = " **(changed)**" if b != a else ""
        lines.append(f"| {section}.{key} | {b} | {a}{mark} |")
    before_doc: Mapping[str, Any] = res.before or {}
    before_img = before_doc.get("image", {}).get("ref", "-")
    lines.append(f"| image | {before_img} | {res.image.get('ref', '-')} |")
    lock = next((s for s in res.steps if s.name == "lock"), None)
    if lock and lock.data:
        lines.append(f"| lock sha256 | {_current_lock_sha(c.current)} | {lock.data['lock_sha256'][:16]} |")
    lines += ["", "### Steps", "", "| step | result | time | detail |", "|---|---|---|---|"]
    for s in res.steps:
        mark = {"pass": "pass", "fail": "**FAIL**", "skipped": "skipped"}[s.status]
        lines.append(
            f"| {s.name} | {mark} | {s.seconds:.0f} s | {s.detail.replace('|', '/').splitlines()[0] if s.detail else ''} |"
        )
    patches = next(s for s in res.steps if s.name == "patches").data.get("results")
    if patches is not None:
        lines += ["", "### Patches", ""]
        if not patches:
            lines.append("The stack has no patch series.")
        else:
            lines += ["| patch | state | note |", "|---|---|---|"]
            for p in patches:
                state = {"upstream": "retired (upstream has it)", "conflict": "**conflict**"}.get(p["state"], p["state"])
                lines.append(f"| {p['patch']} | {state} | {p['reason'].splitlines()[0].replace('|', '/')} |")
    before_m: Mapping[str, Any] = j["before"] or {}
    after_m: Mapping[str, Any] = j["after"] or {}
    if j["before"] or j["after"]:
        lines += [
            "",
            "### Acceptance and speed",
            "",
            f"baseline: `{_display_path(res.baseline)}`",
            "",
            "| metric | before | after | change |",
            "|---|---|---|---|",
        ]
        for key, label in [
            ("mean_acceptance_length", "mean acceptance length"),
            ("acceptance_rate", "acceptance rate"),
            ("speedup", "speedup (spec / plain tok/s)"),
            ("spec_tok_s", "spec tok/s"),
            ("baseline_tok_s", "plain tok/s"),
        ]:
            bv, av = before_m.get(key), after_m.get(key)
            lines.append(f"| {label} | {_cell(bv)} | {_cell(av)} | {_delta(bv, av)} |")
        before_pos, after_pos = before_m.get("per_position") or [], after_m.get("per_position") or []
        for i in range(max(len(before_pos), len(after_pos))):
            bv = before_pos[i] if i < len(before_pos) else None
            av = after_pos[i] if i < len(after_pos) else None
            lines.append(f"| accepted at position {i + 1} | {_cell(bv)} | {_cell(av)} | {_delta(bv, av)} |")
        lines.append(f"| lossless (spec == plain) | {before_m.get('lossless', 'n/a')} | {after_m.get('lossless', 'n/a')} | |")
        lines.append(
            f"| aux layers configured / captured | {before_m.get('aux_layer_ids')} / {before_m.get('captured_layers')} "
            f"| {after_m.get('aux_layer_ids')} / {after_m.get('captured_layers')} | |"
        )
    if res.gate_checks:
        lines += [
            "",
            "### Gate (candidate against the current baseline)",
            "",
            "| check | result | value | limit |",
            "|---|---|---|---|",
        ]
        for ch in res.gate_checks:
            lines.append(f"| {ch['name']} | {'pass' if ch['ok'] else '**FAIL**'} | {_cell(ch['value'])} | {ch['limit']} |")
    lines += _soak_lines(res.soak())
    lines += ["", f"Verdict: **{verdict}**", ""]
    return "\n".join(lines)


def _soak_lines(soak: SoakStepRecord | None) -> list[str]:
    """The soak section: asked duration and limit, then each window's acceptance (or why there was no soak)."""
    if soak is None:
        return []
    asked = soak.get("soak_s") or 0
    lines = ["", "### Soak (one engine in the candidate image)", ""]
    if soak["status"] == "skipped":
        return lines + [f"Not run: {soak['detail']} (`--soak-s {asked:g}`)."]
    drift = soak.get("drift")
    lines.append(
        f"`--soak-s {asked:g}`, drift limit {soak.get('max_drift', 0):.0%}: "
        f"**{'pass' if soak['status'] == 'pass' else 'FAIL'}**"
        + (
            f"; worst drop of mean acceptance length {drift['worst_drop']:.1%}, last {drift['last_drop']:.1%}"
            if drift and "worst_drop" in drift
            else ""
        )
        + f". Outputs: `{soak.get('outputs', '-')}`"
    )
    if soak.get("windows"):
        lines += [
            "",
            "| window | start s | mean acc. length | acceptance rate | tok/s | outputs same | ties / mismatches |",
            "|---|---|---|---|---|---|---|",
        ]
        for i, w in enumerate(soak["windows"]):
            lines.append(
                f"| {i + 1} | {_cell(w.get('t_start_s'))} | {_cell(w.get('mean_acceptance_length'))} "
                f"| {_cell(w.get('acceptance_rate'))} | {_cell(w.get('tok_s'))} "
                f"| {'yes' if w.get('outputs_same') else 'no'} | {w.get('numeric_ties')} / {w.get('mismatches')} |"
            )
    if soak["status"] == "fail":
        lines += ["", f"Why: {soak['detail']}"]
    return lines


def _display_path(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _current_lock_sha(stack: Stack) -> str:
    try:
        return str(loads(lock_path(stack).read_bytes())["lock_sha256"])[:16]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # a summary line, not a check
        return "-"


def junit_xml(res: UpgradeResult) -> str:
    """One test case per step and per gate check, so CI shows which part of the upgrade failed."""
    cases = [
        Case(
            f"speclock.upgrade.{s.name}",
            s.name,
            seconds=s.seconds,
            failure=s.detail if s.status == "fail" else None,
            failure_type="upgrade",
            skipped=(s.detail or "an earlier step failed") if s.status == "skipped" else None,
        )
        for s in res.steps
    ]
    for ch in res.gate_checks:
        value = f"{_cell(ch['value'])} (limit {ch['limit']})"
        reason = f"{ch['name']}: {ch['detail'] or value}"
        cases.append(
            Case(
                f"speclock.upgrade.gate.{ch['kind']}",
                ch["name"],
                seconds=0.0,
                failure=None if ch["ok"] else reason,
                failure_type="upgrade",
            )
        )
    return write_junit(f"speclock.upgrade.{res.candidate.stack.name}", cases)


def write_outputs(res: UpgradeResult, out: Path) -> dict[str, Path]:
    paths = {"summary": out / "summary.md", "junit": out / "junit.xml", "json": out / "upgrade.json"}
    atomic_write_text(paths["summary"], summary_markdown(res))
    atomic_write_text(paths["junit"], junit_xml(res))
    atomic_write_text(paths["json"], json.dumps(res.to_json(), indent=2, default=str) + "\n")
    return paths
