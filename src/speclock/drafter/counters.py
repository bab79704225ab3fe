"""Speculative-decoding counters, in vLLM's terms (drafts = verify steps): the one SpecCounters.

Engines hand out cumulative snapshots (callers take deltas with `-`); the reference decoder counts
into one with `add`. `metrics()` is the smoke report's `metrics` object (speclock.smoke/v1);
`reference_metrics()` is the shape recorded in drafter manifests' "reference" entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speclock.core.errors import BadInput


@dataclass
class SpecCounters:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()
    k: int = field(default=0, compare=False)  # drafts per verify step; 0: len(accepted_per_position)

    def __post_init__(self):
        self.accepted_per_position = tuple(self.accepted_per_position) or (0,) * self.k
        self.k = self.k or len(self.accepted_per_position)

    @classmethod
    def from_metrics(cls, m: dict[str, Any]) -> SpecCounters:
        return cls(m["num_drafts"], m["num_draft_tokens"], m["num_accepted_tokens"], tuple(m["accepted_per_position"]))

    def add(self, accepted: int) -> None:
        """Count one verify step of k drafts of which the first `accepted` were accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += self.k
        self.num_accepted_tokens += accepted
        self.accepted_per_position = tuple(n + (j < accepted) for j, n in enumerate(self.accepted_per_position))

    def _combine(self, other: SpecCounters, sign: int) -> SpecCounters:
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        a = list(self.accepted_per_position) + [0] * (n - len(self.accepted_per_position))
        b = list(other.accepted_per_position) + [0] * (n - len(other.accepted_per_position))
        return SpecCounters(
            self.num_drafts + sign * other.num_drafts,
            self.num_draft_tokens + sign * other.num_draft_tokens,
            self.num_accepted_tokens + sign * other.num_accepted_tokens,
            tuple(x + sign * y for x, y in zip(a, b, strict=True)),  # both padded to n above
        )

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        return self._combine(before, -1)

    def __add__(self, other: SpecCounters) -> SpecCounters:
        return self._combine(other, 1)

    def _rates(self) -> dict[str, Any]:
        drafts, tokens, acc = self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens
        return {
            "num_drafts": drafts,
            "num_draft_tokens": tokens,
            "num_accepted_tokens": acc,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_rate": acc / tokens if tokens else 0.0,
            "mean_acceptance_length": 1.0 + acc / drafts if drafts else 1.0,
        }

    def per_position(self) -> list[float]:
        return [x / self.num_drafts if self.num_drafts else 0.0 for x in self.accepted_per_position]

    def metrics(self) -> dict[str, Any]:
        """The report contract's `metrics` object."""
        return {**self._rates(), "acceptance_per_position": self.per_position()}

    def reference_metrics(self) -> dict[str, Any]:
        """The reference decoder's result, as recorded in drafter manifests (models/*/speclock-manifest.json)."""
        return {**self._rates(), "per_position_rate": self.per_position()}


def check_counters(m: dict[str, Any]) -> None:
    """Internal consistency of a counters dict; raises BadInput naming the broken relation."""
    k = len(m["accepted_per_position"])
    if m["num_draft_tokens"] != k * m["num_drafts"]:
        raise BadInput(f"counters: num_draft_tokens {m['num_draft_tokens']} != k*num_drafts {k}*{m['num_drafts']}")
    if sum(m["accepted_per_position"]) != m["num_accepted_tokens"]:
        raise BadInput("counters: accepted_per_position does not sum to num_accepted_tokens")
    # neighbours: the list against itself shifted by one (one shorter)
    if any(a < b for a, b in zip(m["accepted_per_position"], m["accepted_per_position"][1:], strict=False)):
        raise BadInput("counters: accepted_per_position must not increase (a chain accepts a prefix)")
    if m["accepted_per_position"] and m["accepted_per_position"][0] > m["num_drafts"]:
        raise BadInput("counters: more first-position accepts than drafts")
