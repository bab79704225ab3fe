"""A baseline report (the regression side of `speclock gate`): where it is stored, and the drift of acceptance against it.

A baseline must be a valid measurement of the same thing as the report before it is compared
(check_baseline_matches: same stack, engine family, k, max_tokens, prompt count, profile, attention
backends, and the same drafter, target and prompts by hash); drift_checks then compares acceptance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speclock.core import files
from speclock.core.errors import BadInput
from speclock.spec.profile_values import BUILTIN
from speclock.verify.checks import Check
from speclock.verify.profiles import Profile, report_profile
from speclock.verify.report import dotted_get
from speclock.verify.report_types import Metrics, SmokeReport

# What identifies the measurement a baseline stands for: the drafter, the target and the prompts.
IDENTITY = ("reference.key.drafter_sha256", "reference.key.target_sha256", "reference.key.prompts_sha256")
_BASELINE_HINT = (
    "compare against a baseline of the same stack, engine, k, prompts, max_tokens and drafter "
    "(baselines/<stack>/<engine package>-<version>.json); record a new one by checking a passing "
    "report by hand and copying it there"
)


def baseline_path(baselines_dir: Path, stack: str, engine_package: str, engine_version: str, profile: str = "quick") -> Path:
    """baselines/<stack>/<package>-<version>.json for the quick profile (the files stored before profiles existed),
    <package>-<version>.<profile>.json for the others; every part comes from data, so each must be a plain name."""
    folder = files.plain_name(stack, what="stack name")
    suffix = "" if profile == "quick" else f".{profile}"
    name = files.plain_name(f"{engine_package}-{engine_version}{suffix}.json", what="baseline file name")
    return files.confined(baselines_dir, f"{folder}/{name}", what="baseline")


def find_baseline(baselines_dir: Path, report: SmokeReport) -> Path | None:
    """The stored baseline for the report's stack and engine version, if one is stored."""
    pkg = report["engine"].get("package") or report["engine"]["name"]
    path = baseline_path(baselines_dir, report["stack"], pkg, report["engine"]["version"], report_profile(report))
    return path if path.exists() else None


def check_baseline_matches(report: SmokeReport, baseline: SmokeReport, source: str, report_source: str = "the report") -> None:
    """A baseline must be a valid measurement of the same thing: stack, engine family, k, prompts, length, drafter.

    Both documents are already valid reports (load_report). The prompts are compared by content
    (reference.key.prompts_sha256), not by prompts.source: the same file has one path on the host and
    another inside an image.
    """

    def refuse(message: str) -> BadInput:
        return BadInput(message, hint=_BASELINE_HINT)

    m = baseline["metrics"]
    if m["num_drafts"] <= 0 or m["mean_acceptance_length"] <= 0:
        raise refuse(
            f"{source}: key 'metrics.num_drafts': the baseline never drafted ({m['num_drafts']} drafts, mean "
            f"acceptance length {m['mean_acceptance_length']}): nothing to compare report {report_source} against"
        )
    if baseline.get("run", {}).get("completed") is False:
        raise refuse(
            f"{source}: key 'run.completed': the baseline's engine run did not complete; it cannot be the "
            f"baseline of report {report_source}"
        )
    mine_prof, theirs_prof = report_profile(report), report_profile(baseline)
    if mine_prof != theirs_prof:
        raise BadInput(
            f"{source}: the baseline was measured with smoke profile {theirs_prof!r}, the report {report_source} "
            f"with profile {mine_prof!r} (key 'profile'; a report without it is {'quick'!r})",
            hint=f"gate against a {mine_prof} baseline (baselines/<stack>/<engine package>-<version>"
            f"{'' if mine_prof == 'quick' else '.' + mine_prof}.json), or run `speclock smoke --profile "
            f"{theirs_prof}` to compare with this one",
        )
    mine_t, theirs_t = temperature_of(report), temperature_of(baseline)
    if mine_t != theirs_t:
        raise refuse(f"{source}: baseline key 'profile.temperature' is {theirs_t}, the report {report_source} has {mine_t}")
    mine_b, theirs_b = _backend_names(report), _backend_names(baseline)
    if mine_b != theirs_b:
        raise refuse(
            f"{source}: the baseline measured attention backends {theirs_b or ['the default']}, the report "
            f"{report_source} {mine_b or ['the default']} (key 'attention_backends')"
        )
    for key in ("stack", "engine.name", "num_speculative_tokens", "prompts.count", "max_tokens", "target.arch"):
        mine_found, mine = dotted_get(report, key)
        theirs_found, theirs = dotted_get(baseline, key)
        for found, where in ((mine_found, report_source), (theirs_found, source)):
            if not found:
                raise refuse(f"{where}: key '{key}' is missing, so baseline {source} cannot be matched to report {report_source}")
        if mine != theirs:
            raise refuse(f"{source}: baseline key '{key}' is {theirs!r}, the report {report_source} has {mine!r}")
    # A baseline measured with another drafter says nothing about this one: a retrained drafter
    # needs a new baseline, not a silent pass (or fail) against the old one's acceptance. Leaving the
    # identity out of either side must not skip this.
    for key in IDENTITY:
        mine_found, mine = dotted_get(report, key)
        theirs_found, theirs = dotted_get(baseline, key)
        for found, where in ((mine_found, report_source), (theirs_found, source)):
            if not found:
                raise BadInput(
                    f"{where}: key '{key}' is missing: without it baseline {source} cannot be matched to "
                    f"report {report_source} (which drafter, target and prompts were measured?)",
                    hint="use reports written by `speclock smoke` (it records reference.key); a report "
                    "without it can only be gated with --baseline none",
                )
        if mine != theirs:
            what = key.rsplit(".", 1)[1].replace("_sha256", "")
            raise refuse(
                f"{source}: the baseline was measured with {what} {str(theirs)[:12]}, the report "
                f"{report_source} with {str(mine)[:12]} (key '{key}')"
            )


