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
    heads, kv, hd = tcfg["num_attention_heads"], tcfg["num_key_value_heads"], tcfg.get("head_dim", h // tcfg["num_attention_heads"])
    cfg = {k: tcfg[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                                "rms_norm_eps", "max_position_embeddings", "bos_token_id", "eos_token_id", "hidden_act")}
    cfg.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1, head_dim=hd,
               rope_theta=(tcfg.get("rope_parameters") or {}).get("rope_theta", 10000.0), tie_word_embeddings=False,
               torch_dtype="bfloat16", draft_vocab_size=vocab,
               eagle_config={"eagle_aux_hidden_state_layer_ids": [2, n // 2, n - 3]})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))

    def r(*shape):
        return (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)

    ones = lambda: torch.ones(h, dtype=torch.bfloat16)  # noqa: E731
    tensors = {
        "fc.weight": r(h, 3 * h), "norm.weight": ones(), "lm_head.weight": r(vocab, h),
        "midlayer.input_layernorm.weight": ones(), "midlayer.hidden_norm.weight": ones(),
        "midlayer.post_attention_layernorm.weight": ones(),
        "midlayer.self_attn.q_proj.weight": r(heads * hd, 2 * h), "midlayer.self_attn.k_proj.weight": r(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": r(kv * hd, 2 * h), "midlayer.self_attn.o_proj.weight": r(h, heads * hd),
        "midlayer.mlp.gate_proj.weight": r(inter, h), "midlayer.mlp.up_proj.weight": r(inter, h),
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
