"""The smoke profiles' built-in values and the rules for a stack's [smoke.profiles] overrides (speclock.verify.profiles
builds the profiles from them). Here, in the spec layer, so that a stack file is checked whole when it is loaded:
an override out of bounds is exit 2 naming the key before any engine starts (issue #40: max_tokens 1e9, 100,000 seeds
and temperature 1e300 were accepted, and an engine was started with max_tokens 1e9)."""

from __future__ import annotations

import math
from typing import Any

from speclock.core import files
from speclock.core.errors import BadInput

PROFILES = ("quick", "full", "sampled")
# Upper bounds: the [smoke] counts' own (spec/validate.py); beyond 10 a temperature samples noise; more than 20
# seeds is hours of sampling; a seed is what engines take (an unsigned 32-bit integer).
BOUNDS = {"num_prompts": 100_000, "max_tokens": 32_768, "temperature": 10.0, "seeds": 20, "seed": 2**32 - 1}

# Built-in values; a stack's [smoke.profiles] table overrides them per key. None = the stack's [smoke] value.
# Tolerances: relative drift (|report - baseline| / baseline) of the mean acceptance length and of each
# position's acceptance rate. Greedy runs repeat exactly on one machine (docs/smoke.md: spread 0 over the
# runs measured), so their tolerance is the engines' own CI standard, 5%, which covers other CPUs' bf16
# rounding; the sampled tolerance comes from the spread over seeds and runs (docs/smoke.md). max_mean_drift None:
# the mean's drop limit is smoke.thresholds.max_relative_drop (one-sided), as before profiles existed.
# dict[str, Any] per profile: values of several types (None, numbers, lists, booleans), looked up by key name strings
# (check_value, verify/profiles.py); a TypedDict is for when verify/ is strictly typed too.
BUILTIN: dict[str, dict[str, Any]] = {
    "quick": {
        "num_prompts": None,
        "max_tokens": None,
        "temperature": 0.0,
        "seeds": [0],
        "max_mean_drift": None,
        "max_position_drift": 0.05,
        "two_sided": False,
        "position_drift": True,
        "per_request_seed": True,
    },
    "full": {
        "num_prompts": None,
        "max_tokens": 256,
        "temperature": 0.0,
        "seeds": [0],
        "max_mean_drift": None,
        "max_position_drift": 0.05,
        "two_sided": False,
        "position_drift": True,
        "per_request_seed": True,
    },
    "sampled": {
        "num_prompts": None,
        "max_tokens": None,
        "temperature": 1.0,
        "seeds": [0, 1, 2],
        "max_mean_drift": 0.05,
        "max_position_drift": 0.10,
        "two_sided": True,
        "position_drift": True,
        "per_request_seed": True,
    },
}
KEY_HELP = {
    "num_prompts": "an integer from 1 to 100000 (default: smoke.num_prompts)",
    "max_tokens": "an integer from 1 to 32768 (default: smoke.max_tokens)",
    "temperature": "a number from 0 to 10 (0 = greedy)",
    "seeds": "a list of 1 to 20 distinct integers from 0 to 2**32 - 1",
    "max_mean_drift": "a relative tolerance from 0 to 1 (e.g. 0.05; greedy profiles default to smoke.thresholds.max_relative_drop)",
    "max_position_drift": "a relative tolerance from 0 to 1, or one per draft position",
    "two_sided": "true or false: a rise beyond the tolerance fails too",
    "position_drift": "true or false: check each draft position against the baseline",
    "per_request_seed": "true or false: pass each seed to the engine per request (false: the passes are independent "
    "draws from the engine's own seeded generator, for engines that crash on seeded requests)",
}


def check_value(key: str, value: Any, where: str, hint: str) -> Any:
    def bad() -> BadInput:
        return BadInput(f"{where}.{key}: {files.short_repr(value)} is not {KEY_HELP[key]}", hint=hint)

    if key in ("num_prompts", "max_tokens"):
        hi = BOUNDS[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi):
            raise bad()
    elif key == "temperature":
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not 0 <= value <= BOUNDS["temperature"]
        ):
            raise bad()
        value = float(value)
    elif key == "seeds":
        if (
            not isinstance(value, list)
            or not 1 <= len(value) <= BOUNDS["seeds"]
            or len(set(map(repr, value))) != len(value)
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= BOUNDS["seed"] for s in value)
        ):
            raise bad()
        value = tuple(value)
    elif key == "max_mean_drift":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise bad()
        value = float(value)
    elif key == "max_position_drift":
        items = value if isinstance(value, list) else [value]
        if not items or not all(not isinstance(v, bool) and isinstance(v, (int, float)) and 0 <= v <= 1 for v in items):
            raise bad()
        value = tuple(float(v) for v in value) if isinstance(value, list) else float(value)
    elif key in ("two_sided", "position_drift", "per_request_seed"):
        if not isinstance(value, bool):
            raise bad()
    return value


# profiles: a stack's [smoke.profiles] as parsed (TOML, not yet checked); smoke: its [smoke] section
def check_overrides(profiles: dict[str, Any], smoke: dict[str, Any], where: str) -> None:
    """Every [smoke.profiles] override of a stack, merged over the built-in values and checked as resolve_profile
    checks it, cross-key rules included (BadInput naming the key): a stack file is refused whole when it loads."""
    k = smoke["num_speculative_tokens"]
    for name, overrides in profiles.items():
        at = f"{where}: key 'smoke.profiles.{name}"
        hint = f"fix [smoke.profiles] {name}; keys: {', '.join(KEY_HELP)}"
        if not isinstance(overrides, dict):
            raise BadInput(f"{at}': expected a table such as {{ max_tokens = 256 }}", hint=hint)
        merged = dict(BUILTIN[name])
        for key, value in overrides.items():
            if key not in KEY_HELP:
                raise BadInput(f"{at}.{key}': unknown key", hint=hint)
            merged[key] = check_value(key, value, at, hint)
        if (name == "sampled") != (merged["temperature"] > 0):
            raise BadInput(
                f"{at}.temperature': {merged['temperature']} in profile {name}",
                hint="the sampled profile samples (temperature > 0); quick and full are greedy (0)",
            )
        drift = merged["max_position_drift"]
        if isinstance(drift, (list, tuple)) and len(drift) != k:
            raise BadInput(
                f"{at}.max_position_drift': {len(drift)} tolerances for k = {k}",
                hint="give one number, or one per draft position",
            )
        if len(merged["seeds"]) > 1 and not merged["temperature"]:
            raise BadInput(f"{at}.seeds': several seeds in a greedy profile repeat the same run", hint="use one seed")
