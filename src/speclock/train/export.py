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

from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import atomic_write_text, expect, file_sha256, fsync_dir, read_json  # file_sha256: importable here too

MANIFEST_NAME = "speclock-manifest.json"
MANIFEST_SCHEMA = "speclock.drafter/v1"


def engine_layer_ids(aux_layers_after: list[int]) -> dict[str, list[int]]:
    """The ids each engine must be given so that it feeds the drafter the states after these layers."""
    if any(k < 1 for k in aux_layers_after):
        raise BadInput(f"aux layers {aux_layers_after}: SGLang cannot capture the embeddings (after 0 layers)")
    return {"vllm": list(aux_layers_after), "sglang": [k - 1 for k in aux_layers_after]}


def layers_after_from_engine(engine: str, ids: list[int]) -> list[int]:
    """Inverse of engine_layer_ids: what an engine captures for configured ids."""
    return list(ids) if engine == "vllm" else [i + 1 for i in ids]


def drafter_config_json(dcfg, target_config, layer_ids: list[int]) -> dict:
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


def drafter_tensors(drafter) -> dict:
    import torch

    out = {}
    for name, t in drafter.state_dict().items():
        if name == "embed_tokens":
            continue
        if t.is_floating_point():
            t = t.to(torch.bfloat16)
        out[name] = t.detach().cpu().contiguous()
    return out


