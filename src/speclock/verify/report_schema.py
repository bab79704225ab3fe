"""The smoke report's contract as data: each key's JSON type (docs/smoke.md), kept apart from the code that checks it,
and when smoke began to write the keys that came after the schema's first day."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any

SCHEMA_ID = "speclock.smoke/v1"

# When smoke began to write a key (UTC, the time of the commit that added it): a report created before then lacks it
# because it could not have it, and is judged with a WARN saying what it cannot show; a newer report without it is
# refused naming the key (a missing key never switches a rule off). The keys smoke wrote from its first day
# (4290442, 2026-12-02T11:17:57Z) are REQUIRED below.
GPU_ARCH_SINCE = "2026-12-02T12:29:52Z"  # 135bc69: gpu.arch, the arch smoke saw (null without a GPU)
PROFILE_SINCE = "2026-12-05T05:50:22Z"  # eb1d048: profile {name, temperature, seeds, num_prompts, max_tokens}
BATCH1_SINCE = "2026-12-06T18:49:01Z"  # 89a9f2f: batch-1 speed (throughput.batch1)
GPU_NAME_SINCE = BATCH1_SINCE  # 89a9f2f too: gpu.name, driver, cuda (torch's device name, in the engine's process)
LOADED_SINCE = "2026-12-07T12:30:00Z"  # speed under load (throughput.loaded)


def predates(report: Mapping[str, Any], since: str) -> bool:
    """The report was created before `since` (both ISO 8601 UTC, compared as instants); a report without a valid
    `created` is taken as new (held to every rule)."""
    try:
        created = _dt.datetime.fromisoformat(str(report.get("created") or "").replace("Z", "+00:00"))
        return created < _dt.datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        return False


NUM = (int, float)
NONE = type(None)
# Required keys: dotted path -> allowed types (None as a type = JSON null allowed).
REQUIRED: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "stack": (str,),
    "image": (dict,),
    "image.ref": (str,),
    "image.digest": (str,),
    "engine": (dict,),
    "engine.name": (str,),
    "engine.version": (str,),
    "target": (dict,),
    "target.path": (str,),
    "target.arch": (str,),
    "draft": (dict,),
    "draft.path": (str,),
    "draft.aux_layer_ids": (list,),
    "draft.captured_layers": (list, NONE),
    "num_speculative_tokens": (int,),
    # the run's size bounds its counters (speclock.verify.plausibility), and whether it completed decides which
    # rules apply: both written from smoke's first day, so never optional
    "max_tokens": (int,),
    "run": (dict,),
    "run.completed": (bool,),
    "prompts": (dict,),
    "prompts.source": (str,),
    "prompts.count": (int,),
    "metrics": (dict,),
    "metrics.num_drafts": (int,),
    "metrics.num_draft_tokens": (int,),
    "metrics.num_accepted_tokens": (int,),
    "metrics.accepted_per_position": (list,),
    "metrics.acceptance_rate": NUM,
    "metrics.mean_acceptance_length": NUM,
    "throughput": (dict,),
    "throughput.baseline_tok_s": NUM + (NONE,),
    "throughput.spec_tok_s": NUM + (NONE,),
    "throughput.speedup": NUM + (NONE,),
    "lossless": (dict,),
    "lossless.checked": (int,),
    "lossless.mismatches": (int,),
    "verdict": (str,),
    "failures": (list,),
}
# Keys `speclock smoke` writes that older reports may lack; when present the gate, the table or the
# baseline comparison reads them, so their type is checked like a required key's.
OPTIONAL: dict[str, tuple[type, ...]] = {
    "created": (str,),
    "engine.package": (str,),
    "engine.pinned_version": (str,),
    "metrics.acceptance_per_position": (list,),
    "lossless.numeric_ties": (int,),
    "run.id": (str,),
    "run.error": (str, NONE),
    "run.stage": (str,),
    "reference": (dict, NONE),
    "reference.status": (str,),
    "reference.note": (str,),
    "reference.gap": NUM + (NONE,),
    "reference.metrics": (dict, NONE),
    "reference.key": (dict, NONE),
    "reference.key.target_sha256": (str,),
    "reference.key.drafter_sha256": (str,),
    "reference.key.prompts_sha256": (str,),
    "reference.key.num_prompts": (int,),
    "reference.key.k": (int,),
    "reference.key.max_tokens": (int,),
    # smoke profiles (speclock.verify.profiles); a report without `profile` is a quick (greedy) one
    "profile": (dict,),
    "profile.name": (str,),
    "profile.temperature": NUM,
    "profile.seeds": (list,),
    "profile.num_prompts": (int,),
    "profile.max_tokens": (int,),
    "lossless.mode": (str,),
    "sampled": (dict,),
    "sampled.temperature": NUM,
    "sampled.per_seed": (list,),
    "attention_backends": (list,),
    # speed (speclock.verify.speed): `speedup` is the batch-1 one when measured_at is "batch 1"
    "throughput.measured_at": (str, NONE),
    "throughput.note": (str,),
    "throughput.batch1": (dict, NONE),
    "throughput.batch1.prompts": (int,),
    "throughput.batch1.max_tokens": (int,),
    "throughput.batch1.repeats": (int,),
    "throughput.batch1.plain_before_tok_s": (list,),
    "throughput.batch1.spec_tok_s": (list,),
    "throughput.batch1.plain_after_tok_s": (list,),
    "throughput.batch1.speedup": NUM,
    "throughput.batch1.speedup_low": NUM,
    "throughput.batch1.speedup_high": NUM,
    "throughput.batch1.spread": NUM + (NONE,),
    "throughput.batch1.interval_method": (str,),
    "throughput.batch1.warmup_tok_s": (dict,),
    "throughput.batch1.warmup_tok_s.plain_before": (list,),
    "throughput.batch1.warmup_tok_s.spec": (list,),
    "throughput.batch1.warmup_tok_s.plain_after": (list,),
    "throughput.batch1.steady": (dict,),
    "throughput.batch1.steady.plain_before": (bool,),
    "throughput.batch1.steady.spec": (bool,),
    "throughput.batch1.steady.plain_after": (bool,),
    "throughput.loaded": (dict, NONE),
    "throughput.loaded.prompts": (int,),
    "throughput.loaded.max_tokens": (int,),
    "throughput.loaded.repeats": (int,),
    "throughput.loaded.plain_before_tok_s": (list,),
    "throughput.loaded.spec_tok_s": (list,),
    "throughput.loaded.plain_after_tok_s": (list,),
    "throughput.loaded.speedup": NUM,
    "throughput.loaded.speedup_low": NUM,
    "throughput.loaded.speedup_high": NUM,
    "throughput.loaded.spread": NUM + (NONE,),
    "throughput.loaded.interval_method": (str,),
    "throughput.loaded.requests": (int,),
    "throughput.loaded.batches_per_run_min": (int,),
    "throughput.loaded.warmup_tok_s": (dict,),
    "throughput.loaded.steady": (dict,),
    "throughput.concurrent": (dict,),
    "gpu": (dict,),
    "gpu.name": (str,),
    "gpu.driver": (str,),
    "gpu.cuda": (str,),
    "warnings": (list,),
    # the served model against the lock's identity (verify.model_pin): stacks with target.path or an absolute draft.path
    "target.identity": (dict,),
    "target.identity.pinned": (bool,),
    "target.identity.matches": (bool, NONE),
    "target.identity.allowed_other": (bool,),
    "target.identity.differs": (list,),
    "target.identity.note": (str,),
    "draft.identity": (dict,),
    "draft.identity.pinned": (bool,),
    "draft.identity.matches": (bool, NONE),
    "draft.identity.allowed_other": (bool,),
    "draft.identity.differs": (list,),
    "draft.identity.note": (str,),
}
