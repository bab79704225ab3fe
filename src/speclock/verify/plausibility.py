"""What a run of a report's shape can produce: rules a forged or relabelled report breaks even when its numbers
agree with each other (issue #26). Each refusal is BadInput (exit 2) naming the key.

Every key a rule reads is required for the report's schema version (the model, verify.report_types, requires
the keys smoke wrote from its first day; a key that came later, speclock.verify.report_dates, is required of
reports created since, and an older report without it is judged with a WARN saying what it cannot show). A
missing or null key is a refusal naming it, never a skipped rule.

Without the stack (validate_report runs these on every report read):
  - counters bounded by the run's size: each draft step emits at least one token, so per pass num_drafts <=
    prompts x max_tokens, and emitted tokens (drafts + accepted) <= prompts x (max_tokens + k) (vLLM counts
    drafts accepted past max_tokens, so up to k over); the passes are the profile's: one greedy pass, or one per
    seed of profile.seeds in a sampled run (whose sampled.per_seed holds exactly that many);
  - the profile record is the run's: profile.max_tokens is max_tokens, prompts.count is at most profile.num_prompts;
  - per-position acceptance of a chain draft (top-k 1, what both engines run) never rises: a draft at position
    i + 1 is accepted only after the one at i. This holds wherever per-position figures appear: metrics, each
    sampled.per_seed entry, each attention backend's (and its seeds'), and the reference decoder's;
  - the profile's own evidence: a sampled report compares no outputs, so lossless mismatches in one are a greedy
    run relabelled to skip the lossless check;
  - the speedup is the report's own tok/s ratio.
With the stack (the gate, once it knows which stack judges):
  - a GPU stack's completed report names the GPU it ran on (smoke records torch's device name, driver and CUDA)
    at one of the stack's archs; a CPU stack's report names none (gpu.arch null, no gpu.name);
  - an image the report names is an image of that stack (speclock tags images `speclock-<stack>:<inputs hash>`;
    the name is read in every form of a reference: with a registry and namespace, by tag, by digest or both, and
    a host environment's `host-env:<stack>/...`).
A self-consistent forgery of all of these is still possible: docs/reliability.md says which forgeries a signed
attestation would stop and which nothing in a report can.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from speclock.core.errors import BadInput
from speclock.spec.stack import Stack
from speclock.verify.report_dates import GPU_ARCH_SINCE, GPU_NAME_SINCE, PROFILE_SINCE, predates
from speclock.verify.report_types import GpuInfo, ProfileRecord, SmokeReport

Bad = Callable[[str, str], BadInput]


def is_sampled(report: SmokeReport) -> bool:
    """A sampled-profile report (validate_report has tied profile.name to profile.temperature > 0)."""
    prof = report.get("profile")
    return isinstance(prof, dict) and prof.get("name") == "sampled"


def passes_of(report: SmokeReport) -> int:
    """Engine passes summed into `metrics`: one greedy pass, or one per seed the sampled profile names. Taken from the
    profile that produced the counters, never from how many per-seed entries the report happens to list."""
    if not is_sampled(report):
        return 1
    return len(report["profile"]["seeds"])  # required of a sampled profile (check_profile_counts)


def check_profile_counts(report: SmokeReport, bad: Bad) -> None:
    """The counts the profile fixes: a sampled profile names its seeds, and each `sampled` section holds exactly one
    counters entry per seed; a greedy report has no `sampled` section (its per-seed entries would multiply the
    counter bounds); the profile record is the run's own (max_tokens, prompt count)."""
    prof = report.get("profile")
    if prof is None and not predates(report, PROFILE_SINCE):
        raise bad("profile", f"missing: smoke records the profile it ran since {PROFILE_SINCE}")
    if prof is not None:
        # dated before profiles existed, a record was added by hand: judged by what it gives, but a sampled one
        # still names its seeds (the bound multiplies by them)
        old = predates(report, PROFILE_SINCE)
        for key in ("temperature", "seeds", "num_prompts", "max_tokens"):
            if prof.get(key) is None and (not old or (key == "seeds" and is_sampled(report))):
                raise bad(f"profile.{key}", f"missing: smoke records the profile's {key} since {PROFILE_SINCE}")
        if prof.get("max_tokens") is not None and prof["max_tokens"] != report["max_tokens"]:
            raise bad("profile.max_tokens", f"{prof['max_tokens']}, but the run's max_tokens is {report['max_tokens']}")
        if prof.get("num_prompts") is not None and report["prompts"]["count"] > prof["num_prompts"]:
            raise bad(
                "prompts.count",
                f"{report['prompts']['count']} prompts, but the profile ran {prof['num_prompts']} (profile.num_prompts)",
            )
    sections: list[tuple[str, Any]] = [("sampled", report.get("sampled"))] + [
        (f"attention_backends[{i}].sampled", b.get("sampled"))
        for i, b in enumerate(report.get("attention_backends") or [])
        if isinstance(b, dict) and "sampled" in b
    ]
    if not is_sampled(report):
        for where, section in sections:
            if section is not None:
                raise bad(where, "a greedy run has no per-seed section (only the sampled profile samples over seeds)")
        return
    seeds = report["profile"]["seeds"]
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise bad("profile.seeds", f"expected a non-empty list of seeds, got {repr(seeds)[:60]}")
    for where, section in sections:
        if section is None:
            continue  # a run that stopped before its passes ended (validate_report requires one of a completed run)
        per_seed = section.get("per_seed") if isinstance(section, dict) else None
        if not isinstance(per_seed, list) or len(per_seed) != len(seeds):
            got = f"{len(per_seed)} entries" if isinstance(per_seed, list) else repr(per_seed)[:40]
            raise bad(f"{where}.per_seed", f"{got}, but profile.seeds names {len(seeds)} seeds: one entry per seed")


