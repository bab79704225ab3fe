"""The smoke report (`"schema": "speclock.smoke/v1"`, docs/smoke.md): validation, reading, writing.

`speclock smoke` writes it, `speclock gate` and CI read it. `validate_report` is the one
definition of what a valid report is: it fits the model (speclock.verify.report_types.SmokeReport, validated
by speclock.core.docmodel: every key the right JSON type, errors naming the file and the key path), and the
counters agree with each other (a report whose numbers contradict each other is forged or broken, never
judged). The model's JSON Schema is schemas/report.schema.json; the table for people is
speclock.verify.report_table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from speclock.core import files
from speclock.core.docmodel import DocModel, dotted, validate
from speclock.core.errors import BadInput
from speclock.spec.profile_values import PROFILES
from speclock.verify.checks import fmt_number as fmt_number  # upgrade/outputs.py imports it from here
from speclock.verify.plausibility import Bad, check_chain_positions, check_without_stack
from speclock.verify.report_table import human_table as human_table
from speclock.verify.report_types import SMOKE_SCHEMA_ID as SCHEMA_ID
from speclock.verify.report_types import ReferenceSection, SampledSection, SmokeReport
from speclock.verify.speed import check_batch1

_INT_LIMIT = 2**63  # counters are 64-bit in every engine; a larger integer is no measurement
# Counters written by smoke are exact ratios; a hand-rounded copy (3 decimals) still agrees.
_TOLERANCE = 5e-4
_HINT = "a report written by `speclock smoke` (schema speclock.smoke/v1), unedited; see docs/smoke.md"

REPORT = DocModel(SmokeReport, SCHEMA_ID, "report.schema.json", "speclock smoke report", "warn", _HINT)


def dotted_get(data: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    """(found, value) at a dotted key path such as "reference.key.k"."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _out_of_range(value: Any) -> bool:
    return (isinstance(value, float) and not math.isfinite(value)) or (isinstance(value, int) and abs(value) >= _INT_LIMIT)


