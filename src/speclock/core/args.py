"""argparse types that check numbers when the command line is parsed (argparse exits 2 on a bad one).

Use them for every count, epoch, job number, duration and probability, so `--jobs 0` or
`--epochs -1` is refused before any work starts, with the option named.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

_N = TypeVar("_N", int, float)


def _number(text: str, kind: type[_N]) -> _N:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _bounded(kind: type[_N], ok: Callable[[_N], bool], allowed: str, name: str, doc: str) -> Callable[[str], _N]:
    """A type that parses `kind` and accepts what `ok` allows; the message says what to give."""

    def check(text: str) -> _N:
        value = _number(text, kind)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{value} is not allowed: give {allowed}")
        return value

    check.__name__ = check.__qualname__ = name
    check.__doc__ = doc
    return check


positive_int = _bounded(
    int, lambda v: v >= 1, "an integer of at least 1", "positive_int", "An integer >= 1 (counts, jobs, epochs)."
)
non_negative_int = _bounded(
    int,
    lambda v: v >= 0,
    "an integer of at least 0",
    "non_negative_int",
    "An integer >= 0 (seeds, offsets, optional counts where 0 means none).",
)
positive_float = _bounded(
    float, lambda v: v > 0, "a number above 0", "positive_float", "A finite number > 0 (minutes, seconds, rates)."
)
non_negative_float = _bounded(
    float, lambda v: v >= 0, "a number of at least 0", "non_negative_float", "A finite number >= 0 (temperatures, tolerances)."
)
probability = _bounded(
    float,
    lambda v: 0.0 <= v <= 1.0,
    "a number from 0 to 1",
    "probability",
    "A finite number in [0, 1] (rates, fractions, min-p).",
)


def int_range(low: int, high: int) -> Callable[[str], int]:
    """An integer in [low, high] (for example k, the number of speculative tokens)."""
    return _bounded(
        int,
        lambda v: low <= v <= high,
        f"an integer from {low} to {high}",
        f"int_{low}_{high}",
        f"An integer from {low} to {high}.",
    )


# The longest EAGLE-3 draft chain any command accepts (stack keys too): per-position acceptance falls
# geometrically, so drafts past 16 are never accepted and only cost time.
MAX_K = 16
draft_length = int_range(1, MAX_K)
tcp_port = int_range(1, 65535)


def host_address(text: str) -> str:
    """A listen address: non-empty, no whitespace (a server command built from '' or 'a b' cannot start)."""
    if not text or any(c.isspace() for c in text) or "\x00" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not an address: give a host name or IP, e.g. 127.0.0.1 or 0.0.0.0")
    return text


# The types above that parse text, not numbers (the CLI rules test checks every other one refuses -1, nan, inf).
TEXT_TYPES = (host_address,)
