"""Typing of verify/ and upgrade/ (issue #27): the bugs the type checkers found there."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from speclock.core.errors import EnvironmentProblem
from speclock.verify import cuda_arch

# ---------------------------------------------------------------- find_cuobjdump (verify/cuda_arch.py)


def _cuobjdump_wheel(wheels: Path) -> Path:
    wheels.mkdir(parents=True)
    wheel = wheels / "nvidia_cuda_cuobjdump-13.0.0-py3-none-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("nvidia/cu13/bin/cuobjdump", "#!/bin/sh\n")
    return wheel


@pytest.fixture
def no_cuobjdump_around(tmp_path, monkeypatch):
    """A cache under tmp_path, and no cuobjdump on PATH, in SPECLOCK_CUOBJDUMP or on sys.path."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECLOCK_CACHE", str(cache))
    monkeypatch.delenv("SPECLOCK_CUOBJDUMP", raising=False)
    monkeypatch.setattr(cuda_arch.shutil, "which", lambda name: None)
    monkeypatch.setattr(cuda_arch.sys, "path", [])
    return cache


def test_find_cuobjdump_replaces_a_tools_folder_that_holds_no_cuobjdump(no_cuobjdump_around):
    """Real bug (mypy: find_cuobjdump returned `Path | None` where `Path` is promised): a tools folder left without
    its binary made find_cuobjdump return None, and its callers ran `[None, "--list-elf", ...]`."""
    cache = no_cuobjdump_around
    _cuobjdump_wheel(cache / "wheels")
    (cache / "tools" / "cuobjdump" / "nvidia").mkdir(parents=True)  # damaged: the binary is gone
    tool = cuda_arch.find_cuobjdump()
    assert isinstance(tool, Path) and tool.is_file()
    assert tool == cache / "tools" / "cuobjdump" / "nvidia" / "cu13" / "bin" / "cuobjdump"


def test_find_cuobjdump_unpacks_the_cached_wheel_into_an_empty_cache(no_cuobjdump_around):
    cache = no_cuobjdump_around
    _cuobjdump_wheel(cache / "wheels")
    tool = cuda_arch.find_cuobjdump()
    assert tool.is_file() and tool.is_relative_to(cache / "tools" / "cuobjdump")


def test_find_cuobjdump_never_returns_none(no_cuobjdump_around, monkeypatch):
    """Whatever is left in the tools folder, the answer is a cuobjdump or an environment problem (exit 3)."""
    _cuobjdump_wheel(no_cuobjdump_around / "wheels")
    monkeypatch.setattr(cuda_arch.os, "replace", lambda src, dst: None)  # the unpacked copy never lands
    with pytest.raises(EnvironmentProblem, match="holds no cuobjdump"):
        cuda_arch.find_cuobjdump()
