"""The typed models of speclock's own records (#38, item 1): the host environment's record (host-env.json), the
self-check's record (selfcheck.json), and the lock as doctor reads it (spec.lock_types.LockFile). A bad value names
the file and the dotted key path (exit 2); an unknown key is a WARN (the records) or refused (the lock)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_host_env import host_env_record, host_row

from speclock.build.hostenv.record import read_record
from speclock.core.errors import BadInput
from speclock.verify.doctor.versions import read_doctor_lock
from speclock.verify.selfcheck_record import read_selfcheck

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path, record: dict) -> Path:
    home = tmp_path / "env" / "speclock"
    home.mkdir(parents=True)
    (home / "host-env.json").write_text(json.dumps(record))
    return tmp_path / "env"


# ---------------------------------------------------------------- host-env.json


def test_a_whole_host_env_record_reads_and_an_older_one_without_the_later_keys_too(tmp_path):
    assert read_record(_env(tmp_path / "a", host_env_record()))["stack"] == "x"
    older = host_env_record()
    for key in ("kernels", "pruned_from_host", "target_folder", "draft_folder"):
        del older[key]
    assert read_record(_env(tmp_path / "b", older))["target"] == "x"


@pytest.mark.parametrize(
    "keys, path, words",
    [
        (
            {"version_checked": [host_row("torch", "2.11.0", "2.11.0")] + [{"name": 3}]},
            "version_checked[1].name",
            "expected string, got number (3)",
        ),
        ({"hash_checked": "torch"}, "hash_checked", "expected array of object"),
        ({"engine_env": {"A": 1}}, "engine_env.A", "expected string, got number (1)"),
        ({"target_folder": ["/m"]}, "target_folder", "string or null"),
    ],
)
def test_a_bad_host_env_value_names_the_file_and_the_key_path(tmp_path, keys, path, words):
    env = _env(tmp_path, host_env_record(**keys))
    with pytest.raises(BadInput) as err:
        read_record(env)
    assert str(env / "speclock" / "host-env.json") in err.value.message and f"key '{path}'" in err.value.message
    assert words in err.value.message and err.value.exit_code == 2


def test_a_host_env_record_without_a_key_says_which(tmp_path):
    record = host_env_record()
    del record["lock_sha256"]
    with pytest.raises(BadInput, match=r"host-env.json: key 'lock_sha256': missing \(string belongs there\)"):
        read_record(_env(tmp_path, record))


def test_an_unknown_host_env_key_is_a_warn_naming_it(tmp_path, capsys):
    record = read_record(_env(tmp_path, host_env_record(built_by="a newer speclock")))
    err = capsys.readouterr().err
    assert (
        record["stack"] == "x"
        and err.startswith("WARN: ")
        and "host-env.json: key 'built_by' is not in speclock.host-env/v1" in err
    )


def test_another_documents_schema_is_named_as_such(tmp_path):
    with pytest.raises(BadInput, match="schema is 'speclock.lock/v1', expected 'speclock.host-env/v1'"):
        read_record(_env(tmp_path, host_env_record(schema="speclock.lock/v1")))


# ---------------------------------------------------------------- doctor's lock


def _lock(tmp_path: Path, edit) -> Path:
    lock = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())
    edit(lock)
    path = tmp_path / "lock.json"
    path.write_text(json.dumps(lock))
    return path


def test_doctor_reads_a_real_lock_through_its_model():
    assert read_doctor_lock(ROOT / "locks" / "cpu-vllm.lock")["stack"] == "cpu-vllm"


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda d: d["packages"][1].update(version=2), "packages[1].version is number (2), where string belongs"),
        (lambda d: d["packages"][0].pop("name"), "packages[0]: key 'name' is missing"),
        (lambda d: d.update(excluded=["torchvision"]), "excluded[0] is string ('torchvision'), where object"),
        (lambda d: d.update(packages={}), "packages is object"),
        (lambda d: d.update(pinned_by="hand"), "key 'pinned_by': not a key of speclock.lock/v1"),  # refused, not warned
    ],
)
def test_doctor_refuses_a_lock_that_does_not_fit_its_model_naming_the_key_path(tmp_path, edit, words):
    path = _lock(tmp_path, edit)
    with pytest.raises(BadInput) as err:
        read_doctor_lock(path)
    assert err.value.message.startswith(f"{path}: ") and words in err.value.message and err.value.exit_code == 2


def test_doctor_names_another_document_as_no_lock(tmp_path):
    path = _lock(tmp_path, lambda d: d.update(schema="speclock.lock/v0"))
    with pytest.raises(BadInput, match="not a speclock.lock/v1 lock"):
        read_doctor_lock(path)


# ---------------------------------------------------------------- selfcheck.json


def _selfcheck(tmp_path: Path, **keys) -> Path:
    record = {
        "schema": "speclock.selfcheck/v1",
        "run_id": "0" * 32,
        "stages": {"doctor": {"exit_code": 0, "error": None}, "smoke": {"skipped": True, "note": "no GPU"}},
        "verdict": "smoke-skipped",
    } | keys
    path = tmp_path / "selfcheck.json"
    path.write_text(json.dumps(record))
    return path


def test_a_selfcheck_record_reads_and_one_of_an_older_image_without_schema_too(tmp_path):
    assert read_selfcheck(_selfcheck(tmp_path))["stages"]["smoke"]["note"] == "no GPU"
    older = json.loads(_selfcheck(tmp_path).read_text())
    del older["schema"]
    (tmp_path / "selfcheck.json").write_text(json.dumps(older))
    assert read_selfcheck(tmp_path / "selfcheck.json")["verdict"] == "smoke-skipped"


@pytest.mark.parametrize(
    "keys, words",
    [
        ({"verdict": "PASS"}, 'key \'verdict\': expected "pass" or "fail" or "smoke-skipped", got string (\'PASS\')'),
        ({"stages": {"gate": {"exit_code": "1"}}}, "key 'stages.gate.exit_code': expected integer or null, got string ('1')"),
        ({"stages": {"smoke": {"failures": [1]}}}, "key 'stages.smoke.failures[0]': expected string"),
        ({"exit_code": True}, "key 'exit_code': expected integer, got boolean"),
        ({"run_id": None}, "key 'run_id': expected string, got null"),
    ],
)
def test_a_bad_selfcheck_value_names_the_file_and_the_key_path(tmp_path, keys, words):
    path = _selfcheck(tmp_path, **keys)
    with pytest.raises(BadInput) as err:
        read_selfcheck(path)
    assert err.value.message.startswith(f"{path}: ") and words in err.value.message and err.value.exit_code == 2


def test_an_unknown_selfcheck_key_is_a_warn_naming_it(tmp_path, capsys):
    record = read_selfcheck(_selfcheck(tmp_path, stages={"soak": {"exit_code": 0}}, took_s=3))
    err = capsys.readouterr().err
    assert record["verdict"] == "smoke-skipped"
    assert "key 'stages.soak' is not in speclock.selfcheck/v1" in err and "key 'took_s' is not in" in err
