"""Smoke profiles: how long, how greedy and how many seeds a smoke run is, and how far it may drift.

- `quick`: the in-image default (`speclock selfcheck`): the stack's prompts x smoke.max_tokens, greedy.
- `full`: what `upgrade`, GPU runs and a request use: 256 new tokens, greedy, per-position drift checked
  against the baseline (as vLLM's own acceptance-length test: 80 MT-Bench prompts, 256 tokens, k=3, +-5%).
- `sampled`: temperature > 0 over several seeds: acceptance and per-position rates per seed with a 95%
  confidence interval. Token-for-token losslessness cannot be checked there (two correct samplers draw
  different tokens); what is checked is acceptance against a baseline of the same profile, two-sided:
  a rejection sampler that rejects too often shows as a drop, one that accepts what it should reject as
  a rise. Losslessness of the verification path itself is proven by the greedy profiles.

Each stack may override any field per profile in `[smoke.profiles]` (e.g.
`sampled = { temperature = 0.8, seeds = [0, 1, 2, 3] }`); the drift tolerances there come from measured
spread (benchmarks/smoke_spread.py, docs/smoke.md). A report records its profile; the gate compares it
only with a baseline of the same profile. A report without `profile` was written before profiles
existed: those runs were all greedy at the stack's length, which is `quick`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from speclock.core import files
from speclock.core.errors import BadInput
from speclock.spec.profile_values import BUILTIN, KEY_HELP, PROFILES, check_overrides, check_value
from speclock.spec.stack import Stack
from speclock.verify.report_types import ProfileRecord, SeedMetrics, SeedSpread, SmokeReport, Spread

DEFAULT_PROFILE = "quick"
LEGACY_PROFILE = "quick"  # what a report without a `profile` key was (64 tokens, greedy)


@dataclass(frozen=True)
class Profile:
    name: str
    num_prompts: int
    max_tokens: int
    temperature: float
    seeds: tuple[int, ...]
    max_mean_drift: float | None
    max_position_drift: tuple[float, ...] | float
    two_sided: bool
    position_drift: bool
    per_request_seed: bool = True

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    def position_tolerance(self, i: int) -> float:
        tol = self.max_position_drift
        if isinstance(tol, tuple):
            return tol[i] if i < len(tol) else tol[-1]
        return tol

    def describe(self) -> ProfileRecord:
        """The profile as a report records it (every field, tuples as lists)."""
        drift = self.max_position_drift
        return {
            "name": self.name,
            "num_prompts": self.num_prompts,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seeds": list(self.seeds),
            "max_mean_drift": self.max_mean_drift,
            "max_position_drift": list(drift) if isinstance(drift, tuple) else drift,
            "two_sided": self.two_sided,
            "position_drift": self.position_drift,
            "per_request_seed": self.per_request_seed,
        }


def resolve_profile(stack: Stack, name: str | None = None, *, source: str = "--profile") -> Profile:
    """The named profile (default quick) with the stack's [smoke.profiles] overrides and [smoke] defaults.

    Bad input names the stack file and key: `<stack>: key 'smoke.profiles.sampled.seeds': ...`.
    """
    name = name or DEFAULT_PROFILE
    if name not in PROFILES:
        raise BadInput(f"{source}: unknown smoke profile {files.short_repr(name)}", hint=f"one of {', '.join(PROFILES)}")
    overrides = (stack.data.get("smoke.profiles") or {}).get(name) or {}
    # the stack's rules for its overrides (also applied when it loads; a Stack may be built from data directly)
    check_overrides({name: overrides}, stack.smoke, str(stack.path))
    where = f"{stack.path}: key 'smoke.profiles.{name}"
    hint = f"fix [smoke.profiles] {name} in {stack.path}; keys: {', '.join(KEY_HELP)}"
    values = {k: check_value(k, v, where, hint) for k, v in {**BUILTIN[name], **overrides}.items()}
    values["num_prompts"] = values["num_prompts"] or stack.smoke["num_prompts"]
    values["max_tokens"] = values["max_tokens"] or stack.smoke["max_tokens"]
    return Profile(name=name, **values)


def report_profile(report: SmokeReport) -> str:
    """The profile a report was measured with; a report from before profiles existed is `quick` (greedy)."""
    prof = report.get("profile")
    if isinstance(prof, dict):
        return str(prof.get("name"))
    return LEGACY_PROFILE


# ---------------------------------------------------------------- statistics over seeds

# Two-sided 95% Student t quantiles by degrees of freedom (n - 1); more than 30 seeds use the normal 1.96.
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def t95(df: int) -> float:
    if df <= 0:
        return float("inf")
    best = max(d for d in _T95 if d <= df) if df <= 30 else None
    return _T95[best] if best is not None else 1.96


def spread(values: list[float]) -> Spread:
    """Mean, sample standard deviation, min, max and a 95% confidence interval of the mean (Student t)."""
    n = len(values)
    mean = statistics.fmean(values) if values else 0.0
    sd = statistics.stdev(values) if n > 1 else 0.0
    half = t95(n - 1) * sd / math.sqrt(n) if n > 1 else None
    return {
        "n": n,
        "mean": round(mean, 6),
        "stdev": round(sd, 6),
        "min": round(min(values), 6) if values else None,
        "max": round(max(values), 6) if values else None,
        "ci95": [round(mean - half, 6), round(mean + half, 6)] if half is not None else None,
    }


def per_seed_summary(per_seed: list[SeedMetrics]) -> SeedSpread:
    """Spread over seeds of the mean acceptance length and of each position's acceptance rate."""
    k = max((len(s["acceptance_per_position"]) for s in per_seed), default=0)
    return {
        "mean_acceptance_length": spread([s["mean_acceptance_length"] for s in per_seed]),
        "acceptance_per_position": [
            spread([s["acceptance_per_position"][i] for s in per_seed if i < len(s["acceptance_per_position"])]) for i in range(k)
        ],
    }