def _non_finite(node: Any) -> list[str | int] | None:
    """The key path of the first non-finite (or absurdly large) number anywhere in the document, or None (the path
    is built only when one is found: a 64 MiB report holds millions of numbers)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        if isinstance(v, (dict, list)):
            below = _non_finite(v)
            if below is not None:
                return [k, *below]
        elif _out_of_range(v):
            return [k]
    return [] if _out_of_range(node) else None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=_TOLERANCE)


def validate_report(data: Any, source: str = "report", warn: Callable[[str], None] | None = None) -> SmokeReport:
    """Check a parsed report against the model and its counters; raise BadInput naming the wrong key.

    A key the model does not know is a WARN naming it, passed to `warn` (default: printed to stderr)."""
    if not isinstance(data, dict):
        raise BadInput(f"{source}: not a JSON object (a {files.json_type(data)})", hint=_HINT)
    if data.get("schema") != SCHEMA_ID:
        raise BadInput(f"{source}: key 'schema': {files.short_repr(data.get('schema'))} is not {SCHEMA_ID!r}", hint=_HINT)
    odd = _non_finite(data)
    if odd is not None:  # a number no counter or rate can be (10**400 overflows a float; inf from a Python caller)
        raise BadInput(f"{source}: key '{dotted(odd)}': not a finite number in range (|x| < 2**63)", hint=_HINT)
    validate(REPORT, data, source, warn)
    # Every key has the model's JSON type now: the document is a SmokeReport.
    report = cast(SmokeReport, data)

    def bad(key: str, problem: str) -> BadInput:
        return BadInput(f"{source}: key '{key}': {problem}", hint=_HINT)

    if report["verdict"] == "pass" and report["failures"]:
        raise bad("verdict", f"'pass' with {len(report['failures'])} failures listed")
    k = report["num_speculative_tokens"]
    if k < 1:
        raise bad("num_speculative_tokens", f"{k} is below 1")
    if report["max_tokens"] < 1:
        raise bad("max_tokens", f"{report['max_tokens']} is below 1")
    count = report["prompts"]["count"]
    if count < 0:
        raise bad("prompts.count", f"negative ({count})")
    _check_metrics(report["metrics"], k, bad)
    _check_lossless(report["lossless"], count, bad)
    tp = report["throughput"]
    for key, value in (("baseline_tok_s", tp["baseline_tok_s"]), ("spec_tok_s", tp["spec_tok_s"]), ("speedup", tp["speedup"])):
        if value is not None and value < 0:
            raise bad(f"throughput.{key}", f"negative ({value})")
    check_batch1(report, bad)  # speclock.verify.speed: the batch-1 figures are what their own runs give
    ref = report.get("reference")
    if ref is not None:  # an object (its type is checked above)
        _check_reference(report, ref, bad)
    _check_profile(report, k, bad)
    check_without_stack(report, bad)  # speclock.verify.plausibility: what a run of this shape can produce
    return report


def _check_profile(data: SmokeReport, k: int, bad: Bad) -> None:
    """The profile, its per-seed counters and its attention backends agree with the report's own numbers.

    A greedy report may not call its lossless section 'sampled' (that would skip the token-for-token check),
    and a sampled report's per-seed counters must add up to its pooled metrics."""
    prof = data.get("profile")
    name, temp = "quick", 0.0
    if prof is not None:
        name, temp = prof.get("name"), prof.get("temperature", 0.0)
        if name not in PROFILES:
            raise bad("profile.name", f"{files.short_repr(name)} is not one of {', '.join(PROFILES)}")
        if (name == "sampled") != (temp > 0):
            raise bad(
                "profile.temperature", f"{temp} in profile {name} (sampled samples at temperature > 0; quick and full are greedy)"
            )
    if data["lossless"].get("mode", "greedy") != "greedy" and not (data["lossless"]["mode"] == "sampled" and temp > 0):
        raise bad(
            "lossless.mode",
            f"{files.short_repr(data['lossless']['mode'])} in a greedy run: greedy outputs are compared token for token",
        )
    sampled = data.get("sampled")
    if name == "sampled" and data["run"]["completed"] and sampled is None:
        raise bad("sampled", "missing: a completed sampled-profile run reports its counters per seed")
    if sampled is not None:
        _check_sampled(sampled, data["metrics"], k, "sampled", bad)
    backends = data.get("attention_backends")
    if backends is not None:
        names = []
        for i, b in enumerate(backends):
            _check_metrics(b["metrics"], k, _nested(bad, f"attention_backends[{i}]"))
            if b.get("sampled") is not None:  # a sampled run's backends each report their seeds
                _check_sampled(b["sampled"], b["metrics"], k, f"attention_backends[{i}].sampled", bad)
            names.append(b["backend"])
        if len(set(names)) != len(names):
            raise bad("attention_backends", f"a backend is listed twice: {names}")
        if backends and backends[0]["metrics"] != data["metrics"]:
            raise bad("attention_backends[0].metrics", "differs from metrics (the first backend's run is the report's)")


def _check_sampled(sampled: SampledSection, metrics: Mapping[str, Any], k: int, where: str, bad: Bad) -> None:
    """A per-seed section: each seed's counters consistent, and together the pooled `metrics` (how many entries the
    profile asks for is speclock.verify.plausibility.check_profile_counts)."""
    drafts, draft_tokens, accepted, per_pos = 0, 0, 0, [0] * k
    for i, seed in enumerate(sampled["per_seed"]):
        _check_metrics(seed, k, _nested(bad, f"{where}.per_seed[{i}]", strip="metrics."))
        drafts += seed["num_drafts"]
        draft_tokens += seed["num_draft_tokens"]
        accepted += seed["num_accepted_tokens"]
        # k positions: a seed's list is padded with zeros (a run that never drafted has none)
        per_pos = [a + b for a, b in zip(per_pos, seed["accepted_per_position"] + [0] * k, strict=False)]
    pooled = (
        metrics["num_drafts"],
        metrics["num_draft_tokens"],
        metrics["num_accepted_tokens"],
        list(metrics["accepted_per_position"]) + [0] * (k - len(metrics["accepted_per_position"])),
    )
    if pooled != (drafts, draft_tokens, accepted, per_pos):
        raise bad(
            f"{where}.per_seed",
            f"the per-seed counters do not add up to {where.removesuffix('sampled')}metrics (num_drafts, "
            "num_draft_tokens, num_accepted_tokens, accepted_per_position)",
        )


