"""Inference engines behind one small interface, chosen by name.

Each engine module (`vllm`, `sglang`, `reference`) provides `start(config) -> EngineSession`.
A session generates greedily from token ids and exposes the engine's speculative-decoding
counters as a cumulative `SpecCounters` snapshot; callers take deltas around a run, because
engines count since start (SGLang's `avg_spec_accept_length` is even an average since start).
Heavy imports (torch, vllm, sglang) happen inside the engine modules' functions.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from speclock.errors import BadInput

# Name -> module. `reference` is speclock's own PyTorch speculative decoder (the judge).
ENGINES: dict[str, str] = {
    "vllm": "speclock.engines.vllm",
    "sglang": "speclock.engines.sglang",
    "reference": "speclock.engines.reference",
}


@dataclass(frozen=True)
class EngineConfig:
    """What a smoke run asks of an engine: target, optional drafter, k and engine settings."""

    target: Path
    draft: Path | None = None
    num_speculative_tokens: int = 3
    settings: dict[str, Any] = field(default_factory=dict)  # stack [engine].settings
    server_url: str = ""  # attach to a running server instead of starting one in-process


@dataclass(frozen=True)
class SpecCounters:
    """Cumulative speculative-decoding counters, in vLLM's terms (drafts = verify steps)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()

    def __sub__(self, before: "SpecCounters") -> "SpecCounters":
        n = max(len(self.accepted_per_position), len(before.accepted_per_position))
        a = list(self.accepted_per_position) + [0] * (n - len(self.accepted_per_position))
        b = list(before.accepted_per_position) + [0] * (n - len(before.accepted_per_position))
        return SpecCounters(
            self.num_drafts - before.num_drafts,
            self.num_draft_tokens - before.num_draft_tokens,
            self.num_accepted_tokens - before.num_accepted_tokens,
            tuple(x - y for x, y in zip(a, b)),
        )

    def metrics(self) -> dict[str, Any]:
        """The report contract's `metrics` object."""
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            "mean_acceptance_length": 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0,
            "acceptance_per_position": [x / self.num_drafts if self.num_drafts else 0.0 for x in self.accepted_per_position],
        }


class EngineSession(Protocol):
    """A started engine (or an attached server)."""

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Greedy completions (token ids) for each prompt, in order."""

    def counters(self) -> SpecCounters:
        """Cumulative spec-decode counters now (zeros without a drafter)."""

    def captured_layers(self) -> list[int] | None:
        """Target layers whose hidden states the engine feeds the drafter, as it resolved them."""

    def stop(self) -> None:
        """Release the engine (processes, memory); safe to call twice."""


class EngineModule(Protocol):
    NAME: str

    def start(self, config: EngineConfig) -> EngineSession: ...

    def version(self, package: str) -> str: ...


def get_engine(name: str) -> ModuleType:
    """The engine module for `name` (imported lazily, so missing engines cost nothing)."""
    if name not in ENGINES:
        raise BadInput(f"unknown engine {name!r}", hint=f"known engines: {', '.join(ENGINES)}")
    return importlib.import_module(ENGINES[name])


def package_version(package: str) -> str:
    """Installed version of a distribution, or '' when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def aux_layer_ids(draft: Path, num_target_layers: int) -> tuple[list[int], str]:
    """The drafter's configured aux hidden-state layer ids and where they came from."""
    import json

    cfg = json.loads((draft / "config.json").read_text())
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return [int(i) for i in ids], "draft config"
    n = num_target_layers
    return [2, n // 2, n - 3], "engine default (2, N//2, N-3)"
