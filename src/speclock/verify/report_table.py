"""The smoke report as a short table for people (`speclock smoke`, the self-check): rendering only, no validation."""

from __future__ import annotations

from speclock.verify.checks import fmt_number
from speclock.verify.report_types import SmokeReport, Throughput


def _profile_line(report: SmokeReport) -> str:
    prof = report["profile"]
    line = f"{prof.get('name')} ({report.get('max_tokens', '?')} tokens"
    sampled = report.get("sampled")
    if not isinstance(sampled, dict):
        return line + ", greedy)"
    spread = sampled.get("spread")
    mal = spread.get("mean_acceptance_length") if spread else None
    ci = mal.get("ci95") if mal else None
    per_seed = ", ".join(fmt_number(s.get("mean_acceptance_length")) for s in sampled.get("per_seed") or [])
    return (
        line
        + f", temperature {sampled.get('temperature')}): mean acceptance length per seed {per_seed}"
        + (f"; 95% CI {fmt_number(ci[0])}-{fmt_number(ci[1])}" if ci else "")
    )


def _speed_rows(report: SmokeReport, t: Throughput) -> list[tuple[str, str]]:
    """Batch 1 (the judged speedup: median, interval, spread) and all prompts at once; an older report's one figure."""
    b1, conc = t.get("batch1"), t.get("concurrent")
    if not isinstance(b1, dict) and not isinstance(conc, dict):
        return [
            (
                "tok/s plain -> spec",
                f"{fmt_number(t['baseline_tok_s'], 1)} -> {fmt_number(t['spec_tok_s'], 1)}  "
                f"(speedup {fmt_number(t['speedup'], 2)})",
            )
        ]
    rows: list[tuple[str, str]] = []
    if isinstance(b1, dict):
        rows.append(
            (
                "tok/s at batch 1",
                f"plain {fmt_number(b1['plain_tok_s_median'], 1)} -> spec "
                f"{fmt_number(b1['spec_tok_s_median'], 1)}  (speedup {fmt_number(b1['speedup'], 2)}, "
                f"interval {fmt_number(b1['speedup_low'], 2)}-{fmt_number(b1['speedup_high'], 2)}, "
                f"{b1['prompts']} prompts x {b1['max_tokens']} tokens, median of {b1['repeats']}; "
                f"plain before {b1['plain_before_tok_s']}, after {b1['plain_after_tok_s']})",
            )
        )
    else:
        rows.append(("tok/s at batch 1", "not measured (smoke.speed_repeats = 0)"))
    loaded = t.get("loaded")
    if isinstance(loaded, dict):
        rows.append(
            (
                f"tok/s, {loaded['requests']} at once, median of {loaded['repeats']}",
                f"plain {fmt_number(loaded['plain_tok_s_median'], 1)} -> spec "
                f"{fmt_number(loaded['spec_tok_s_median'], 1)}  (speedup {fmt_number(loaded['speedup'], 2)}, "
                f"interval {fmt_number(loaded['speedup_low'], 2)}-{fmt_number(loaded['speedup_high'], 2)}, "
                f"{loaded['max_tokens']} tokens each, runs of {loaded['batches_per_run_min']}+ batches)",
            )
        )
    if isinstance(conc, dict):
        rows.append(
            (
                f"tok/s, {conc.get('requests', '?')} at once",
                f"plain {fmt_number(conc.get('baseline_tok_s'), 1)} -> spec "
                f"{fmt_number(conc.get('spec_tok_s'), 1)}  "
                f"(speedup {fmt_number(conc.get('speedup'), 2)})",
            )
        )
    gpu = report.get("gpu") or {}
    if gpu.get("name"):
        rows.append(("gpu", f"{gpu['name']}, driver {gpu.get('driver') or '?'}, CUDA {gpu.get('cuda') or '?'}"))
    if t.get("note"):
        rows.append(("speed note", t["note"]))
    return rows


def human_table(report: SmokeReport) -> str:
    """A short table for people: what ran, what it measured, the verdict."""
    m, t, ll = report["metrics"], report["throughput"], report["lossless"]
    ref = report.get("reference")
    ref_metrics = (ref.get("metrics") if ref else None) or {}
    per_pos = ", ".join(f"{r:.2f}" for r in m.get("acceptance_per_position", [])) or "-"
    rows = [
        ("stack", report["stack"]),
        ("engine", f"{report['engine']['name']} {report['engine']['version']}"),
        (
            "draft",
            f"{report['draft']['path']}  aux layers {report['draft']['aux_layer_ids']} "
            f"captured {report['draft']['captured_layers']}",
        ),
        ("prompts", f"{report['prompts']['count']} from {report['prompts']['source']}, k={report['num_speculative_tokens']}"),
        (
            "lossless",
            f"{ll['checked'] - ll['mismatches'] - ll.get('numeric_ties', 0)}/{ll['checked']} identical, "
            f"{ll.get('numeric_ties', 0)} part at numeric ties, {ll['mismatches']} mismatched",
        ),
        ("mean acceptance length", fmt_number(m["mean_acceptance_length"])),
        ("acceptance rate", fmt_number(m["acceptance_rate"])),
        ("acceptance per position", per_pos),
        *([("profile", _profile_line(report))] if report.get("profile") else []),
        (
            "reference acceptance length",
            fmt_number(ref_metrics.get("mean_acceptance_length")) + (f"  ({ref.get('status')})" if ref else ""),
        ),
        ("reference gap", fmt_number(ref.get("gap") if ref else None)),
        *_speed_rows(report, t),
        ("verdict", report["verdict"].upper() + (" with WARN" if report.get("warnings") else "")),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"  - {f}" for f in report["failures"]]
    lines += [f"  WARN: {w}" for w in report.get("warnings") or []]
    return "\n".join(lines)