def _nested(bad: Bad, where: str, *, strip: str = "") -> Bad:
    """`bad` for a nested copy of the counters (per seed, per backend): its keys named under `where`."""

    def nested_bad(key: str, problem: str) -> BadInput:
        return bad(f"{where}.{key.removeprefix(strip)}", problem)

    return nested_bad


_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "acceptance_rate")


def _check_metrics(m: Mapping[str, Any], k: int, bad: Bad, *, rates_key: str = "acceptance_per_position") -> None:
    """The counters must agree with each other: the derived rates are computed from them, not trusted.

    `rates_key`: where the per-position rates are (the reference decoder records them as per_position_rate)."""
    # The model gives every key its type; a reference's counters are each optional there (a mean alone is allowed),
    # but per-position figures come with all of them.
    for key in (*_COUNTERS, "mean_acceptance_length"):
        if key not in m:
            raise bad(f"metrics.{key}", "missing: per-position figures come with every counter")
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        if m[key] < 0:
            raise bad(f"metrics.{key}", f"negative ({m[key]})")
    drafts, tokens, accepted, per_pos = (
        m["num_drafts"],
        m["num_draft_tokens"],
        m["num_accepted_tokens"],
        m["accepted_per_position"],
    )
    for i, v in enumerate(per_pos):
        if v < 0:
            raise bad(f"metrics.accepted_per_position[{i}]", f"negative ({v})")
        if v > drafts:
            raise bad(f"metrics.accepted_per_position[{i}]", f"{v} acceptances at one position exceed num_drafts {drafts}")
    # A draft proposes at most k tokens (vLLM may propose fewer near max_tokens), never more.
    if tokens > drafts * k:
        raise bad("metrics.num_draft_tokens", f"{tokens} exceeds num_drafts x k = {drafts} x {k}")
    if accepted > tokens:
        raise bad("metrics.num_accepted_tokens", f"{accepted} exceeds num_draft_tokens {tokens}")
    if len(per_pos) != k and not (drafts == 0 and not per_pos):  # a run that never drafted has no positions
        raise bad("metrics.accepted_per_position", f"{len(per_pos)} positions for k = {k}")
    if sum(per_pos) != accepted:
        raise bad("metrics.accepted_per_position", f"sums to {sum(per_pos)}, num_accepted_tokens is {accepted}")
    check_chain_positions(per_pos, "metrics", bad)  # speclock.verify.plausibility: wherever counters appear
    rate = accepted / tokens if tokens else 0.0
    if not 0.0 <= m["acceptance_rate"] <= 1.0 or not _close(m["acceptance_rate"], rate):
        raise bad(
            "metrics.acceptance_rate",
            f"{files.short_repr(m['acceptance_rate'])} is not num_accepted_tokens / num_draft_tokens "
            f"= {accepted}/{tokens} = {rate:.6f}",
        )
    mal = 1.0 + accepted / drafts if drafts else 1.0
    if not _close(m["mean_acceptance_length"], mal):
        raise bad(
            "metrics.mean_acceptance_length",
            f"{files.short_repr(m['mean_acceptance_length'])} is not 1 + num_accepted_tokens / "
            f"num_drafts = 1 + {accepted}/{drafts} = {mal:.6f}",
        )
    rates = m.get(rates_key)
    if rates is not None:
        if len(rates) != len(per_pos):
            raise bad(f"metrics.{rates_key}", f"{files.short_repr(rates)}: expected {len(per_pos)} rates, one per position")
        for i, (r, a) in enumerate(zip(rates, per_pos, strict=True)):  # equal lengths: checked just above
            want = a / drafts if drafts else 0.0
            if not 0.0 <= r <= 1.0 or not _close(r, want):
                raise bad(
                    f"metrics.{rates_key}[{i}]",
                    f"{files.short_repr(r)} is not accepted_per_position / num_drafts = {a}/{drafts}",
                )


