"""Stack files (`stacks/<name>.toml`): where they are, reading one, and the frozen `Stack` object.

A stack is read once, at the edge, into a `Stack`; nothing below re-reads the file. Its typed model is
spec.stack_types.StackDoc (spec.schema derives the field table and the JSON Schema from it), the checks are in
spec.validate.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclock.core import files
from speclock.core.errors import BadInput
from speclock.core.layout import REPO_ROOT
from speclock.spec.validate import STACK_NAME, validate

# The stack a command uses when none is named (every `--stack` default; `invoke` tasks take it from the CLI).
DEFAULT_STACK = "cpu-vllm"


@dataclass(frozen=True)
class Stack:
    """A validated stack file. `data` holds every section with defaults filled in."""

    name: str
    path: Path
    # The validated document: section name -> its table, and the top-level keys (schema, name, description) beside
    # them, nested sections flat ("smoke.thresholds"). Each table's keys and value types are the model's
    # (spec.stack_types: BaseSection, ...), checked by spec.validate; typing `data` by them waits for every reader
    # (verify/ too) to be strictly typed.
    data: dict[str, Any] = field(repr=False)
    source_sha256: str = ""

    def section(self, name: str) -> dict[str, Any]:
        table: dict[str, Any] = self.data[name]  # validate() makes every section a table (see `data`)
        return table

    @property
    def base(self) -> dict[str, Any]:
        return self.section("base")

    @property
    def python(self) -> dict[str, Any]:
        return self.section("python")

    @property
    def torch(self) -> dict[str, Any]:
        return self.section("torch")

    @property
    def engine(self) -> dict[str, Any]:
        return self.section("engine")

    @property
    def gpu(self) -> dict[str, Any]:
        return self.section("gpu")

    @property
    def target(self) -> dict[str, Any]:
        return self.section("target")

    @property
    def draft(self) -> dict[str, Any]:
        return self.section("draft")

    @property
    def smoke(self) -> dict[str, Any]:
        return self.section("smoke")

    @property
    def thresholds(self) -> dict[str, Any]:
        return self.section("smoke.thresholds")

    @property
    def patch_series(self) -> list[str]:
        return list(self.data["patches"]["series"])

    @property
    def engine_env(self) -> dict[str, str]:
        """engine.env: the environment the engine needs (validated: names and string values)."""
        return {str(k): str(v) for k, v in (self.engine.get("env") or {}).items()}

    @property
    def k_per_batch_size(self) -> tuple[tuple[int, int, int], ...]:
        """engine.k_per_batch_size as (first batch size, last batch size, k) rows; () when the stack sets none."""
        return tuple((int(a), int(b), int(c)) for a, b, c in self.engine.get("k_per_batch_size") or ())

    def engine_settings_for(self, arch: str | None) -> dict[str, Any]:  # free-form: passed through to the engine
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
    def prune(self) -> dict[str, list[str]]:
        """[prune]: packages left out of the install set and site-packages globs removed after it (docs/prune.md)."""
        section = self.data.get("prune") or {}
        return {"packages": list(section.get("packages") or []), "paths": list(section.get("paths") or [])}

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


def stacks_dir(root: Path | None = None) -> Path:
    return (root or REPO_ROOT) / "stacks"


def stack_path(name_or_path: str | os.PathLike[str], root: Path | None = None) -> Path:
    """Where a stack is: a NAME is a plain name resolved inside stacks/ (stacks/<name>.toml); a PATH is
    explicit (a Path object, or a string that ends in .toml or holds a '/') and must exist.

    So `--stack cpu-vllm` never picks up a file or folder called cpu-vllm in the working directory,
    and a name never leaves stacks/ (upgrade candidates, written elsewhere, are passed as paths)."""
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or "/" in text or os.sep in text or text.endswith(".toml"):
        path = Path(text)
        if files.absent(path):  # a link loop or a FIFO is not "no stack file": the reader names it
            raise BadInput(
                f"no stack file {path}",
                hint=f"give an existing stack file, or a stack name; known stacks: {', '.join(known_stacks(root)) or 'none'}",
            )
        return path
    return _named_path(text, root)


def _named_path(name: Any, root: Path | None, source: str | None = None) -> Path:
    where = f"{source}: " if source else ""
    if not isinstance(name, str) or not STACK_NAME.match(name):
        raise BadInput(
            f"{where}stack name {files.short_repr(name)} is not a plain stack name",
            hint="a stack name is a file name in stacks/ without .toml (letters, digits, '.', '_', '-'); "
            "a stack elsewhere is given as a path to its .toml file",
        )
    path = files.confined(stacks_dir(root), f"{name}.toml", what="stack", source=source)
    if files.absent(path):
        raise BadInput(f"{where}no stack file {path}", hint=f"known stacks: {', '.join(known_stacks(root)) or 'none'}")
    return path


def known_stacks(root: Path | None = None) -> list[str]:
    try:
        return sorted(p.stem for p in stacks_dir(root).glob("*.toml"))
    except OSError:
        return []


def load_stack(name_or_path: str | Path, root: Path | None = None) -> Stack:
    """Read and validate a stack by name (stacks/<name>.toml) or by path (see `stack_path`)."""
    return _load(stack_path(name_or_path, root), root)


def load_stack_named(name: Any, root: Path | None = None, *, source: str | None = None) -> Stack:
    """A stack by NAME only (a name that comes from data, e.g. a report's `stack`): never a path."""
    return _load(_named_path(name, root, source), root)


def _load(path: Path, root: Path | None = None) -> Stack:
    """`root`: the checkout the stack belongs to (its stacks/ and the files its paths name); default this one."""
    hint = "give a stack file (TOML, UTF-8); see `speclock stack schema`"
    text = files.read_text(path, what="stack file", hint=hint)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise BadInput(f"{path}: not valid TOML: {err}", hint="fix the syntax at the line and column given") from None
    except RecursionError:
        raise BadInput(f"{path}: not valid TOML: nested too deeply", hint="fix the file") from None
    data = validate(raw, path, root or REPO_ROOT)
    return Stack(name=data["name"], path=path, data=data, source_sha256=canonical_sha256(pinned_view(data)))


# Keys that never change what a lock resolves (how the smoke test runs and judges, which drafter
# folder is copied): editing them needs no re-lock.
UNPINNED = (
    "description",
    "draft",
    "smoke.thresholds",
    "smoke.num_prompts",
    "smoke.max_tokens",
    "smoke.num_speculative_tokens",
    "smoke.profile",
    "smoke.profiles",
    "smoke.attention_backends",
    "smoke.attention_backend_setting",
    "smoke.speed_prompts",
    "smoke.speed_max_tokens",
    "smoke.speed_repeats",
    "smoke.speed_concurrent",
    "serve.num_speculative_tokens",
    "engine.k_per_batch_size",  # a run-time knob, like serve's k: the lock's wheels do not depend on it
)


def pinned_view(data: Any) -> Any:
    """The stack as locks see it: UNPINNED keys and empty values dropped, so neither a threshold edit
    nor a new optional key with an empty default puts existing locks out of date."""
    view = copy.deepcopy(data)
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
