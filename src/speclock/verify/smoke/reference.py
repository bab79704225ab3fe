"""Smoke's reference: speclock's own decoder's acceptance on the same drafter and prompts, recorded in the
drafter's manifest (looked up by key) or run live, and the report's reference section with the gap."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from speclock.core.files import expect, read_json
from speclock.drafter.manifest import load_drafter
from speclock.drafter.models import DRAFT_MANIFEST, check_drafter_manifest, check_reference_record, read_drafter_manifest
from speclock.drafter.models import target_sha256 as weights_sha256
from speclock.drafter.reference import load_target, run_reference
from speclock.spec.prompts import prompts_sha256
from speclock.verify.report_types import Metrics, ReferenceMetrics, ReferenceSection, ReportReferenceKey
from speclock.verify.smoke.inputs import SmokeInputs, log

MANIFEST = DRAFT_MANIFEST


def reference_key(inp: SmokeInputs, texts: list[str]) -> ReportReferenceKey:
    # Tensors only (config excluded): a drafter keeps its identity when only its config changes,
    # so a recorded reference still judges an engine that is fed the wrong layers.

    return {
        "target_sha256": weights_sha256(inp.target),
        "drafter_sha256": weights_sha256(inp.draft),
        "prompts_sha256": prompts_sha256(texts),
        "num_prompts": len(texts),
        "k": inp.k,
        "max_tokens": inp.max_tokens,
    }


REFERENCE_KEY_FIELDS = ("target_sha256", "drafter_sha256", "prompts_sha256", "num_prompts", "k", "max_tokens")


def lookup_recorded(manifest_path: Path, key: Mapping[str, Any]) -> dict[str, Any] | None:
    """The recorded reference metrics for `key` in a drafter manifest, or None.

    Every record is checked first (speclock.drafter.models.check_reference_record): a record of the wrong
    shape is BadInput naming the manifest and the key, never a crash and never a match. A match
    needs all six key fields equal with equal JSON types (3 is not "3", 1 is not true).
    """
    if not manifest_path.exists() and not manifest_path.is_symlink():
        return None
    manifest = read_drafter_manifest(manifest_path.parent) if manifest_path.name == DRAFT_MANIFEST else None
    if manifest is None:  # a manifest under another name (tests, tools): read and check it the same way
        manifest = check_drafter_manifest(read_json(manifest_path, what="drafter manifest"), manifest_path)
    found = None
    for i, rec in enumerate(manifest.get("reference") or []):
        check_reference_record(rec, f"reference[{i}]", manifest_path)
        rkey = rec["key"]
        if all(type(rkey.get(f)) is type(key.get(f)) and rkey.get(f) == key.get(f) for f in REFERENCE_KEY_FIELDS):
            found = rec["metrics"]  # the last record for a key wins (record_reference replaces in place)
    return found


def run_live_reference(inp: SmokeInputs, prompt_ids: list[list[int]]) -> dict[str, Any]:
    """speclock's own speculative decoder (training branch) on the same drafter and prompts; slow on a CPU.

    It feeds the drafter the layers recorded in its manifest (`aux_layers_after`, what it was trained
    on), not the config's ids: that is what makes it an independent judge of the engine's wiring.
    """
    target, tokenizer = load_target(inp.target)
    drafter, manifest = load_drafter(inp.draft, target)
    done = [0]

    def progress(i: int, n: int, metrics: Mapping[str, Any]) -> None:  # counters.reference_metrics()
        if i == n or i - done[0] >= 10:
            done[0] = i
            log(f"reference: {i}/{n} prompts, mean acceptance length so far {metrics['mean_acceptance_length']:.3f}")

    run = run_reference(
        target, tokenizer, drafter, manifest["aux_layers_after"], prompt_ids, inp.k, inp.max_tokens, progress=progress
    )
    return run.metrics


def reference_section(
    inp: SmokeInputs, texts: list[str], prompt_ids: list[list[int]], engine_metrics: Metrics | None
) -> ReferenceSection:
    key = reference_key(inp, texts)
    section: ReferenceSection = {"status": "not computed", "key": key, "metrics": None, "gap": None, "note": ""}
    if inp.reference == "off":
        section["note"] = "reference comparison turned off (--reference off)"
        return section
    metrics = lookup_recorded(inp.draft / MANIFEST, key)
    if metrics is not None:
        # the drafter manifest's record (checked there); the report's model checks it again with the report
        section["status"], section["metrics"] = "recorded", cast(ReferenceMetrics, metrics)
    elif inp.reference == "live":
        log(f"running the reference decoder live on {len(prompt_ids)} prompts (slow on a CPU)")
        metrics = run_live_reference(inp, prompt_ids)
        section["status"], section["metrics"] = "live", cast(ReferenceMetrics, metrics)
    else:
        section["note"] = (
            f"no reference recorded in {inp.draft / MANIFEST} for this (target, drafter, prompts, k, max_tokens); "
            "run with --reference live, or record one with the training tools"
        )
        return section
    if engine_metrics is not None:
        ref_len = float(
            expect(
                metrics.get("mean_acceptance_length"),
                float,
                "reference metrics mean_acceptance_length",
                path=inp.draft / MANIFEST,
            )
        )
        section["gap"] = abs(ref_len - engine_metrics["mean_acceptance_length"]) / ref_len if ref_len else None
    return section
