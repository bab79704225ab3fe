"""Where a model goes at run time (docs/run.md, "Where the model goes"): the image's own folders, mounted read-only.

run-image's --model/--draft become read-only mounts under docker and podman alike, checked before any container starts
(a bad path: exit 2 naming the flag and the path; a target.path stack without --model: exit 3 naming --model); inside
an image a missing, empty, unreadable or looping mount is refused before any engine starts; push-image's printed lines
carry the mount for a target.path stack (and stay as they were for other stacks); host-env takes the same flags."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from fuzz_support import run_cli
from test_host_env import host_env, make_repo

from speclock.build.push import MODEL_PLACEHOLDER, printed_mounts
from speclock.build.run import model_mount, model_mounts
from speclock.build.runtimes import HARDENED, PODMAN_AS_DOCKER, Gpus, Mount, gpu_host_commands, gpu_host_serve_commands, run_argv
from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.drafter import models
from speclock.spec.stack import load_stack

REF = "localhost/speclock-own:0123456789abcdef"
BY_DIGEST = "registry.example/speclock-vllm-kimi-0.17.1@sha256:" + "c" * 64
OWN = "vllm-kimi-0.17.1"  # the repository's target.path stack


def model_folder(root: Path) -> Path:
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


# --- argv: read-only mounts under both runtimes ------------------------------------------------------


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_a_read_only_mount_is_ro_under_both_runtimes(runtime):
    mounts = [Mount("/out-host", "/out"), Mount("/models/m", "/opt/speclock/target", readonly=True)]
    cmd = run_argv(runtime, REF, ["selfcheck"], mounts=mounts, cli=[runtime])
    own = PODMAN_AS_DOCKER if runtime == "podman" else []
    assert cmd == [
        runtime,
        "run",
        "--rm",
        *HARDENED,
        *own,
        "-v",
        "/out-host:/out",
        "-v",
        "/models/m:/opt/speclock/target:ro",
        REF,
        "selfcheck",
    ]


def test_mounts_given_as_a_mapping_stay_read_write():
    assert run_argv("docker", REF, [], mounts={"/h": "/out"}, cli=["docker"])[-3:] == ["-v", "/h:/out", REF]


def test_model_and_draft_become_read_only_mounts_at_the_images_folders(tmp_path):
    model, draft = model_folder(tmp_path), tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    link = tmp_path / "link"
    link.symlink_to(model)
    mounts = model_mounts(load_stack("cpu-vllm"), str(link), str(draft))
    assert mounts == [
        Mount(str(model.resolve()), "/opt/speclock/target", readonly=True),  # the link resolved
        Mount(str(draft.resolve()), "/opt/speclock/draft", readonly=True),
    ]


# --- bad --model paths: exit 2 naming the flag and the path, before anything starts --------------------


def _loop(tmp: Path) -> Path:
    a, b = tmp / "a", tmp / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


BAD = {
    "missing": (lambda t: t / "nowhere", "does not exist"),
    "file": (lambda t: (t / "f.txt").write_text("x") and t / "f.txt", "is a file"),
    "empty": (lambda t: (t / "empty").mkdir() or t / "empty", "empty folder"),
    "loop": (_loop, "symbolic link loop"),
    "dangling": (lambda t: (t / "gone").symlink_to(t / "absent") or t / "gone", "does not exist"),
    "colon": (lambda t: model_folder(t).rename(t / "a:b") or t / "a:b", "':' or ','"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_model_path_is_bad_input_naming_the_flag_and_path(case, tmp_path):
    make, said = BAD[case]
    path = make(tmp_path)
    with pytest.raises(BadInput) as err:
        model_mount("--model", str(path))
    assert err.value.exit_code == 2 and f"--model {path}" in err.value.message and said in err.value.message


def test_run_image_with_a_bad_model_is_exit_2_before_any_container(tmp_path):
    code, _out, err = run_cli("run-image", "--stack", "cpu-vllm", "--model", str(tmp_path / "nowhere"))
    assert code == 2 and f"--model {tmp_path / 'nowhere'} does not exist" in err and "running " not in err


def test_run_image_of_a_target_path_stack_without_model_is_exit_3_naming_model():
    code, _out, err = run_cli("run-image", "--stack", OWN)
    assert code == 3 and "add --model DIR" in err and "target.path" in err and "running " not in err


# --- inside an image: the mount point is checked before any engine starts ------------------------------


@pytest.fixture
def in_image(tmp_path, monkeypatch):
    """This process as in an image whose home is tmp_path/home (its target folder made empty, as the Containerfile does)."""
    home = tmp_path / "home"
    (home / "target").mkdir(parents=True)
    monkeypatch.setenv("SPECLOCK_IN_IMAGE", "1")
    monkeypatch.setattr(models, "IMAGE", models.IMAGE.__class__(home))
    return home


def test_an_empty_mount_point_is_exit_3_naming_model_and_the_docker_form(in_image):
    with pytest.raises(EnvironmentProblem) as err:
        models.target_folder(load_stack(OWN), None)
    assert err.value.exit_code == 3 and str(in_image / "target") in err.value.message and "empty" in err.value.message
    assert "run-image --model DIR" in err.value.hint and "docker run -v DIR:/opt/speclock/target:ro" in err.value.hint


def test_a_missing_mount_point_is_exit_3(in_image):
    (in_image / "target").rmdir()
    with pytest.raises(EnvironmentProblem, match="does not exist"):
        models.target_folder(load_stack(OWN), None)


def test_a_looping_mount_is_bad_input_naming_the_path(in_image):
    (in_image / "target").rmdir()
    _loop(in_image)
    (in_image / "target").symlink_to(in_image / "a")
    with pytest.raises(BadInput, match="symbolic link loop") as err:
        models.target_folder(load_stack(OWN), None)
    assert str(in_image / "target") in err.value.message


def test_a_mounted_target_is_served_from_the_mount(in_image):
    (in_image / "target" / "config.json").write_text("{}")
    assert models.target_folder(load_stack(OWN), None) == (in_image / "target").resolve()


# --- push-image's printed lines ---------------------------------------------------------------------


def test_push_lines_of_a_target_path_stack_mount_the_model_read_only():
    mounts = printed_mounts(load_stack(OWN))
    run = gpu_host_commands(BY_DIGEST, Gpus(all=True), mounts)
    serve = gpu_host_serve_commands(BY_DIGEST, 8000, Gpus(all=True), mounts)
    for line in (*run.values(), *serve.values()):
        argv = shlex.split(line)
        assert argv[argv.index("-v") + 1] == f"{MODEL_PLACEHOLDER}:/opt/speclock/target:ro"
        assert argv.index("-v") < argv.index(BY_DIGEST)


def test_push_lines_of_other_stacks_are_unchanged():
    assert printed_mounts(load_stack("cpu-vllm")) == []
    assert gpu_host_commands(BY_DIGEST, Gpus(all=True), printed_mounts(load_stack("cpu-vllm"))) == gpu_host_commands(
        BY_DIGEST, Gpus(all=True)
    )
    assert "-v" not in shlex.split(gpu_host_commands(BY_DIGEST, Gpus(all=True))["docker"])


# --- host-env takes the same flags -------------------------------------------------------------------


def test_host_env_links_its_target_to_model(tmp_path):
    make_repo(tmp_path)
    model = model_folder(tmp_path)
    dest = tmp_path / "env"
    proc = host_env(tmp_path, "--dest", str(dest), "--model", str(model))
    assert proc.returncode == 0, proc.stderr
    target = dest / "speclock" / "target"
    assert target.is_symlink() and target.resolve() == model.resolve()
    assert json.loads((dest / "speclock" / "host-env.json").read_text())["target_folder"] == str(model.resolve())
    # the same command again: the same environment; another --model is another one (DEST exists: exit 2)
    assert host_env(tmp_path, "--dest", str(dest), "--model", str(model)).returncode == 0
    other = tmp_path / "other"
    shutil.copytree(model, other)
    again = host_env(tmp_path, "--dest", str(dest), "--model", str(other))
    assert again.returncode == 2 and "exists" in again.stderr


def test_host_env_with_a_bad_model_is_exit_2_and_makes_nothing(tmp_path):
    make_repo(tmp_path)
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"), "--model", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and f"--model {tmp_path / 'nowhere'}" in proc.stderr
    assert not (tmp_path / "env").exists()


def test_host_env_of_a_target_path_stack_whose_model_is_missing_is_exit_3_naming_model(tmp_path):
    make_repo(tmp_path)
    stack = tmp_path / "stacks" / "tiny.toml"
    stack.write_text(
        stack.read_text().replace('path = "models/smollm2-135m-eagle3-sglang"\n[draft]', 'path = "models/absent"\n[draft]')
    )
    proc = host_env(tmp_path, "--dest", str(tmp_path / "env"))
    assert proc.returncode == 3 and "--model DIR" in proc.stderr and "target.path" in proc.stderr
    assert not (tmp_path / "env").exists()
