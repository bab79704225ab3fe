"""The early image stages (patch, assets, kernels) run speclock from a folder holding only the import closure
of their entry modules (build.closure: patch-tools/, asset-tools/, kernel-tools/). Each stage's entry must
import there (a module that gains an import is carried along by the closure, or this test fails, not a
build), and the folder must not change when a module outside the closure is edited: that is what keeps
those layers cached across edits of speclock."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speclock.build import closure, context

SRC = Path(__file__).resolve().parents[1] / "src" / "speclock"

# (entry modules, data folders, modules that must import there, commands as the Containerfiles run them)
STAGES = {
    "patch-tools": (
        context.PATCH_ENTRIES,
        (),
        ["speclock.cli", "speclock.patches.cli", "speclock.patches.series", "speclock.engines.probe"],
        [["-m", "speclock.patches", "patches", "apply", "--help"]],
    ),
    "asset-tools": (
        context.ASSET_ENTRIES,
        (),
        ["speclock.drafter.gguf_convert"],
        [["-m", "speclock.drafter.gguf_convert", "--help"]],
    ),
    "kernel-tools": (
        context.KERNEL_ENTRIES,
        context.KERNEL_DATA,
        ["speclock.kernels.build"],
        [["-m", "speclock.kernels.build", "--help"]],
    ),
}


def stage_folder(tmp_path: Path, entries, data=(), src: Path = SRC) -> Path:
    root = tmp_path / "stage"
    for rel, path in context.stage_tool_files(src, entries, data).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, root / rel)
    (root / closure.INIT_STUB_REL).write_text(closure.init_stub(src))
    return root


def folder_hash(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(root)}:{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


def run_in(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    # Only the staged folder on the path (no src/ from conftest); cwd is the folder itself, as `-m` adds it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root)
    return subprocess.run([sys.executable, "-B", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_entry_modules_import_from_the_staged_closure_alone(tmp_path, stage):
    entries, data, modules, _ = STAGES[stage]
    root = stage_folder(tmp_path, entries, data)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    mod = importlib.import_module(name)\n"
        f"    assert mod.__file__.startswith({str(root)!r}), (name, mod.__file__)\n"
        "print('ok')\n"
    )
    proc = run_in(root, ["-c", code])
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_commands_start_from_the_staged_closure_alone(tmp_path, stage):
    entries, data, _, commands = STAGES[stage]
    root = stage_folder(tmp_path, entries, data)
    for args in commands:
        proc = run_in(root, args)
        assert proc.returncode == 0, (args, proc.stderr)


def test_the_closures_are_small():
    """Each step carries what it runs, not whole packages: the converter is self-contained (its package's
    __init__.py and itself), so no edit of core/ or of the drafter's other modules converts the target again."""
    assert sorted(context.stage_tool_files(SRC, context.ASSET_ENTRIES)) == [
        "speclock/drafter/__init__.py",
        "speclock/drafter/gguf_convert.py",
    ]
    patch = context.stage_tool_files(SRC, context.PATCH_ENTRIES)
    assert not [rel for rel in patch if rel.startswith(("speclock/build/", "speclock/verify/", "speclock/train/"))]


def test_the_kernel_stage_carries_the_cuda_sources(tmp_path):
    root = stage_folder(tmp_path, context.KERNEL_ENTRIES, context.KERNEL_DATA)
    assert sorted(p.name for p in (root / "speclock" / "kernels" / "csrc").iterdir()) == sorted(
        p.name for p in (SRC / "kernels" / "csrc").iterdir()
    )


def test_a_module_left_out_is_caught(tmp_path):
    """The check has teeth: without one module of the closure the patch stage's entry does not import."""
    root = stage_folder(tmp_path, context.PATCH_ENTRIES)
    (root / "speclock" / "spec" / "stack.py").unlink()
    proc = run_in(root, ["-c", "import speclock.patches.series"])
    assert proc.returncode != 0 and "speclock.spec" in proc.stderr


def test_lazy_and_relative_imports_are_followed(tmp_path):
    src = tmp_path / "speclock"
    (src / "pkg").mkdir(parents=True)
    (src / "__init__.py").write_text('__version__ = "9.9"\n')
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "entry.py").write_text("from . import sibling\n\ndef f():\n    import speclock.pkg.lazy\n")
    (src / "pkg" / "sibling.py").write_text("from .deep import thing\n")
    (src / "pkg" / "deep.py").write_text("thing = 1\n")
    (src / "pkg" / "lazy.py").write_text("")
    (src / "pkg" / "unused.py").write_text("")
    assert sorted(closure.import_closure(src, ("speclock.pkg.entry",))) == [
        "speclock/pkg/__init__.py",
        "speclock/pkg/deep.py",
        "speclock/pkg/entry.py",
        "speclock/pkg/lazy.py",
        "speclock/pkg/sibling.py",
    ]
    assert closure.init_stub(src).endswith('__version__ = "9.9"\n')


@pytest.mark.parametrize(
    "edited",
    [
        "__init__.py",
        "cli.py",
        "build/push.py",
        "verify/gate.py",
        "patches/series.py",
        "core/files.py",
        "core/errors.py",
        "drafter/models.py",
    ],
)
def test_an_edit_outside_a_closure_leaves_its_folder_unchanged(tmp_path, edited):
    """The asset step (the target conversion) is keyed by its folder: edits elsewhere, including the package's
    __init__.py (its docstring; the stub keeps the version only), never rebuild it."""
    copy = tmp_path / "src" / "speclock"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = folder_hash(stage_folder(tmp_path / "a", context.ASSET_ENTRIES, src=copy))
    path = copy / edited
    path.write_text(path.read_text() + "\n# a one-line edit\n")
    assert folder_hash(stage_folder(tmp_path / "b", context.ASSET_ENTRIES, src=copy)) == before


def test_an_edit_inside_a_closure_changes_its_folder(tmp_path):
    copy = tmp_path / "src" / "speclock"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = folder_hash(stage_folder(tmp_path / "a", context.ASSET_ENTRIES, src=copy))
    path = copy / "drafter" / "gguf_convert.py"
    path.write_text(path.read_text() + "\n# a one-line edit\n")
    assert folder_hash(stage_folder(tmp_path / "b", context.ASSET_ENTRIES, src=copy)) != before


def test_no_cache_files_are_staged():
    files = context.stage_tool_files(
        SRC, context.PATCH_ENTRIES + context.ASSET_ENTRIES + context.KERNEL_ENTRIES, context.KERNEL_DATA
    )
    assert not [rel for rel in files if "__pycache__" in rel or rel.endswith((".pyc", ".pyo"))]
