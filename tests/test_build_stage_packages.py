"""The early image stages (patch, assets, kernels) run speclock from a folder holding only the packages
build-image copies for them (tools/, kernel-tools/). Each stage's entry module must import there:
a module that gains an import of a package the stage does not carry breaks this test, not a build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speclock.build import context

SRC = Path(__file__).resolve().parents[1] / "src" / "speclock"

# (folder, packages, files at the top of speclock/, entry modules, commands as the Containerfiles run them)
STAGES = {
    "tools": (context.TOOL_PACKAGES, context.TOOL_TOP_FILES,
              ["speclock.cli", "speclock.patches.cli", "speclock.drafter.models", "speclock.engines.probe"],
              [["-m", "speclock.patches", "patches", "apply", "--help"],
               ["-m", "speclock.drafter.models", "convert", "--help"]]),
    "kernel-tools": (context.KERNEL_TOOL_PACKAGES, context.KERNEL_TOOL_TOP_FILES,
                     ["speclock.kernels.build"],
                     [["-m", "speclock.kernels.build", "--help"]]),
}


def stage_folder(tmp_path: Path, packages, top_files) -> Path:
    root = tmp_path / "stage"
    for rel, src in context.stage_tool_files(SRC, packages, top_files).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, root / rel)
    return root


def run_in(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    # Only the staged folder on the path (no src/ from conftest); cwd is the folder itself, as `-m` adds it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root)
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_entry_modules_import_from_the_staged_packages_alone(tmp_path, stage):
    packages, top_files, modules, _ = STAGES[stage]
    root = stage_folder(tmp_path, packages, top_files)
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    mod = importlib.import_module(name)\n"
            f"    assert mod.__file__.startswith({str(root)!r}), (name, mod.__file__)\n"
            "print('ok')\n")
    proc = run_in(root, ["-c", code])
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_commands_start_from_the_staged_packages_alone(tmp_path, stage):
    packages, top_files, _, commands = STAGES[stage]
    root = stage_folder(tmp_path, packages, top_files)
    for args in commands:
        proc = run_in(root, args)
        assert proc.returncode == 0, (args, proc.stderr)


def test_the_kernel_stage_carries_the_cuda_sources(tmp_path):
    root = stage_folder(tmp_path, context.KERNEL_TOOL_PACKAGES, context.KERNEL_TOOL_TOP_FILES)
    assert sorted(p.name for p in (root / "speclock" / "kernels" / "csrc").iterdir()) == \
        sorted(p.name for p in (SRC / "kernels" / "csrc").iterdir())


def test_a_package_left_out_is_caught(tmp_path):
    """The check has teeth: without spec/ the patch stage's entry does not import."""
    root = stage_folder(tmp_path, tuple(p for p in context.TOOL_PACKAGES if p != "spec"), context.TOOL_TOP_FILES)
    proc = run_in(root, ["-c", "import speclock.patches.series"])
    assert proc.returncode != 0 and "speclock.spec" in proc.stderr


def test_no_cache_files_are_staged(tmp_path):
    files = context.stage_tool_files(SRC, context.TOOL_PACKAGES, context.TOOL_TOP_FILES)
    assert not [rel for rel in files if "__pycache__" in rel or rel.endswith((".pyc", ".pyo"))]
