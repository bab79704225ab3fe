"""The report contract: what a valid speclock.smoke/v1 report is, and errors that name the key."""

import json

import pytest
from smoke_faults import sample_report

from speclock.core.errors import BadInput
from speclock.verify.report import human_table, load_report, validate_report, write_report


def test_the_sample_report_is_valid_and_round_trips(tmp_path):
    path = write_report(tmp_path / "r.json", sample_report())
    assert load_report(path)["metrics"]["mean_acceptance_length"] == 2.2
    assert not list(tmp_path.glob(".r.json.*")), "no temp file left behind"


@pytest.mark.parametrize(
    "key",
    [
        "stack",
        "engine.version",
        "draft.captured_layers",
        "metrics.accepted_per_position",
        "throughput.speedup",
        "lossless.mismatches",
        "failures",
    ],
)
def test_a_missing_key_is_named(key):
    r = sample_report()
    node = r
    *parents, last = key.split(".")
    for p in parents:
        node = node[p]
    del node[last]
    with pytest.raises(BadInput, match=f"key '{key}': missing"):
        validate_report(r)


def test_wrong_types_and_values_are_named():
    with pytest.raises(BadInput, match="'metrics.acceptance_rate': expected"):
        validate_report(sample_report(metrics__acceptance_rate="high"))
    with pytest.raises(BadInput, match="'schema'"):
        validate_report(sample_report(schema="speclock.smoke/v0"))
    with pytest.raises(BadInput, match="'verdict'"):
        validate_report(sample_report(verdict="ok"))
    with pytest.raises(BadInput, match="num_accepted_tokens"):
        validate_report(sample_report(metrics__num_accepted_tokens=5000))
    with pytest.raises(BadInput, match="'pass' with 1 failures"):
        validate_report(sample_report(failures=["x"]))


def test_not_json_and_missing_files_are_bad_input(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        load_report(tmp_path / "x.json")
    with pytest.raises(BadInput, match="no report file"):
        load_report(tmp_path / "absent.json")
    (tmp_path / "list.json").write_text(json.dumps([1]))
    with pytest.raises(BadInput, match="not a JSON object"):
        load_report(tmp_path / "list.json")


def test_the_human_table_shows_verdict_and_failures():
    text = human_table(sample_report(verdict="fail", failures=["mean acceptance length: 1.0 (limit >= 2.0)"]))
    assert "FAIL" in text and "limit >= 2.0" in text and "2.200" in text
