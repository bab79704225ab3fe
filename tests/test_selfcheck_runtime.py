"""Which runtime runs an image's self-check: podman for a buildah build (it reads buildah's store, so nothing is
copied), docker for a docker build or where podman does not work. The real runs: tests/test_image.py (buildah build,
self-check in the image) and the upgrade tests."""

from __future__ import annotations

import pytest

from speclock.build import image
from speclock.core.errors import EnvironmentProblem


@pytest.mark.parametrize(
    ("builder", "podman_works", "want"),
    [("buildah", True, "podman"), ("buildah", False, "docker"), ("docker", True, "docker"), ("docker", False, "docker")],
)
def test_selfcheck_runtime(monkeypatch, builder, podman_works, want):
    asked = []

    def check(runtime):
        asked.append(runtime)
        if not podman_works:
            raise EnvironmentProblem("podman does not work here")

    monkeypatch.setattr(image, "check_runtime", check)
    assert image.selfcheck_runtime({"builder": builder, "ref": "localhost/speclock-x:1"}) == want
    assert asked == (["podman"] if builder == "buildah" else [])


def test_selfcheck_image_runs_under_the_chosen_runtime_without_a_docker_copy(monkeypatch, tmp_path):
    """A buildah build is run by podman from its own store: ensure_in_docker (the skopeo copy) is never called."""
    seen = {}
    monkeypatch.setattr(image, "selfcheck_runtime", lambda record: "podman")
    monkeypatch.setattr(image, "ensure_in_podman", lambda record: record["ref"])
    monkeypatch.setattr(image, "ensure_in_docker", lambda record: pytest.fail("copied into docker"))
    monkeypatch.setattr(image, "records_dir", lambda name: tmp_path)
    monkeypatch.setattr(image, "write_record", lambda name, record: None)

    def run(ref, args, **kw):
        seen.update(ref=ref, runtime=kw["runtime"])
        kw["out_dir"].mkdir(parents=True)
        (kw["out_dir"] / "selfcheck.json").write_text('{"verdict": "pass", "stages": {}}')

        class Done:
            returncode = 0

        return Done()

    monkeypatch.setattr(image, "run_image", run)

    class Stack:
        name = "cpu-vllm"
        target = {"path": ""}  # ships its target in a package: nothing to mount

    record = {"builder": "buildah", "ref": "localhost/speclock-cpu-vllm:1", "tag": "1", "image_id": "sha256:ab"}
    result = image.selfcheck_image(Stack(), record, progress=lambda m: None)
    assert seen == {"ref": "localhost/speclock-cpu-vllm:1", "runtime": "podman"} and result["verdict"] == "pass"
