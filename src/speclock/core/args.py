"""argparse types that check numbers when the command line is parsed (argparse exits 2 on a bad one).

Use them for every count, epoch, job number, duration and probability, so `--jobs 0` or
`--epochs -1` is refused before any work starts, with the option named.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts, jobs, epochs)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give an integer of at least 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds, offsets, optional counts where 0 means none)."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give an integer of at least 0")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (minutes, seconds, rates)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give a number above 0")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (temperatures, tolerances)."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give a number of at least 0")
    return value


def probability(text: str) -> float:
    """A finite number in [0, 1] (rates, fractions, min-p)."""
    value = _number(text, float)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give a number from 0 to 1")
    return value


def int_range(low: int, high: int):
    """An integer in [low, high] (for example k, the number of speculative tokens)."""
    def check(text: str) -> int:
        value = _number(text, int)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not allowed: give an integer from {low} to {high}")
        return value
    check.__name__ = f"int_{low}_{high}"
    return check
