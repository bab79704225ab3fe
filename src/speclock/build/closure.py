"""The files of speclock a build step runs: the import closure of its entry modules.

A build step that runs speclock code (the patch applier, the target converter, the kernel builder) gets
exactly the modules its entry imports, transitively, and nothing else: its layer is keyed by those files,
so editing any other module of speclock never rebuilds it. Every import statement counts, also the ones
inside functions (lazy imports run too). The top `speclock/__init__.py` is replaced by a stub that holds
only the version, so a one-line edit there (or of any module outside the closure) changes nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from speclock.core.errors import BadInput

PACKAGE = "speclock"
INIT_STUB_REL = f"{PACKAGE}/__init__.py"


def _module_file(src_root: Path, name: str) -> Path | None:
    """src/speclock/a/b.py or src/speclock/a/b/__init__.py for `speclock.a.b`; None when neither exists."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = src_root.joinpath(*parts[1:])
    if base.with_suffix(".py").is_file() and len(parts) > 1:
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _imported_names(path: Path, module: str) -> set[str]:
    """Every speclock module name an import statement in `path` may load (absolute and relative)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")}


def import_closure(src_root: Path, entries: tuple[str, ...]) -> dict[str, Path]:
    """{"speclock/<rel>": file} for the entry modules, what they import (transitively) and their packages'
    __init__.py files; the top __init__.py is left out (the stager writes `init_stub`)."""
    todo = list(entries)
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(src_root, name)
        if path is None:
            if name in entries:
                raise BadInput(
                    f"build step entry module {name} is not in {src_root}", hint="fix the entry list in speclock.build.context"
                )
            continue  # `from speclock.x import some_function`: the name is not a module
        seen[name] = path
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(2, len(parts)))  # parent packages run their __init__
        todo.extend(_imported_names(path, name))
    files = {f"{PACKAGE}/{p.relative_to(src_root).as_posix()}": p for p in seen.values()}
    files.pop(INIT_STUB_REL, None)
    return dict(sorted(files.items()))


def init_stub(src_root: Path) -> str:
    """The build steps' speclock/__init__.py: the package's version line and nothing else."""
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', (src_root / "__init__.py").read_text(), re.M)
    if not match:
        raise BadInput(f"{src_root / '__init__.py'} has no __version__ line", hint='restore `__version__ = "X.Y.Z"`')
    return (
        f'"""speclock, as a build step carries it (speclock.build.closure): the version only."""\n\n__version__ = "{match[1]}"\n'
    )
