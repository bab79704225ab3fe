"""Run a function on a module right after Python first imports it (used by fault injections loaded through a
`sitecustomize.py` on PYTHONPATH, in every process of an engine: tests/soak_decay, benchmarks/gpu/faults)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable[[ModuleType], None]):
        self.name, self.then = name, then

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # the real finders locate the module; this one only wraps its loading
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            self.then(module)

        # wrapping the loader's own method on this one loader object is the point of the hook
        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call then(module) once module `name` has been executed by its own loader."""
    sys.meta_path.insert(0, _AfterImport(name, then))
