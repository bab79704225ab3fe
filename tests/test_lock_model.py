"""The lock's typed model (#38 items 1-2): spec.lock_types.LockFile is the one contract of a lock file.

read_lock validates against it (errors naming the file and the dotted key path, exit 2), schemas/lock.schema.json is
generated from it (tests/test_doc_models.py checks the committed file), and every committed lock validates with
speclock and with the schema alone. A key the model does not know is refused.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from fetch_server import copy_committed_lock, seal
from fuzz_support import assert_clean_refusal, run_cli

from speclock.core.errors import BadInput
from speclock.spec.lock import LOCK, read_lock

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted([*ROOT.glob("locks/*.lock"), *ROOT.glob("docs/**/*.lock")])
SCHEMA = json.loads((ROOT / "schemas" / "lock.schema.json").read_text())


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))


def test_every_committed_lock_validates_with_speclock_and_with_the_schema_alone():
    assert len(COMMITTED) >= 7, COMMITTED  # locks/*.lock and docs/upgrade-example-0.31.0/cpu-vllm.lock
    for path in COMMITTED:
        read_lock(path)
        jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(path.read_text()))


def test_the_schema_refuses_unknown_keys_and_says_so():
    assert LOCK.unknown == "refuse" and SCHEMA["additionalProperties"] is False
    assert SCHEMA["x-speclock-unknown-keys"] == "refuse" and "the build's input" in SCHEMA["description"]
    assert SCHEMA["$id"] == "schemas/lock.schema.json" and SCHEMA["properties"]["schema"]["const"] == "speclock.lock/v1"
    assert set(SCHEMA["required"]) == {"schema", "stack", "stack_sha256", "base", "packages", "assets", "lock_sha256"}


def _changed(tmp_path: Path, name: str, change) -> Path:
    doc = json.loads((ROOT / "locks" / f"{name}.lock").read_text())
    change(doc)
    path = copy_committed_lock(tmp_path / "locks" / f"{name}.lock", name)
    path.write_text(json.dumps(seal(doc)))  # sealed: the model, not the hash, is what refuses it
    return path


@pytest.mark.parametrize(
    "name, change, says",
    [
        (
            "sglang-0.5.15-torch2.11-cu130",
            lambda d: d["targets"]["3.12-x86_64"]["packages"][4].update(sha256=64),
            "targets.3.12-x86_64.packages[4].sha256 is number (64), where string belongs",
        ),
        (
            "sglang-0.5.15-torch2.11-cu130",
            lambda d: d["kernel_base"]["recipe"].update(source_date_epoch="0"),
            "kernel_base.recipe.source_date_epoch is string ('0'), where integer belongs",
        ),
        (
            "vllm-kimi-0.17.1",
            lambda d: d["models"]["target"].update(not_pinned=5),
            "models.target.not_pinned is number (5), where string belongs",
        ),
        (
            "cpu-vllm",
            lambda d: d["prune"]["paths"].__setitem__(0, ["x"]),
            'prune.paths[0] is list (["x"]), where string belongs',
        ),
        ("cpu-vllm", lambda d: d["resolver"].update(requirements="vllm"), "resolver.requirements is string ('vllm')"),
        (
            "cpu-vllm",
            lambda d: d["python"].pop("platforms"),
            "python: key 'platforms' is missing (array of string belongs there)",
        ),
    ],
)
def test_a_wrong_type_at_a_deep_key_path_is_exit_2_naming_the_file_and_the_path(tmp_path, name, change, says):
    path = _changed(tmp_path, name, change)
    code, _, err = run_cli("lock", "--check", "--lock", str(path))
    assert_clean_refusal(code, err, allowed=(2,), names=f"{path}: ")
    assert says in err, err
    assert "speclock lock --stack NAME" in err  # the fix


def test_an_unknown_key_is_refused_naming_it_at_any_depth(tmp_path):
    for change, key in (
        (lambda d: d.update(signed_by="me"), "signed_by"),
        (lambda d: d["packages"][1].update(size=3), "packages[1].size"),
        (lambda d: d["base"].update(arch="x86_64"), "base.arch"),
    ):
        path = _changed(tmp_path, "cpu-vllm", change)
        with pytest.raises(BadInput, match=rf"cpu-vllm.lock: key '{re.escape(key)}': not a key of speclock.lock/v1") as err:
            read_lock(path)
        assert err.value.exit_code == 2


def test_the_content_rules_stay_after_the_model(tmp_path):
    """What a key holds beyond its type is still checked where it was (spec.provenance, spec.lock)."""
    path = _changed(tmp_path, "cpu-vllm", lambda d: d["packages"][0].update(version=""))
    with pytest.raises(BadInput, match=r"packages\[0\] \(.*\): key 'version' is empty"):
        read_lock(path)
    path = _changed(tmp_path, "sglang-0.5.15-torch2.11-cu130", lambda d: d["targets"]["3.12-x86_64"].update(machine="arm"))
    with pytest.raises(BadInput, match=r"targets.3.12-x86_64.machine is 'arm', the key says 'x86_64'"):
        read_lock(path)
    path = _changed(tmp_path, "cpu-vllm", lambda d: d["base"].pop("recipe"))
    with pytest.raises(BadInput, match=r"key 'base.recipe': missing \(a debian-rootfs base records it\)"):
        read_lock(path)


def test_without_pydantic_a_lock_is_exit_3_naming_what_is_missing():
    """speclock runs where an engine's packages are all there is (a host environment's bin/speclock): the models
    import there (plain TypedDicts), and reading a lock says what the machine lacks instead of a traceback."""
    probe = (
        "import sys\nsys.modules['pydantic'] = sys.modules['pydantic_core'] = sys.modules['typing_extensions'] = None\n"
        "from speclock.cli import main\nraise SystemExit(main(['lock', '--stack', 'cpu-vllm', '--check']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert "pydantic is not installed here" in proc.stderr and "Traceback" not in proc.stderr