def write_drafter_folder(drafter, target_config, out_dir: Path, layer_ids: list[int], manifest: dict) -> Path:
    """One engine-format folder (config.json, model.safetensors, manifest), written atomically."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _clean_swap_leftovers(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        save_file(drafter_tensors(drafter), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(drafter_config_json(drafter.config, target_config, layer_ids), indent=2) + "\n")
        m = dict(manifest)
        m["drafter_sha256"] = drafter_sha256(tmp)
        (tmp / MANIFEST_NAME).write_text(json.dumps(m, indent=2) + "\n")
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


def drafter_sha256(folder: Path) -> str:
    """Identity of a drafter: its tensors (as target_sha256 hashes a target's)."""
    from speclock.drafter.models import target_sha256

    return target_sha256(folder)


def build_manifest(*, target_name: str, target_sha: str, target_config, aux_layers_after: list[int], draft_vocab_size: int,
                   data: dict, training: dict, reference: list | None = None) -> dict:
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


def export_drafter(drafter, target_config, manifest: dict, vllm_dir: Path, sglang_dir: Path | None) -> dict:
    ids = manifest["engine_layer_ids"]
    write_drafter_folder(drafter, target_config, vllm_dir, ids["vllm"], manifest)
    if sglang_dir:
        write_drafter_folder(drafter, target_config, sglang_dir, ids["sglang"], manifest)
    return read_manifest(vllm_dir)


# --- manifest: reading, checking, reference records ------------------------------------------
def read_manifest(folder: Path) -> dict:
    p = Path(folder) / MANIFEST_NAME
    if not p.is_file():
        raise BadInput(f"{folder} has no {MANIFEST_NAME}", hint="export the drafter with `speclock train export`")
    hint = "export the drafter again with `speclock train export` (or restore the folder from git)"
    m = read_json(p, what="drafter manifest", hint=hint)
    if m.get("schema") != MANIFEST_SCHEMA:
        raise BadInput(f"{p}: key 'schema' is {m.get('schema')!r}, expected {MANIFEST_SCHEMA!r}", hint=hint)
    target = m.get("target")
    if target is not None:  # what check_manifest_matches_target and the reference key read
        expect(target, dict, "key 'target'", path=p, hint=hint)
        for key, kind in (("name", str), ("sha256", str), ("num_hidden_layers", int), ("hidden_size", int),
                          ("vocab_size", int)):
            if key in target:
                expect(target[key], kind, f"key 'target.{key}'", path=p, hint=hint)
    if "reference" in m:
        expect(m["reference"], list, "key 'reference'", path=p, hint=hint)
        for i, rec in enumerate(m["reference"]):
            expect(rec, dict, f"key 'reference[{i}]'", path=p, hint=hint)
            if "key" in rec:
                expect(rec["key"], dict, f"key 'reference[{i}].key'", path=p, hint=hint)
    return m


def check_manifest_matches_target(manifest: dict, target_dir: Path, target_config=None) -> None:
    """The drafter was trained on this target: same weights hash and shape; raises CheckFailed if not."""
    from speclock.drafter.models import target_sha256

    t = manifest.get("target")
    missing = [k for k in ("name", "sha256", "num_hidden_layers", "hidden_size", "vocab_size") if k not in (t or {})]
    if missing:
        raise BadInput(f"the drafter manifest has no target {', '.join(missing)} (key 'target')",
                       hint="export the drafter again with `speclock train export`")
    sha = target_sha256(target_dir)
    if sha != t["sha256"]:
        raise CheckFailed(f"the drafter was trained on target {t['name']} (weights sha256 {t['sha256'][:16]}...), "
                          f"but {target_dir} has weights sha256 {sha[:16]}...",
                          hint="use the target the drafter was trained on, or retrain the drafter for this target")
    if target_config is not None:
        for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
            if getattr(target_config, key) != t[key]:
                raise CheckFailed(f"drafter manifest says target {key}={t[key]}, {target_dir} has {getattr(target_config, key)}")


def reference_key(target_sha: str, drafter_sha: str, prompts: list[str], k: int, max_tokens: int) -> dict:
    from speclock.spec.prompts import prompts_sha256

    return {"target_sha256": target_sha, "drafter_sha256": drafter_sha, "prompts_sha256": prompts_sha256(prompts),
            "num_prompts": len(prompts), "k": k, "max_tokens": max_tokens}


def lookup_reference(manifest: dict, key: dict) -> dict | None:
    """The recorded reference-decoder metrics for exactly this key, or None."""
    fields = ("target_sha256", "drafter_sha256", "prompts_sha256", "num_prompts", "k", "max_tokens")
    records = manifest.get("reference", [])
    for rec in records if isinstance(records, list) else []:
        # A record of the wrong shape never matches (smoke refuses such a manifest through speclock.drafter.models).
        if (isinstance(rec, dict) and isinstance(rec.get("key"), dict) and isinstance(rec.get("metrics"), dict)
                and all(rec["key"].get(f) == key.get(f) for f in fields)):
            return rec["metrics"]
    return None


def record_reference(folder: Path, key: dict, metrics: dict, extra: dict | None = None) -> dict:
    """Add or replace the record for `key` in the folder's manifest (atomic rewrite)."""
    m = read_manifest(folder)
    fields = ("target_sha256", "drafter_sha256", "prompts_sha256", "num_prompts", "k", "max_tokens")
    m["reference"] = [r for r in m.get("reference", []) if not all(r.get("key", {}).get(f) == key.get(f) for f in fields)]
    rec = {"key": key, "metrics": metrics}
    if extra:
        rec.update(extra)
    m["reference"].append(rec)
    atomic_write_text(Path(folder) / MANIFEST_NAME, json.dumps(m, indent=2) + "\n", mode=0o644)
    return m


def load_drafter(folder: Path, target, device: str = "cpu", check_target_dir: Path | None = None):
    """An Eagle3Drafter from an exported folder, with the target's embeddings; (drafter, manifest)."""
    import torch
    from safetensors.torch import load_file
    from speclock.drafter.eagle3 import DrafterConfig, Eagle3Drafter

    folder = Path(folder)
    manifest = read_manifest(folder)
    if check_target_dir is not None:
        check_manifest_matches_target(manifest, check_target_dir, target.config)
    cfg_path = folder / "config.json"
    hint = "export the drafter again with `speclock train export` (or restore the folder from git)"
    cfg = read_json(cfg_path, what="drafter config", hint=hint)
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "vocab_size", "draft_vocab_size"):
        if key not in cfg:
            raise BadInput(f"{cfg_path}: no key {key!r}", hint=hint)
        if expect(cfg[key], int, f"key {key!r}", path=cfg_path, hint=hint) < 1:
            raise BadInput(f"{cfg_path}: key {key!r} is {cfg[key]}, where a positive integer belongs", hint=hint)
    for key in ("rms_norm_eps", "rope_theta"):
        if key not in cfg:
            raise BadInput(f"{cfg_path}: no key {key!r}", hint=hint)
        if expect(cfg[key], float, f"key {key!r}", path=cfg_path, hint=hint) <= 0:
            raise BadInput(f"{cfg_path}: key {key!r} is {cfg[key]}, where a positive number belongs", hint=hint)
    if "max_position_embeddings" in cfg:
        expect(cfg["max_position_embeddings"], int, "key 'max_position_embeddings'", path=cfg_path, hint=hint)
    dcfg = DrafterConfig(hidden_size=cfg["hidden_size"], num_attention_heads=cfg["num_attention_heads"],
                         num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
                         intermediate_size=cfg["intermediate_size"], rms_norm_eps=cfg["rms_norm_eps"],
                         rope_theta=cfg["rope_theta"], vocab_size=cfg["vocab_size"], draft_vocab_size=cfg["draft_vocab_size"],
                         max_position_embeddings=cfg.get("max_position_embeddings", 8192))
    drafter = Eagle3Drafter(dcfg)
    tensors = load_file(str(folder / "model.safetensors"))
    missing, unexpected = drafter.load_state_dict(tensors, strict=False)
    if [m for m in missing if m != "embed_tokens"] or unexpected:
        raise BadInput(f"{folder}/model.safetensors does not match the EAGLE-3 layout (missing {missing}, unexpected {unexpected})")
    dtype = next(target.parameters()).dtype
    drafter = drafter.to(device=device, dtype=dtype)
    drafter.d2t = tensors["d2t"].to(device)
    drafter.t2d = tensors["t2d"].to(device)
    drafter.embed_tokens = target.get_input_embeddings().weight.detach().to(device, dtype)
    return drafter.eval(), manifest


