"""A drafter folder's speclock manifest (read and checked by drafter.models.read_drafter_manifest): matched against its target, reference
records keyed by (target, drafter, prompts, k, max_tokens); and the drafter loaded back for decoding.

Written by train/export (training makes drafters); read by verify/ (smoke) and the reference engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import atomic_write_text, expect, read_json
from speclock.drafter.manifest_types import ReferenceKey as ReferenceKey  # the model's (verify/, train/ import it here)
from speclock.drafter.models import DRAFT_MANIFEST, read_drafter_manifest, target_sha256
from speclock.spec.prompts import prompts_sha256

if TYPE_CHECKING:
    from speclock.drafter.eagle3 import Eagle3Drafter  # imports torch


# --- the manifest as train/export writes it, every key (what a reader takes: drafter.manifest_types.ManifestDoc) ---
class ManifestTarget(TypedDict):
    name: str
    sha256: str
    sha256_of: str
    architecture: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int


class DrafterManifest(TypedDict):
    schema: str
    target: ManifestTarget
    aux_layers_after: list[int]
    aux_layers_meaning: str
    engine_layer_ids: dict[str, list[int]]
    draft_vocab_size: int
    data: dict[str, Any]
    training: dict[str, Any]
    reference: list[dict[str, Any]]  # {"key": ReferenceKey, "metrics": {...}, "run"?: {...}}
    drafter_sha256: NotRequired[str]  # added per folder, over that folder's tensors


def drafter_sha256(folder: Path) -> str:
    """Identity of a drafter: its tensors (as target_sha256 hashes a target's)."""
    return target_sha256(folder)


# --- manifest: matching the target, reference records (read and checked by drafter.models) -----
def check_manifest_matches_target(manifest: Mapping[str, Any], target_dir: Path, target_config: Any = None) -> None:
    """The drafter was trained on this target: same weights hash and shape; raises CheckFailed if not."""
    t = manifest.get("target") or {}
    missing = [k for k in ("name", "sha256", "num_hidden_layers", "hidden_size", "vocab_size") if k not in t]
    if missing:
        raise BadInput(
            f"the drafter manifest has no target {', '.join(missing)} (key 'target')",
            hint="export the drafter again with `speclock train export`",
        )
    sha = target_sha256(target_dir)
    if sha != t["sha256"]:
        raise CheckFailed(
            f"the drafter was trained on target {t['name']} (weights sha256 {t['sha256'][:16]}...), "
            f"but {target_dir} has weights sha256 {sha[:16]}...",
            hint="use the target the drafter was trained on, or retrain the drafter for this target",
        )
    if target_config is not None:
        for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
            if getattr(target_config, key) != t[key]:
                raise CheckFailed(f"drafter manifest says target {key}={t[key]}, {target_dir} has {getattr(target_config, key)}")


def reference_key(target_sha: str, drafter_sha: str, prompts: list[str], k: int, max_tokens: int) -> ReferenceKey:
    return {
        "target_sha256": target_sha,
        "drafter_sha256": drafter_sha,
        "prompts_sha256": prompts_sha256(prompts),
        "num_prompts": len(prompts),
        "k": k,
        "max_tokens": max_tokens,
    }


def lookup_reference(manifest: Mapping[str, Any], key: Mapping[str, Any]) -> dict[str, Any] | None:
    """The recorded reference-decoder metrics for exactly this key, or None."""
    fields = ("target_sha256", "drafter_sha256", "prompts_sha256", "num_prompts", "k", "max_tokens")
    records = manifest.get("reference", [])
    for rec in records if isinstance(records, list) else []:
        # A record of the wrong shape never matches (smoke refuses such a manifest through speclock.drafter.models).
        if (
            isinstance(rec, dict)
            and isinstance(rec.get("key"), dict)
            and isinstance(rec.get("metrics"), dict)
            and all(rec["key"].get(f) == key.get(f) for f in fields)
        ):
            return rec["metrics"]
    return None


def record_reference(
    folder: str | os.PathLike, key: ReferenceKey, metrics: dict[str, Any], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Add or replace the record for `key` in the folder's manifest (atomic rewrite)."""
    m = read_drafter_manifest(folder, required=True, strict_schema=True)
    fields = ("target_sha256", "drafter_sha256", "prompts_sha256", "num_prompts", "k", "max_tokens")
    m["reference"] = [r for r in m.get("reference", []) if not all(r.get("key", {}).get(f) == key.get(f) for f in fields)]
    rec: dict[str, Any] = {"key": key, "metrics": metrics}
    if extra:
        rec.update(extra)
    m["reference"].append(rec)
    atomic_write_text(Path(folder) / DRAFT_MANIFEST, json.dumps(m, indent=2) + "\n", mode=0o644)
    return m


def load_drafter(
    folder: str | os.PathLike, target: Any, device: str = "cpu", check_target_dir: Path | None = None
) -> tuple[Eagle3Drafter, dict[str, Any]]:
    """An Eagle3Drafter from an exported folder, with the target's embeddings; (drafter, manifest)."""
    from safetensors.torch import load_file  # heavy: optional dependency (with torch)

    from speclock.drafter.eagle3 import DrafterConfig, Eagle3Drafter  # imports torch

    folder = Path(folder)
    manifest = read_drafter_manifest(folder, required=True, strict_schema=True)
    if check_target_dir is not None:
        check_manifest_matches_target(manifest, check_target_dir, target.config)
    cfg_path = folder / "config.json"
    hint = "export the drafter again with `speclock train export` (or restore the folder from git)"
    cfg = read_json(cfg_path, what="drafter config", hint=hint)
    for key in (
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "draft_vocab_size",
    ):
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
    dcfg = DrafterConfig(
        hidden_size=cfg["hidden_size"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"],
        vocab_size=cfg["vocab_size"],
        draft_vocab_size=cfg["draft_vocab_size"],
        max_position_embeddings=cfg.get("max_position_embeddings", 8192),
    )
    drafter = Eagle3Drafter(dcfg)
    tensors = load_file(str(folder / "model.safetensors"))
    missing, unexpected = drafter.load_state_dict(tensors, strict=False)
    if [m for m in missing if m != "embed_tokens"] or unexpected:
        raise BadInput(
            f"{folder}/model.safetensors does not match the EAGLE-3 layout (missing {missing}, unexpected {unexpected})"
        )
    dtype = next(target.parameters()).dtype
    drafter = drafter.to(device=device, dtype=dtype)
    drafter.d2t = tensors["d2t"].to(device)
    drafter.t2d = tensors["t2d"].to(device)
    drafter.embed_tokens = target.get_input_embeddings().weight.detach().to(device, dtype)
    return drafter.eval(), manifest
