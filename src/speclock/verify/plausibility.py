"""What a run of a report's shape can produce: rules a forged or relabelled report breaks even when its numbers
agree with each other (issue #26). Each refusal is BadInput (exit 2) naming the key.

Without the stack (validate_report runs these on every report read):
  - counters bounded by the run's size: each draft step emits at least one token, so per pass num_drafts <=
    prompts x max_tokens, and emitted tokens (drafts + accepted) <= prompts x (max_tokens + k) (vLLM counts
    drafts accepted past max_tokens, so up to k over);
  - per-position acceptance of a chain draft (top-k 1, what both engines run) never rises: a draft at position
    i + 1 is accepted only after the one at i;
  - the profile's own evidence: a sampled report compares no outputs, so lossless mismatches in one are a greedy
    run relabelled to skip the lossless check;
  - the speedup is the report's own tok/s ratio.
With the stack (the gate, once it knows which stack judges):
  - a GPU stack's report names the GPU it ran on (smoke records torch's device name, driver and CUDA) at one of
    the stack's archs; a CPU stack's report names none;
  - an image the report names is an image of that stack (speclock tags images `speclock-<stack>:<inputs hash>`).
A self-consistent forgery of all of these is still possible: docs/reliability.md says which forgeries a signed
attestation would stop and which nothing in a report can.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from speclock.core.errors import BadInput
from speclock.spec.stack import Stack
from speclock.verify.report_types import GpuInfo, ProfileRecord, SmokeReport

Bad = Callable[[str, str], BadInput]
_IMAGE_NAME = re.compile(r"(?:^|/)speclock-([A-Za-z0-9][A-Za-z0-9._-]*):[^/]+$")


def _passes(report: SmokeReport) -> int:
    """Engine passes summed into `metrics`: one, or one per seed of a sampled run."""
    sampled = report.get("sampled")
    per_seed = sampled.get("per_seed") if isinstance(sampled, dict) else None
    return max(1, len(per_seed)) if isinstance(per_seed, list) else 1


def check_counters_bounded(report: SmokeReport, bad: Bad) -> None:
    count, k = report["prompts"]["count"], report["num_speculative_tokens"]
    max_tokens = report.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or count <= 0:
        return
    passes = _passes(report)
    metrics = [("metrics", report["metrics"])] + [
        (f"attention_backends[{i}].metrics", b["metrics"])
        for i, b in enumerate(report.get("attention_backends") or [])
        if isinstance(b, dict) and isinstance(b.get("metrics"), dict)
    ]
    for where, m in metrics:
        steps, accepted = m["num_drafts"], m["num_accepted_tokens"]
        most_steps = count * max_tokens * passes
        if steps > most_steps:
            raise bad(
                f"{where}.num_drafts",
                f"{steps} draft steps, but {count} prompts x {max_tokens} tokens"
                f"{f' x {passes} seeds' if passes > 1 else ''} allow at most {most_steps} "
                "(each step emits at least one token)",
            )
        most_tokens = count * (max_tokens + k) * passes
        if steps + accepted > most_tokens:
            raise bad(
                f"{where}.num_accepted_tokens",
                f"{steps} steps + {accepted} accepted tokens emit more than the "
                f"{most_tokens} tokens {count} prompts x (max_tokens {max_tokens} "
                f"+ k {k}) can hold",
            )
        per_pos = m["accepted_per_position"]
        for i in range(1, len(per_pos)):
            if per_pos[i] > per_pos[i - 1]:
                raise bad(
                    f"{where}.accepted_per_position[{i}]",
                    f"{per_pos[i]} acceptances at position {i + 1} exceed the {per_pos[i - 1]} at position {i}: in "
                    "a chain draft a token is accepted only after the one before it",
                )


def check_profile_evidence(report: SmokeReport, bad: Bad) -> None:
    found = report.get("profile")
    profile: ProfileRecord | dict[str, Any] = found if isinstance(found, dict) else {}
    if profile.get("name") == "sampled" and (report["lossless"].get("mismatches") or 0) > 0:
        raise bad(
            "profile.name",
            f"'sampled', but lossless.mismatches is {report['lossless']['mismatches']}: a sampled "
            "run compares no outputs token for token, so these come from a greedy run, whose "
            "lossless check a relabelled profile would skip",
        )


def check_speedup_is_its_ratio(report: SmokeReport, bad: Bad) -> None:
    tp = report["throughput"]
    base, spec, speedup = tp.get("baseline_tok_s"), tp.get("spec_tok_s"), tp.get("speedup")
    if base is None or spec is None or speedup is None:  # not measured (the contract's types are checked already)
        return
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (base, spec, speedup)) or base <= 0:
        return
    want = spec / base
    # tok/s are written to 2 decimals and the speedup to 4: a few 1e-4 of rounding, never more
    if not math.isclose(speedup, want, rel_tol=5e-3, abs_tol=2e-3):
        raise bad("throughput.speedup", f"{speedup} is not throughput.spec_tok_s / baseline_tok_s = {spec} / {base} = {want:.4f}")


def check_without_stack(report: SmokeReport, bad: Bad) -> None:
    check_counters_bounded(report, bad)
    check_profile_evidence(report, bad)
    check_speedup_is_its_ratio(report, bad)


def check_against_stack(report: SmokeReport, stack: Stack, report_source: str = "the report") -> None:
    """The report ran where its stack runs: on a GPU of the stack's archs for a GPU stack, on no GPU for a CPU stack;
    and in an image of that stack, where it names one."""

    def bad(key: str, problem: str) -> BadInput:
        return BadInput(
            f"{report_source}: key '{key}': {problem}",
            hint=f"judge a report with the stack it ran with (`--stack`); a report of stack {stack.name} "
            "comes from `speclock smoke` in that stack's image or host environment",
        )

    found = report.get("gpu")
    gpu: GpuInfo = found if isinstance(found, dict) else {}
    completed = bool(report.get("run", {}).get("completed"))
    if stack.is_gpu and completed and not gpu.get("name") and gpu.get("arch") not in stack.gpu["archs"]:
        # gpu.arch is what smoke saw (None without a GPU); a report with a GPU arch of the stack but no gpu.name was
        # written before smoke named the GPU (2026-12-06): accepted, and the gate says what it cannot show
        raise bad(
            "gpu.name",
            f"missing, but stack {stack.name} runs on a GPU ({', '.join(stack.gpu['archs'])}): smoke "
            "records the GPU it ran on (gpu.name, and gpu.arch since 2026-12-05), so this report came from a run "
            "without one",
        )
    if not stack.is_gpu and gpu.get("name"):
        raise bad("gpu.name", f"{gpu['name']!r}, but stack {stack.name} is a CPU stack")
    arch = gpu.get("arch")
    if stack.is_gpu and completed and arch and stack.gpu["archs"] and arch not in stack.gpu["archs"]:
        raise bad("gpu.arch", f"{arch!r} is not one of stack {stack.name}'s gpu.archs ({', '.join(stack.gpu['archs'])})")
    image = report.get("image")
    ref = (image.get("ref") if image else None) or ""
    m = _IMAGE_NAME.search(ref)
    if m and m[1] != stack.name:
        raise bad("image.ref", f"{ref!r} is an image of stack {m[1]!r}, not of {stack.name!r}")
