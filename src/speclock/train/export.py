"""Export a trained drafter for vLLM and SGLang, with the speclock manifest; load it back.

Both engines load the same tensors (`LlamaForCausalLMEagle3`: fc, midlayer.*, norm, lm_head, d2t,
t2d); they differ in how `eagle_aux_hidden_state_layer_ids` is read:
  vLLM 0.32/0.33: id k captures the residual stream after k decoder layers (it is the input of
  layer k); the ids are used as written.
  SGLang 0.5.23 (Llama/Qwen-style targets): `set_eagle3_layers_to_capture` adds 1 to every id,
  and captures the input of that layer: id k means after k+1 layers.
So a drafter trained on the states after layers [a, b, c] is written as [a, b, c] for vLLM and
[a-1, b-1, c-1] for SGLang. The manifest states the plain meaning (`aux_layers_after`) and both.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speclock.core.errors import BadInput
from speclock.core.files import fsync_dir
from speclock.drafter.manifest import DrafterManifest, drafter_sha256
from speclock.drafter.models import DRAFT_MANIFEST, MANIFEST_SCHEMA, read_drafter_manifest

if TYPE_CHECKING:
    import torch


def engine_layer_ids(aux_layers_after: list[int]) -> dict[str, list[int]]:
    """The ids each engine must be given so that it feeds the drafter the states after these layers."""
    if any(k < 1 for k in aux_layers_after):
        raise BadInput(f"aux layers {aux_layers_after}: SGLang cannot capture the embeddings (after 0 layers)")
    return {"vllm": list(aux_layers_after), "sglang": [k - 1 for k in aux_layers_after]}


def layers_after_from_engine(engine: str, ids: list[int]) -> list[int]:
    """Inverse of engine_layer_ids: what an engine captures for configured ids."""
    return list(ids) if engine == "vllm" else [i + 1 for i in ids]


def drafter_config_json(dcfg, target_config, layer_ids: list[int]) -> dict[str, Any]:
    rope_theta = dcfg.rope_theta
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": dcfg.hidden_size,
        "intermediate_size": dcfg.intermediate_size,
        "num_attention_heads": dcfg.num_attention_heads,
        "num_key_value_heads": dcfg.num_key_value_heads,
        "head_dim": dcfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": dcfg.rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_theta": rope_theta, "rope_type": "default"},
        "max_position_embeddings": dcfg.max_position_embeddings,
        "vocab_size": dcfg.vocab_size,
        "draft_vocab_size": dcfg.draft_vocab_size,
        "target_hidden_size": dcfg.hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": getattr(target_config, "bos_token_id", None),
        "eos_token_id": getattr(target_config, "eos_token_id", None),
        "pad_token_id": getattr(target_config, "pad_token_id", None),
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "eagle_aux_hidden_state_layer_ids": layer_ids,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True},
    }


def drafter_tensors(drafter) -> dict[str, torch.Tensor]:
    # heavy, optional (torch): imported only where it is used
    import torch

    out: dict[str, torch.Tensor] = {}
    for name, t in drafter.state_dict().items():
        if name == "embed_tokens":
            continue
        if t.is_floating_point():
            t = t.to(torch.bfloat16)
        out[name] = t.detach().cpu().contiguous()
    return out


def write_drafter_folder(drafter, target_config, out_dir: Path, layer_ids: list[int], manifest: DrafterManifest) -> Path:
    """One engine-format folder (config.json, model.safetensors, manifest), written atomically."""
    # heavy, optional (safetensors): imported only where it is used
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _clean_swap_leftovers(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        save_file(drafter_tensors(drafter), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(
            json.dumps(drafter_config_json(drafter.config, target_config, layer_ids), indent=2) + "\n"
        )
        m = manifest.copy()
        m["drafter_sha256"] = drafter_sha256(tmp)
        (tmp / DRAFT_MANIFEST).write_text(json.dumps(m, indent=2) + "\n")
        os.chmod(tmp, 0o755)
        for child in tmp.iterdir():
            os.chmod(child, 0o644)
            with open(child, "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        # A folder cannot be renamed over a non-empty one: move the old one aside, the new one in, then
        # delete the old. A kill in between leaves dot-folders that the next export removes.
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / out_dir.name)
        os.replace(tmp, out_dir)
        fsync_dir(out_dir.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _clean_swap_leftovers(out_dir: Path) -> None:
    """Folders a killed export left beside `out_dir` (its own temp and old-copy prefixes only)."""
    for prefix in (f".{out_dir.name}.tmp-", f".{out_dir.name}.old-"):
        for stale in out_dir.parent.glob(prefix + "*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)


def build_manifest(
    *,
    target_name: str,
    target_sha: str,
    target_config,
    aux_layers_after: list[int],
    draft_vocab_size: int,
    data: dict[str, Any],
    training: dict[str, Any],
    reference: list[dict[str, Any]] | None = None,
) -> DrafterManifest:
    return {
        "schema": MANIFEST_SCHEMA,
        "target": {
            "name": target_name,
            "sha256": target_sha,
            "sha256_of": "speclock.drafter.models.target_sha256: sha256 over (name, dtype, shape, bytes) of every weight tensor in the target's safetensors, by name",
            "architecture": (getattr(target_config, "architectures", None) or ["?"])[0],
            "num_hidden_layers": target_config.num_hidden_layers,
            "hidden_size": target_config.hidden_size,
            "vocab_size": target_config.vocab_size,
        },
        "aux_layers_after": list(aux_layers_after),
        "aux_layers_meaning": "hidden state after k decoder layers (transformers hidden_states[k]); 0 = embeddings output",
        "engine_layer_ids": engine_layer_ids(aux_layers_after),
        "draft_vocab_size": draft_vocab_size,
        "data": data,
        "training": training,
        "reference": list(reference or []),
    }


def export_drafter(drafter, target_config, manifest: DrafterManifest, vllm_dir: Path, sglang_dir: Path | None) -> dict[str, Any]:
    ids = manifest["engine_layer_ids"]
    write_drafter_folder(drafter, target_config, vllm_dir, ids["vllm"], manifest)
    if sglang_dir:
        write_drafter_folder(drafter, target_config, sglang_dir, ids["sglang"], manifest)
    return read_drafter_manifest(vllm_dir, required=True, strict_schema=True)
