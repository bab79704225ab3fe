"""Probes that prove a patch took effect: static ones read source, runtime ones import the engine.

Static probes also run on a wheel that is only downloaded; runtime probes run `speclock.engines.probe`
in the engine's own Python, so its imports are fresh and its packages are the ones checked.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TypedDict

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.jsonread import loads
from speclock.core.layout import IMPORT_ROOT
from speclock.core.scratch import make_run_folder, remove_run_folder, run_folder_env
from speclock.patches.diff import Patch
from speclock.patches.trees import SourceTree

# ---------------------------------------------------------------- static probes


class ProbeResult(TypedDict):
    """One probe's outcome, as the apply/verify records and the doctor's patches check carry it."""

    probe: str
    passed: bool
    reason: str


def _class_node(tree: ast.AST, cls: str) -> ast.ClassDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return node
    return None


def _names_of_class(node: ast.ClassDef) -> set[str]:
    names = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.add(base.id)
        elif isinstance(base, ast.Attribute):
            names.add(base.attr)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    return names


def run_static_probe(probe: list[str], tree: SourceTree) -> tuple[bool, str]:
    """Evaluate a static probe on source files; (passed, one-line reason)."""
    kind, args = probe[0], probe[1:]
    rel = args[0]
    source = tree.read(rel)
    if source is None:
        return False, f"{rel} does not exist"
    try:
        module = ast.parse(source)
    except SyntaxError as err:  # the engine's file (or an earlier patch's result) is not Python: the probe fails
        return False, f"{rel} does not parse as Python (line {err.lineno}: {err.msg})"
    except (ValueError, RecursionError) as err:
        return False, f"{rel} does not parse as Python ({err})"
    if kind == "class-has":
        cls, wanted = args[1], args[2:]
        node = _class_node(module, cls)
        if node is None:
            return False, f"{rel} defines no class {cls}"
        missing = [w for w in wanted if w not in _names_of_class(node)]
        if missing:
            return False, f"{cls} in {rel} lacks {', '.join(missing)}"
        return True, f"{cls} in {rel} has {', '.join(wanted)}"
    if kind == "list-admits":
        var, values = args[1], args[2:]
        found = None
        for stmt in ast.walk(module):
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == var for t in stmt.targets):
                found = stmt.value
        if found is None:
            return True, f"{rel} has no {var} gate any more (nothing to admit)"
        if not isinstance(found, (ast.List, ast.Tuple, ast.Set)):
            return False, f"{var} in {rel} is not a literal list"
        items = [e.value for e in found.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        # vLLM admits a model type when a listed name is a substring of it.
        missing = [v for v in values if not any(item in v for item in items)]
        if missing:
            return False, f"{var} in {rel} does not admit {', '.join(missing)}"
        return True, f"{var} in {rel} admits {', '.join(values)}"
    raise BadInput(f"unknown static probe {kind!r}")


def run_static_probes(patch: Patch, tree: SourceTree) -> list[ProbeResult]:
    return [
        ProbeResult(probe=" ".join(p), passed=ok, reason=why)
        for p in patch.static_probes
        for ok, why in [run_static_probe(p, tree)]
    ]


# ---------------------------------------------------------------- runtime probes


def run_runtime_probes(
    patch: Patch, engine: str, python: str | None = None, site_packages: Path | None = None
) -> list[ProbeResult]:
    """Run the patch's runtime probes in the engine's Python (a subprocess, so imports are fresh)."""
    out: list[ProbeResult] = []
    for probe in patch.runtime_probes:
        if probe[0] == "eagle3-supported":
            res = eagle3_probe(engine, probe[1:], python=python, site_packages=site_packages)
            for arch in probe[1:]:
                r = res[arch]
                out.append(
                    ProbeResult(
                        probe=f"eagle3-supported {arch}",
                        passed=bool(r.get("resolved") and r.get("eagle3")),
                        reason=r.get("reason", ""),
                    )
                )
    return out


def engine_subprocess(
    args: list[str], python: str | None = None, site_packages: Path | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """Run `python -m speclock.engines.probe ARGS` in the engine's Python; `site_packages` first on its path."""
    py = python or sys.executable
    env = dict(os.environ)
    paths = [str(IMPORT_ROOT)]  # the folder holding this speclock package
    paths += [str(site_packages)] if site_packages else []
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    run_folder = make_run_folder()  # importing vLLM makes torch's torchinductor_<user> in the temp folder (#40)
    env.update(run_folder_env(run_folder, env))
    try:
        return subprocess.run(
            [py, "-m", "speclock.engines.probe", *args], env=env, capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError:
        raise EnvironmentProblem(
            f"engine python {py} does not exist",
            hint="install the engine env (python -m speclock.engines.envs ensure NAME==VERSION)",
        ) from None
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"engine probe {' '.join(args[:2])} in {py} took over {timeout} s") from None
    finally:
        remove_run_folder(run_folder)


def last_json(proc: subprocess.CompletedProcess[str], what: str) -> Any:  # any JSON value: each caller checks its shape
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    try:
        return loads(last)
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"{what} failed: {tail}", hint="run `speclock doctor` for the engine-import check") from None


def eagle3_probe(
    engine: str, archs: list[str], python: str | None = None, site_packages: Path | None = None, timeout: int = 300
) -> dict[str, dict[str, Any]]:  # another process's answer, checked below only for the fields read here
    """{arch: {resolved, class, module, eagle3, reason}} from the engine's own registry and EAGLE-3 check."""
    proc = engine_subprocess(["eagle3", engine, *archs], python, site_packages, timeout)
    what = f"importing {engine} in {python or sys.executable}"
    res = last_json(proc, what)
    # The answer comes from another process: check its shape before any field is used.
    hint = "run `speclock doctor` for the engine-import check; rerun with SPECLOCK_DEBUG=1 to see the engine's output"
    if not isinstance(res, dict):
        raise EnvironmentProblem(f"{what}: the eagle3 probe answered a JSON {type(res).__name__}, not an object", hint=hint)
    for arch in archs:
        entry = res.get(arch)
        if not isinstance(entry, dict):
            raise EnvironmentProblem(f"{what}: the eagle3 probe's answer has no object for {arch!r}", hint=hint)
        for key, kind in (("resolved", bool), ("eagle3", (bool, type(None))), ("reason", str)):
            if key in entry and not isinstance(entry[key], kind):
                raise EnvironmentProblem(f"{what}: the eagle3 probe's '{arch}.{key}' is {type(entry[key]).__name__}", hint=hint)
    return res