def check_counters_bounded(report: SmokeReport, bad: Bad) -> None:
    count, k, max_tokens = report["prompts"]["count"], report["num_speculative_tokens"], report["max_tokens"]
    passes = passes_of(report)
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


def check_chain_positions(per_pos: list[int], where: str, bad: Bad) -> None:
    """A chain draft's per-position acceptance never rises; `where` is the counters' key (metrics, a seed's, ...)."""
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
    figures = {key: tp[key] for key in ("baseline_tok_s", "spec_tok_s", "speedup")}  # their types are checked already
    if all(v is None for v in figures.values()):  # not measured: smoke writes all three null
        return
    for key, value in figures.items():  # smoke writes all three or none: a null one would hide the ratio
        if value is None:
            raise bad(f"throughput.{key}", "null, but the other speed figures are given: smoke writes all three or none")
    base, spec, speedup = (float(v or 0) for v in figures.values())  # each a number here
    if base <= 0:
        raise bad("throughput.baseline_tok_s", f"{base}: a measured speed is above 0 tok/s")
    want = spec / base
    # tok/s are written to 2 decimals and the speedup to 4: a few 1e-4 of rounding, never more
    if not math.isclose(speedup, want, rel_tol=5e-3, abs_tol=2e-3):
        raise bad("throughput.speedup", f"{speedup} is not throughput.spec_tok_s / baseline_tok_s = {spec} / {base} = {want:.4f}")


def check_without_stack(report: SmokeReport, bad: Bad) -> None:
    check_profile_evidence(report, bad)
    check_profile_counts(report, bad)  # before the bounds: they multiply by the profile's passes
    check_counters_bounded(report, bad)
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
    name, arch = gpu.get("name"), gpu.get("arch")
    archs = list(stack.gpu["archs"])
    if stack.is_gpu and report["run"]["completed"]:
        # gpu.arch is what smoke saw: null without a GPU. A key a report could not have (it predates the key) is
        # no refusal: the gate WARNs what the report cannot show (gate.unshown_gpu_checks).
        arch_unknown = "arch" not in gpu and predates(report, GPU_ARCH_SINCE)
        if not name and arch is None and not arch_unknown:
            raise bad(
                "gpu.name",
                f"missing, but stack {stack.name} runs on a GPU ({', '.join(archs)}): smoke records the GPU it ran "
                f"on (gpu.arch since {GPU_ARCH_SINCE}, gpu.name since {GPU_NAME_SINCE}), so this report came from a "
                "run without one",
            )
        if not name and not predates(report, GPU_NAME_SINCE):
            raise bad("gpu.name", f"missing: smoke records the GPU it ran on (torch's device name) since {GPU_NAME_SINCE}")
        if arch is None and not arch_unknown:
            raise bad(
                "gpu.arch",
                f"{'null' if 'arch' in gpu else 'missing'}, but stack {stack.name} runs on a GPU ({', '.join(archs)}): "
                f"smoke records the arch of the GPU it saw since {GPU_ARCH_SINCE} (null: none was visible)",
            )
        if arch is not None and archs and arch not in archs:
            raise bad("gpu.arch", f"{arch!r} is not one of stack {stack.name}'s gpu.archs ({', '.join(archs)})")
    if not stack.is_gpu and name:
        raise bad("gpu.name", f"{name!r}, but stack {stack.name} is a CPU stack")
    if not stack.is_gpu and arch is not None:
        raise bad("gpu.arch", f"{arch!r}, but stack {stack.name} is a CPU stack (smoke records null there)")
    ref = report["image"]["ref"]
    named = image_stack(ref)
    if named is not None and named != stack.name:
        raise bad("image.ref", f"{ref!r} is an image of stack {named!r}, not of {stack.name!r}")


def image_stack(ref: str) -> str | None:
    """The stack an image reference names, in any form a reference takes: `speclock-<stack>` with or without a
    registry (host:port) and namespaces, by tag, by digest or both (`name:tag@sha256:...`, `name@sha256:...`);
    or a host environment's `host-env:<stack>/<target>@lock-...` (and attest's `host-env:<stack>@<host>`).
    None for a reference that names no speclock image: `host`, or a copy pushed under another repository name."""
    if ref.startswith("host-env:"):
        return ref.removeprefix("host-env:").split("/", 1)[0].split("@", 1)[0]
    name = ref.split("@", 1)[0]  # the digest: sha256:<hex> holds a ':' of its own
    repo = name.rsplit("/", 1)[-1].split(":", 1)[0]  # the last path part, less its tag (a registry's port is before a '/')
    return repo.removeprefix("speclock-") if repo.startswith("speclock-") else None