def temperature_of(report: SmokeReport) -> float:
    """The report's sampling temperature (0.0, greedy, for a report without a profile)."""
    prof = report.get("profile")
    return float(prof.get("temperature", 0.0)) if isinstance(prof, dict) else 0.0


def _backend_names(report: SmokeReport) -> list[str]:
    return [b["backend"] for b in report.get("attention_backends") or []]


def _rates(metrics: Metrics) -> list[float]:
    drafts = metrics["num_drafts"]
    return [a / drafts if drafts else 0.0 for a in metrics["accepted_per_position"]]


def _drift(base: float, cur: float) -> float:
    """Signed relative drift of `cur` from `base` (negative: a drop)."""
    if base:
        return (cur - base) / base
    return 0.0 if cur == base else float("inf")


def drift_checks(
    metrics: Metrics, base_metrics: Metrics, profile: Profile, thresholds: dict[str, Any], label: str = ""
) -> list[Check]:
    """Mean acceptance length and each position's acceptance rate against the baseline's, by relative drift.

    A drop beyond the tolerance fails. A rise beyond it fails too where losslessness is not proven token by
    token (profile.two_sided: the sampled profile), since a rejection sampler that accepts what it should
    reject raises acceptance. The mean's drop limit is smoke.thresholds.max_relative_drop unless the profile
    sets max_mean_drift.
    """
    checks: list[Check] = []
    mean_tol = profile.max_mean_drift if profile.max_mean_drift is not None else thresholds.get("max_relative_drop", 0.05)
    pairs: list[tuple[str, float, float, float]] = []
    if profile.two_sided or label:  # a one-sided top-level mean is the "acceptance length vs baseline" check
        pairs.append(
            ("mean acceptance length", base_metrics["mean_acceptance_length"], metrics["mean_acceptance_length"], mean_tol)
        )
    if profile.position_drift:
        k = len(metrics["accepted_per_position"])
        # strict=False: a run that never drafted has no positions (speclock.verify.report), and then none are compared
        for i, (b, c) in enumerate(zip(_rates(base_metrics), _rates(metrics), strict=False)):
            pairs.append((f"acceptance at position {i + 1} of {k}", b, c, profile.position_tolerance(i)))
    for what, base, cur, tol in pairs:
        d = _drift(base, cur)
        ok = d >= -tol and (not profile.two_sided or d <= tol)
        side = "two-sided" if profile.two_sided else "drop"
        why = "; a rise is suspect where losslessness is not proven token by token" if d > 0 else ""
        detail = (
            ""
            if ok
            else (
                f"{cur:.3f} vs baseline {base:.3f}: {'rose' if d > 0 else 'dropped'} {abs(d):.1%} (limit {tol:.1%}, {side}{why})"
            )
        )
        checks.append(
            Check(
                f"{what} vs baseline{label} ({profile.name})",
                ok,
                round(d, 4) if d != float("inf") else None,
                f"{'|drift|' if profile.two_sided else 'drop'} <= {tol:.1%}",
                "regression",
                detail,
            )
        )
    return checks


def builtin_profile(report: SmokeReport) -> Profile:
    """The report's profile with speclock's built-in tolerances (a caller without a stack at hand)."""
    name = report_profile(report)
    builtin = BUILTIN[name]
    position = builtin["max_position_drift"]
    return Profile(
        name=name,
        num_prompts=0,
        max_tokens=0,
        temperature=temperature_of(report),
        seeds=(0,),
        max_mean_drift=builtin["max_mean_drift"],
        max_position_drift=tuple(position) if isinstance(position, list) else position,
        two_sided=builtin["two_sided"],
        position_drift=builtin["position_drift"],
    )


def rel_drop(base: float, cur: float) -> float:
    """How far `cur` fell below `base`, relative to `base` (0.0 for a zero base)."""
    return (base - cur) / base if base else 0.0
