"""The reference decoder (speclock.drafter.reference) as one more engine of `speclock.engines`:
greedy generation, speculative when a drafter is given, with vLLM-style counters."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from speclock import __version__
from speclock.drafter.counters import SpecCounters
from speclock.drafter.manifest import load_drafter
from speclock.drafter.models import read_drafter_manifest, read_model_config
from speclock.drafter.reference import eos_ids, greedy_generate, load_target, speculative_generate
from speclock.engines import EngineConfig

if TYPE_CHECKING:
    from speclock.drafter.eagle3 import Eagle3Drafter  # imports torch

NAME = "reference"


def version(package: str = "speclock") -> str:
    return __version__


class ReferenceSession:
    """`speclock.engines` session: greedy generation (speculative when a drafter is given), counters."""

    def __init__(self, config: EngineConfig) -> None:
        settings = dict(getattr(config, "settings", {}) or {})
        device = settings.get("device") or "cpu"
        self.model, self.tok = load_target(config.target, device, settings.get("dtype"))
        self.k = int(getattr(config, "num_speculative_tokens", 3))
        self.counters_ = SpecCounters(k=self.k)
        self.drafter: Eagle3Drafter | None = None
        self.layers: list[int] | None = None
        draft: Path | None = getattr(config, "draft", None)
        if draft:
            # Check the drafter's files here (named BadInput) before the training code reads them.
            read_model_config(draft, what="drafter")
            read_drafter_manifest(draft, required=True)

            self.drafter, manifest = load_drafter(draft, self.model, device, check_target_dir=Path(config.target))
            self.layers = manifest["aux_layers_after"]
        self.stop_ids = eos_ids(self.model, self.tok)

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        if self.drafter is None or self.layers is None:  # set together: a drafter comes with its layers
            return [greedy_generate(self.model, p, max_tokens, self.stop_ids) for p in prompts]
        return [
            speculative_generate(self.model, self.drafter, self.layers, p, self.k, max_tokens, self.stop_ids, self.counters_)
            for p in prompts
        ]

    def counters(self) -> SpecCounters:
        c = self.counters_  # a snapshot: the session keeps counting into its own
        return SpecCounters(c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, c.accepted_per_position)

    def captured_layers(self) -> list[int] | None:
        return list(self.layers) if self.layers else None

    def stop(self) -> None:
        self.model = self.drafter = None


def start(config: EngineConfig) -> ReferenceSession:
    return ReferenceSession(config)
