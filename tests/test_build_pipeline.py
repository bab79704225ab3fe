"""The build pipeline's layout (issue #18), checked without building: what each step is keyed by, that
speclock's source is the last layer, that the venv step installs, prunes and leaves no installer in one
RUN, and the uv unpacker's hash check."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

from speclock.build import uvwheel
from speclock.build.containerfile import VENV_STEP_FILES, containerfile_text
from speclock.build.inputs import WHEEL_LISTS

ROOT = Path(__file__).resolve().parents[1]


def instructions(text: str) -> list[str]:
    """The Containerfile's instructions, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            out.append(cur.strip())
            cur = ""
    return out


def stage(text: str, name: str) -> list[str]:
    steps = instructions(text)
    start = next(i for i, s in enumerate(steps) if re.match(rf"FROM \S+ AS {name}$", s))
    end = next((i for i in range(start + 1, len(steps)) if steps[i].startswith("FROM ")), len(steps))
    return steps[start:end]


@pytest.mark.parametrize("with_kernels", [False, True])
def test_the_source_is_the_last_layer_and_nothing_compiles_it(with_kernels):
    runtime = stage(containerfile_text(with_kernels, {"A": "1"}), "runtime")
    assert runtime[-1] == "COPY config /opt/speclock"
    layers = [s for s in runtime if s.startswith(("RUN", "COPY"))]
    assert layers[-1] == "COPY config /opt/speclock"
    assert not any("compileall" in s for s in runtime)
    # the drafter and the (possibly empty) patch folder come in by the user step, as COPY made them before
    user_step = next(s for s in runtime if s.startswith("RUN") and "/etc/passwd" in s)
    assert "cp -R /draft /opt/speclock/draft" in user_step and "mkdir -p /opt/speclock/patches" in user_step
    # the instructions that only set metadata come before it: an edit re-runs none of them
    assert all(not s.startswith(("ENV", "USER", "WORKDIR", "ENTRYPOINT", "CMD")) for s in runtime[runtime.index(layers[-1]) :])


def test_each_step_that_reads_a_bind_mount_is_keyed_by_its_hash():
    """buildah keys a RUN by its text and build args, never by bind-mounted files: each such step declares
    the hash of what it reads (build_args_for computes them)."""
    text = containerfile_text(True)
    keys = {
        "venv": "WHEELS_SHA256",
        "patched": "PATCHES_SHA256",
        "assets": "ASSETS_SHA256",
        "kernels": "KERNELS_SHA256",
        "runtime": "DRAFT_SHA256",
    }
    for name, key in keys.items():
        steps = stage(text, name)
        assert any("--mount=type=bind" in s for s in steps if s.startswith("RUN")), name
        declared = {word.split("=")[0] for s in steps if s.startswith("ARG ") for word in s.split()[1:]}
        assert key in declared, name
    # no step binds speclock's whole source: each gets the closure of what it runs
    assert "source=tools," not in text and "source=src" not in text


def test_the_venv_step_installs_prunes_and_removes_its_installer_in_one_run():
    runs = [s for s in stage(containerfile_text(False), "venv") if s.startswith("RUN")]
    assert len(runs) == 1
    run = runs[0]
    assert "--require-hashes" in run and "--offline" in run and "--no-index" in run
    assert run.rstrip().endswith("sh /wheels/prune.sh /opt/venv")
    assert "rm -rf /tmp/uv" in run and "pip uninstall -y -q pip" in run
    assert "--compile-bytecode" in run and "export SOURCE_DATE_EPOCH" in run  # checked-hash .pyc
    assert "uv_cache.json' -delete" in run  # uv's per-install timestamp would change the digest every build


def test_what_the_venv_step_reads_is_hashed_into_its_key_and_the_tag():
    assert set(VENV_STEP_FILES) >= {"requirements.txt", "uv.txt", "uv_unpack.py", "prune.sh"}
    assert {f"wheels/{name}" for name in VENV_STEP_FILES} <= set(WHEEL_LISTS)


def fake_uv_wheel(folder: Path, version: str = "0.13.8") -> str:
    wheel = folder / f"uv-{version}-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"uv-{version}.data/scripts/uv", b"#!/bin/sh\necho uv\n")
        zf.writestr("uv/__init__.py", "")
    return hashlib.sha256(wheel.read_bytes()).hexdigest()


def test_uv_is_unpacked_from_its_locked_wheel(tmp_path):
    sha = fake_uv_wheel(tmp_path)
    (tmp_path / "uv.txt").write_text(f"uv==0.13.8 --hash=sha256:{sha}\n")
    binary = uvwheel.unpack(tmp_path / "uv.txt", tmp_path / "out")
    assert binary.read_bytes() == b"#!/bin/sh\necho uv\n" and binary.stat().st_mode & 0o111


def test_a_uv_wheel_that_does_not_match_the_lock_is_refused(tmp_path):
    fake_uv_wheel(tmp_path)
    (tmp_path / "uv.txt").write_text("uv==0.13.8 --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(SystemExit, match="the lock says"):
        uvwheel.unpack(tmp_path / "uv.txt", tmp_path / "out")
    assert not (tmp_path / "out" / "uv").exists()


def test_the_default_stack_locks_uv_for_the_venv_step():
    import json

    lock = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())
    pkg = uvwheel.uv_package(lock)
    assert pkg and pkg["filename"].startswith(f"uv-{pkg['version']}-")


def test_buildah_builds_offline_and_removes_the_containers_of_a_failed_build(tmp_path, monkeypatch):
    """A failed step's working container holds the step's whole output (2+ GB for the venv): --force-rm."""
    from speclock.build.builders import buildah

    seen = []

    def fake_stream(cmd, **kwargs):
        seen.append(cmd)
        Path(cmd[cmd.index("--iidfile") + 1]).write_text("sha256:" + "0" * 64)
        return 0, ""

    monkeypatch.setattr(buildah, "stream", fake_stream)
    (tmp_path / "Containerfile").write_text("FROM scratch\n")
    buildah.BUILDER.build(
        containerfile=tmp_path / "Containerfile",
        context=tmp_path,
        tag="t",
        build_args={},
        labels={},
        target=None,
        no_cache=False,
        timestamp=0,
    )
    cmd = seen[0]
    assert "--force-rm" in cmd and "--layers" in cmd and cmd[cmd.index("--network") + 1] == "none"