def _check_lossless(ll: Mapping[str, Any], count: int, bad: Bad) -> None:
    for key in ("checked", "mismatches", "numeric_ties"):
        if key in ll and ll[key] < 0:
            raise bad(f"lossless.{key}", f"negative ({ll[key]})")
    if ll["checked"] > count:
        raise bad("lossless.checked", f"{ll['checked']} outputs compared, but prompts.count is {count}")
    if ll["mismatches"] > ll["checked"]:
        raise bad("lossless.mismatches", f"{ll['mismatches']} exceeds lossless.checked {ll['checked']}")
    if ll.get("numeric_ties", 0) + ll["mismatches"] > ll["checked"]:
        raise bad(
            "lossless.numeric_ties",
            f"{ll['numeric_ties']} ties + {ll['mismatches']} mismatches exceed lossless.checked {ll['checked']}",
        )


_REFERENCE_FIGURES = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "per_position_rate")


def _check_reference(data: SmokeReport, ref: ReferenceSection, bad: Bad) -> None:
    """The reference section: its key describes this run, and its gap is the one its numbers give."""
    metrics = ref.get("metrics")
    # A recorded reference may be a mean alone (drafter manifests allow it); where it gives per-position figures,
    # the counters they come from are required and held to the rules of the engine's (a chain never rises).
    if metrics is not None and any(key in metrics for key in _REFERENCE_FIGURES):
        _check_metrics(metrics, data["num_speculative_tokens"], _nested(bad, "reference"), rates_key="per_position_rate")
    ref_len = metrics.get("mean_acceptance_length") if metrics is not None else None
    if ref_len is not None:
        if ref_len <= 0:
            raise bad("reference.metrics.mean_acceptance_length", f"{files.short_repr(ref_len)} is not a positive number")
    gap = ref.get("gap")
    if gap is None and ref_len is not None and data.get("run", {}).get("completed") is not False:
        # smoke computes the gap whenever both runs measured: leaving it out would skip the integration check
        raise bad("reference.gap", "missing, but the reference and the engine both measured acceptance")
    if gap is not None:
        if ref_len is None:
            raise bad("reference.metrics.mean_acceptance_length", "missing, but reference.gap is given")
        want = abs(ref_len - data["metrics"]["mean_acceptance_length"]) / ref_len
        if gap < 0 or not _close(gap, want):
            raise bad("reference.gap", f"{gap} is not |reference - engine| / reference mean acceptance length = {want:.6f}")
    key: Mapping[str, Any] | None = ref.get("key")
    if key is not None:
        for name in ("target_sha256", "drafter_sha256", "prompts_sha256"):
            value = key.get(name)
            if value is not None and not (len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
                raise bad(f"reference.key.{name}", f"{files.short_repr(value)} is not a sha256 (64 hex digits)")
        for name, mine, label in (
            ("k", data["num_speculative_tokens"], "num_speculative_tokens"),
            ("max_tokens", data.get("max_tokens"), "max_tokens"),
            ("num_prompts", data["prompts"]["count"], "prompts.count"),
        ):
            if name in key and mine is not None and key[name] != mine:
                raise bad(f"reference.key.{name}", f"{key[name]} differs from the report's {label} {mine}")


def load_report(path: str | Path, *, what: str = "report file", warn: Callable[[str], None] | None = None) -> SmokeReport:
    """Read and validate a report file (UTF-8 JSON, the model's shape and consistent counters); `warn`: see
    validate_report."""
    hint = "give the JSON written by `speclock smoke --out DIR` (DIR/report.json)"
    # files.read_text names what stands there when it is not a regular file (a FIFO or /dev/zero would never end)
    data = files.parse_json(files.read_text(path, what=what, hint=hint), path, what=what, expect=object, hint=hint)
    return validate_report(data, str(path), warn)


def write_report(path: str | Path, report: SmokeReport) -> Path:
    return files.atomic_write_json(path, report, indent=2)
