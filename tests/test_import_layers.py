"""The package reads as the flow: lower layers never import higher ones, and nothing imports in a circle.

The import graph is read with `ast` from src/speclock (module-level and function-level imports alike),
so a circle hidden inside a function counts. Function-local imports are for heavy optional
dependencies only (torch, transformers, the engines, ...): a function-local import of a speclock
module must be of a module that itself pulls such a dependency at import time, or be listed in
LOCAL_IMPORT_ALLOWLIST with the reason it cannot move yet.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "speclock"

# Lower rank = lower layer. A module may import its own package and packages of a lower rank only.
# Packages of one rank do not import each other (patches and drafter know nothing of one another).
RANKS = {
    "core": 0,
    "spec": 1,
    "kernels": 2,  # CUDA/Triton kernels: need the stack's archs only
    "patches": 3,
    "drafter": 3,  # model folders, manifest, drafter network, reference decoder
    "engines": 4,  # adapters; they read model configs through drafter/
    "build": 5,
    "verify": 6,  # doctor, smoke, gate, ...: never train/
    "upgrade": 7,
    "train": 8,  # makes drafters; uses drafter/, engines' reference decoder, kernels
    "cli": 9,  # entry points: speclock.cli, speclock.__main__, speclock.patches.__main__
}
# Modules that are entry points (they start the CLI), ranked with cli.
ENTRY_POINTS = {
    "speclock.cli",
    "speclock.__main__",
    "speclock.patches.__main__",
    "speclock.tasks_from_cli",
}  # invoke tasks generated from the CLI parser

# Imported inside functions because importing them costs seconds or they are optional.
HEAVY = {
    "torch",
    "transformers",
    "safetensors",
    "numpy",
    "triton",
    "gguf",
    "vllm",
    "sglang",
    "cuda",
    "huggingface_hub",
    "tokenizers",
    "accelerate",
}
# Not heavy, imported on use: the CLI's declared dependencies (pyproject.toml), which an image need not carry.
OPTIONAL = {
    "packaging",
    "prometheus_client",
    "tomli_w",
    "pydantic",  # the document models' validator (0.2-0.6 s with a model's schema build): loaded when a document is read
    "pydantic_core",  # pydantic's own core, the same
    "cyclonedx",
    "packageurl",
}  # the SBOM library: 4.6 s to import, loaded only when an SBOM is made

# (importing module, imported module): a function-local speclock import phase A could not hoist.
# Phase B empties this list.
LOCAL_IMPORT_ALLOWLIST: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(mod: str, pkg_file: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_package(pkg_file) else mod.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _under_main_guard(tree: ast.Module) -> set[int]:
    """ids of nodes under `if __name__ == "__main__":` (entry code, not a library import)."""
    out = set()
    for n in tree.body:
        if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test):
            out |= {id(x) for x in ast.walk(n)}
    return out


def read_graph():
    """{module: [(imported speclock module, local?, lineno)]} and {module: set of top-level third-party roots}."""
    modules = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}
    edges: dict[str, list[tuple[str, bool, int]]] = {}
    top_roots: dict[str, set[str]] = {}
    local_heavy: dict[str, list[tuple[str, int]]] = {}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        top = {id(n) for n in tree.body}
        main_guard = _under_main_guard(tree)
        # imports in a module-level try/if (optional dependency probes) count as module level
        for n in tree.body:
            if isinstance(n, (ast.Try, ast.If)) and id(n) not in main_guard:
                top |= {id(x) for x in ast.walk(n)}
        out = []
        roots = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in main_guard:
                continue
            local = id(node) not in top
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = _resolve(mod, path, node)
                # `from speclock.x import y`: y may be a module of its own
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                if t == "speclock" or t.startswith("speclock."):
                    while t not in modules and "." in t:
                        t = t.rsplit(".", 1)[0]
                    out.append((t, local, node.lineno))
                elif local:
                    local_heavy.setdefault(mod, []).append((t, node.lineno))
                else:
                    roots.add(t.split(".")[0])
        edges[mod] = out
        top_roots[mod] = roots
    return modules, edges, top_roots, local_heavy


MODULES, EDGES, TOP_ROOTS, LOCAL_THIRD_PARTY = read_graph()


def layer(mod: str) -> str:
    if mod in ENTRY_POINTS:
        return "cli"
    parts = mod.split(".")
    if len(parts) < 2:
        return "cli"  # speclock/__init__.py holds __version__ only; it imports nothing
    return parts[1]


def heavy_at_import(mod: str, seen: set[str] | None = None) -> bool:
    """Does importing `mod` pull a heavy dependency (directly or through speclock modules it imports)?"""
    seen = seen if seen is not None else set()
    if mod in seen:
        return False
    seen.add(mod)
    if TOP_ROOTS.get(mod, set()) & HEAVY:
        return True
    return any(heavy_at_import(t, seen) for t, local, _ in EDGES.get(mod, []) if not local)


def test_every_package_has_a_rank():
    assert {layer(m) for m in MODULES} <= set(RANKS), "a new package: give it a rank in RANKS"


def test_speclock_init_imports_nothing():
    assert EDGES["speclock"] == []


def test_no_upward_or_sideways_imports():
    bad = []
    for mod, targets in EDGES.items():
        for t, _, line in targets:
            a, b = layer(mod), layer(t)
            if a == b or t == "speclock":
                continue
            if RANKS[b] >= RANKS[a]:
                bad.append(f"{mod}:{line} ({a}, rank {RANKS[a]}) imports {t} ({b}, rank {RANKS[b]})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_verify_does_not_import_train():
    assert not [(m, t) for m, ts in EDGES.items() if layer(m) == "verify" for t, _, _ in ts if layer(t) == "train"]


def test_no_import_cycles_between_modules():
    graph = {m: sorted({t for t, _, _ in ts if t != m}) for m, ts in EDGES.items()}
    # Only explicit imports count: a package __init__ that imports its own submodules (builders/,
    # kernels/) is no circle, but a submodule importing names back from that __init__ would be.
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph.get(m, []):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t) :] + [t]))
            elif not state.get(t):
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if not state.get(m):
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_function_local_speclock_imports_only_of_heavy_modules_or_allowlisted():
    bad = []
    used = set()
    for mod, targets in EDGES.items():
        for t, local, line in targets:
            if not local or t == mod:
                continue
            if (mod, t) in LOCAL_IMPORT_ALLOWLIST:
                used.add((mod, t))
                continue
            if heavy_at_import(t):
                continue
            bad.append(f"{mod}:{line} imports {t} inside a function; import it at module level")
    assert not bad, "\n".join(bad)
    assert not set(LOCAL_IMPORT_ALLOWLIST) - used, "stale allowlist entries: remove them"


def test_function_local_imports_are_heavy_optional_dependencies():
    """The standard library is imported at module level like everything else; inside a function only
    what is heavy (seconds to import) or optional (absent from a plain install)."""
    bad = []
    for mod, items in LOCAL_THIRD_PARTY.items():
        for name, line in items:
            root = name.split(".")[0]
            if root in HEAVY or root in OPTIONAL:
                continue
            bad.append(
                f"{mod}:{line} imports {name} inside a function: import it at module level"
                + (
                    " (standard library)"
                    if root in sys.stdlib_module_names
                    else "; or, if it is heavy or optional, add it to HEAVY/OPTIONAL"
                )
            )
    assert not bad, "\n".join(bad)


def test_function_local_imports_say_why():
    """Each function-local import (or the run of imports it belongs to) carries a comment."""
    bad = []
    for mod, path in MODULES.items():
        src = path.read_text()
        lines = src.split("\n")
        tree = ast.parse(src)
        top = {id(n) for n in tree.body}
        for n in tree.body:
            if isinstance(n, (ast.Try, ast.If)):
                top |= {id(x) for x in ast.walk(n)}
        local = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top]
        starts = {n.lineno: n for n in local}
        ends = {n.end_lineno: n for n in local}

        def gap(lines: list[str], line: int, step: int) -> int:
            """The next line from `line` in direction `step` past blank lines (isort's group separators)."""
            while 0 < line + step <= len(lines) and not lines[line + step - 1].strip():
                line += step
            return line + step

        for n in local:
            first = n
            while gap(lines, first.lineno, -1) in ends:  # the run of imports this one belongs to
                first = ends[gap(lines, first.lineno, -1)]
            run = [first]
            while gap(lines, run[-1].end_lineno, 1) in starts:
                run.append(starts[gap(lines, run[-1].end_lineno, 1)])
            commented = any("#" in lines[i] for x in run for i in range(x.lineno - 1, x.end_lineno))
            if not commented and not lines[first.lineno - 2].strip().startswith("#"):
                bad.append(f"{mod}:{n.lineno}: {ast.unparse(n)}")
    assert not bad, "function-local imports without a comment saying why:\n" + "\n".join(bad)


@pytest.mark.parametrize("mod", ["speclock.cli", "speclock.core.errors", "speclock.core.files", "speclock.spec.stack"])
def test_light_modules_pull_no_heavy_dependency(mod):
    assert not heavy_at_import(mod)
