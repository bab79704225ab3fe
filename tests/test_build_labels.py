"""The image labels: one vocabulary (speclock.build.labels, docs/labels.md), handed to the builders by
Builder.build(labels=...) (docker: --label; buildah: one LABEL step in its own copy of the Containerfile),
and the patches label equal to what `speclock patches label` prints. No builder runs."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import time
import tomllib
from pathlib import Path

import pytest
from fuzz_support import run_cli

from speclock.build import image as build
from speclock.build.builders import buildah as buildah_mod
from speclock.build.builders import docker as docker_mod
from speclock.build.builders import ensure_in_docker
from speclock.build.labels import LABEL_PREFIX, LICENSES, OCI_PREFIX, base_labels, labels_for
from speclock.build.sbom.document import SBOM_IN_IMAGE
from speclock.core.errors import EnvironmentProblem
from speclock.patches.series import load_series, series_label
from speclock.spec.lock import read_lock
from speclock.spec.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]
PATCHED = "vllm-kimi-0.17.1"  # a stack with a patch series


def labels(name: str) -> dict[str, str]:
    """The labels of a Containerfile build of the stack (with its SBOM's path, as build-image gives them)."""
    return labels_for(load_stack(name), read_lock(ROOT / "locks" / f"{name}.lock"), "TAG", "INPUTS", "REV", sbom=SBOM_IN_IMAGE)


@pytest.mark.parametrize("name", [p.stem for p in sorted((ROOT / "locks").glob("*.lock"))])
def test_every_key_is_in_the_one_vocabulary(name):
    got = labels(name)
    assert all(k.startswith((f"{LABEL_PREFIX}.", f"{OCI_PREFIX}.")) for k in got), sorted(got)
    assert "org.speclock.patches" not in got and f"{LABEL_PREFIX}.patches" in got


def test_the_patches_label_is_what_patches_label_prints():
    got = labels(PATCHED)
    key, value = series_label(load_series(load_stack(PATCHED)))
    assert got[key] == value
    assert re.fullmatch(r"([^,@]+\.patch@[0-9a-f]{12})(,[^,@]+\.patch@[0-9a-f]{12})+", value)
    code, out, err = run_cli("patches", "label", "--stack", PATCHED)
    assert code == 0, err
    assert out.strip() == f"{key}={got[key]}"


def test_no_label_depends_on_the_wall_clock():
    lock = read_lock(ROOT / "locks" / "cpu-vllm.lock")
    got = labels("cpu-vllm")
    # created is the lock's SOURCE_DATE_EPOCH: buildah builds of the same inputs keep one digest
    assert got["org.opencontainers.image.created"] == dt.datetime.fromtimestamp(lock["source_date_epoch"], dt.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    time.sleep(1.1)
    assert labels("cpu-vllm") == got


def documented_keys() -> list[str]:
    """The keys of docs/labels.md's table, in its order."""
    doc = (ROOT / "docs" / "labels.md").read_text()
    return re.findall(r"^\| `([a-z0-9.-]+)` \|", doc, flags=re.M)


def test_docs_labels_md_documents_every_key():
    documented = documented_keys()
    assert len(documented) == len(set(documented)), "a key listed twice"
    for name in (p.stem for p in (ROOT / "locks").glob("*.lock")):
        assert set(documented) == set(labels(name)), name  # every stack's image: exactly the documented keys


def test_the_oci_keys_asked_for_are_all_there():
    got = labels("cpu-vllm")
    for key in (
        "title",
        "description",
        "source",
        "documentation",
        "licenses",
        "revision",
        "created",
        "version",
        "base.name",
        "base.digest",
    ):
        assert f"{OCI_PREFIX}.{key}" in got, key


def test_licenses_is_speclocks_license_from_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert labels("cpu-vllm")[f"{OCI_PREFIX}.licenses"] == LICENSES == project["license"]["text"]


def test_version_says_what_the_image_packages_and_speclocks_version_has_its_own_key():
    from speclock import __version__

    got = labels_for(load_stack("cpu-vllm"), read_lock(ROOT / "locks" / "cpu-vllm.lock"), "ab5e3f80fa59b65c", "INPUTS", "REV")
    assert got[f"{OCI_PREFIX}.version"] == f"{load_stack('cpu-vllm').engine['version']}+ab5e3f80fa59b65c"
    assert got[f"{LABEL_PREFIX}.speclock-version"] == __version__


def test_the_base_of_a_locked_rootfs_and_of_a_registry_image():
    lock = read_lock(ROOT / "locks" / "cpu-vllm.lock")
    got = labels("cpu-vllm")
    sha = lock["base"]["sha256"]
    assert got[f"{OCI_PREFIX}.base.name"] == f"localhost/speclock-base:{sha[:16]}"  # what ensure_base_image imports
    assert got[f"{OCI_PREFIX}.base.digest"] == f"sha256:{sha}" and got[f"{LABEL_PREFIX}.base"] == sha
    pinned = "registry.example/org/base@sha256:" + "c" * 64
    assert base_labels({"base": {"kind": "image", "ref": pinned}}) == {
        f"{OCI_PREFIX}.base.name": "registry.example/org/base",
        f"{OCI_PREFIX}.base.digest": "sha256:" + "c" * 64,
    }


@pytest.mark.parametrize(
    "revision, dirty", [("0123abc", "false"), ("0123abc+dirty", "true"), ("uncommitted+dirty", "true"), ("unknown", "false")]
)
def test_a_dirty_revision_is_marked_dirty(revision, dirty):
    got = labels_for(load_stack("cpu-vllm"), read_lock(ROOT / "locks" / "cpu-vllm.lock"), "TAG", "INPUTS", revision)
    assert got[f"{OCI_PREFIX}.revision"] == revision and got[f"{LABEL_PREFIX}.dirty"] == dirty


def test_an_uncommitted_edit_to_an_input_makes_the_revision_dirty(tmp_path, monkeypatch):
    """A real git checkout: committed inputs give the commit; an edit adds +dirty (build.inputs.git_revision)."""
    import subprocess

    from speclock.build import inputs

    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setattr(inputs, "REPO_ROOT", tmp_path)
    assert inputs.git_revision([tmp_path / "src"]) == head
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    assert inputs.git_revision([tmp_path / "src"]) == head + "+dirty"


class Recording:
    """A builder that records what build-image hands it."""

    name = "buildah"

    def __init__(self):
        self.calls = []

    def build(self, **kw):
        self.calls.append(kw)
        return "sha256:" + "1" * 64

    def labels(self, ref):
        return dict(self.calls[-1]["labels"])

    def layers(self, ref):
        return []

    def check_available(self):
        return "1.0"

    def image_exists(self, ref):  # the body (build.tail) is in the store: only the tail is built
        return True


def test_build_image_passes_the_labels_to_the_builder_not_into_the_containerfile(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    stack = load_stack("cpu-vllm")
    lock = read_lock(ROOT / "locks" / "cpu-vllm.lock")
    for pkg in lock["packages"] + lock["assets"]:  # placeholder wheels in a private wheelhouse
        entry = tmp_path / "cache" / "wheelhouse" / pkg["sha256"] / pkg["filename"]
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.touch()
    rec = Recording()
    monkeypatch.setattr(build, "get_builder", lambda name: rec)
    monkeypatch.setattr(build, "fetch", lambda doc, progress=None: None)
    monkeypatch.setattr(build, "ensure_base_image", lambda *a, **k: "localhost/speclock-base:x")
    monkeypatch.setattr(build, "git_revision", lambda paths: "rev")
    monkeypatch.setattr(
        build, "stage_sbom_cached", lambda *a, **k: None
    )  # placeholder wheels: tests/test_sbom.py makes real ones
    record = build.build_image(stack, progress=lambda m: None)
    (call,) = rec.calls
    assert (
        call["labels"]
        == record["labels"]
        == labels_for(stack, lock, record["tag"], record["inputs_sha256"], "rev", sbom=SBOM_IN_IMAGE)
    )
    assert call["labels"][f"{LABEL_PREFIX}.inputs-sha256"][:16] == record["tag"]
    staged = (Path(call["context"]) / "Containerfile").read_text()
    assert not re.search(r"^LABEL ", staged, flags=re.M) and LABEL_PREFIX not in staged
    info = json.loads((Path(call["context"]) / "config" / "image.json").read_text())
    assert info["labels"] == call["labels"]  # what the image's own image.json says


def test_a_builder_keeping_old_labels_is_reported(tmp_path, monkeypatch):
    msgs = []
    rec = Recording()
    rec.labels = lambda ref: {"io.speclock.stack": "other"}
    build._check_labels(rec, "localhost/x:1", {"io.speclock.stack": "cpu-vllm", "io.speclock.cuda": "none"}, msgs.append)
    assert msgs and "io.speclock.cuda, io.speclock.stack" in msgs[0] and "--no-cache" in msgs[0]


LABELS = {"io.speclock.stack": "cpu-vllm", "io.speclock.patches": "a.patch@0123456789ab,b.patch@ba9876543210"}


def run_build(builder, tmp_path, monkeypatch, labels) -> tuple[list[str], str]:
    """(the builder's command, the Containerfile text it was given) without running it."""
    seen = []

    def fake_stream(cmd, **kw):
        seen.append((list(cmd), Path(cmd[cmd.index("-f") + 1]).read_text()))
        Path(cmd[cmd.index("--iidfile") + 1]).write_text("sha256:" + "2" * 64)
        return 0, ""

    monkeypatch.setattr(sys.modules[type(builder).__module__], "stream", fake_stream)
    (tmp_path / "Containerfile").write_text("FROM scratch AS runtime\nUSER 10001\n")
    assert (
        builder.build(
            containerfile=tmp_path / "Containerfile",
            context=tmp_path,
            tag="localhost/x:1",
            build_args={},
            labels=labels,
            target="runtime",
            no_cache=False,
            timestamp=0,
        )
        == "sha256:" + "2" * 64
    )
    (call,) = seen
    return call


def test_docker_gets_the_labels_as_label_options(tmp_path, monkeypatch):
    cmd, text = run_build(docker_mod.BUILDER, tmp_path, monkeypatch, LABELS)
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--label"] == [f"{k}={v}" for k, v in LABELS.items()]
    assert "LABEL" not in text


def test_buildah_gets_the_labels_as_one_label_step_of_its_own_copy(tmp_path, monkeypatch):
    cmd, text = run_build(buildah_mod.BUILDER, tmp_path, monkeypatch, LABELS)
    assert "--label" not in cmd  # one step per --label in buildah; one LABEL is one step
    assert text == buildah_mod.labelled_containerfile("FROM scratch AS runtime\nUSER 10001\n", LABELS)
    assert text.count("\nLABEL ") == 1 and '"io.speclock.patches"="a.patch@0123456789ab,b.patch@ba9876543210"' in text
    assert (tmp_path / "Containerfile").read_text() == "FROM scratch AS runtime\nUSER 10001\n"  # the context untouched
    assert Path(cmd[cmd.index("-f") + 1]).parent != tmp_path
    # the same labels in another order give the same text (the same history, the same digest)
    assert buildah_mod.labelled_containerfile("X\n", dict(reversed(LABELS.items()))) == buildah_mod.labelled_containerfile(
        "X\n", LABELS
    )


def test_buildah_without_labels_reads_the_containerfile_as_staged(tmp_path, monkeypatch):
    cmd, text = run_build(buildah_mod.BUILDER, tmp_path, monkeypatch, {})
    assert cmd[cmd.index("-f") + 1] == str(tmp_path / "Containerfile") and "LABEL" not in text


def test_ensure_in_docker_asks_the_builder_that_made_the_image(monkeypatch):
    asked = []
    monkeypatch.setattr(buildah_mod.Buildah, "copy_to_docker", lambda self, ref: asked.append(("buildah", ref)) or ref)
    monkeypatch.setattr(docker_mod.Docker, "copy_to_docker", lambda self, ref: asked.append(("docker", ref)) or ref)
    assert ensure_in_docker({"builder": "buildah", "ref": "localhost/speclock-a:1"}) == "localhost/speclock-a:1"
    assert ensure_in_docker({"builder": "docker", "ref": "localhost/speclock-a:2"}) == "localhost/speclock-a:2"
    assert asked == [("buildah", "localhost/speclock-a:1"), ("docker", "localhost/speclock-a:2")]


def test_a_buildah_image_already_in_docker_is_not_copied_again(monkeypatch):
    monkeypatch.setattr(buildah_mod, "in_docker", lambda ref: True)
    monkeypatch.setattr(buildah_mod, "stream", lambda *a, **k: pytest.fail("copied again"))
    assert buildah_mod.BUILDER.copy_to_docker("localhost/speclock-a:1") == "localhost/speclock-a:1"


def test_a_docker_image_missing_from_docker_names_the_docker_builder(monkeypatch):
    monkeypatch.setattr(docker_mod, "in_docker", lambda ref: False)
    with pytest.raises(EnvironmentProblem, match="--builder docker"):
        docker_mod.BUILDER.copy_to_docker("localhost/speclock-a:1")
