"""What every doctor check reads: the options, the context (stack, engine Python, model folders,
target facts, the engine's answers), a check's result, and the DoctorCheck protocol."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict

from speclock.core.errors import BadInput
from speclock.core.layout import IMAGE, REPO_ROOT, in_image
from speclock.drafter.models import (
    config_architecture,
    read_drafter_manifest,
    read_model_config,
    require_model_folder,
    stack_model_path,
    target_folder,
)
from speclock.engines import envs as engine_envs
from speclock.engines import package_version
from speclock.patches.probes import engine_subprocess, last_json
from speclock.patches.trees import default_site_packages
from speclock.spec.stack import DEFAULT_STACK, Stack, load_stack

# Language-model class inside multimodal wrappers, by the text config's model_type.
INNER_BY_MODEL_TYPE = {
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
}


@dataclass(frozen=True)
class DoctorOptions:
    """`speclock doctor`'s options (the CLI builds them from its flags; selfcheck builds its own)."""

    stack: str | None = None
    python: str | None = None
    site_packages: str | None = None
    lock: str | None = None
    target: str | None = None
    draft: str | None = None
    arch: str | None = None
    only: str | None = None  # comma-separated check names
    json: bool = False
    allow_other_model: bool = False  # model-identity: a folder that differs from the lock's WARNs instead of failing


# A question to the engine: [probe name, [its arguments]], sent as JSON to speclock.engines.probe's batch.
Question = list[object]


class TargetFacts(TypedDict, total=False):
    """What target_facts() knows of the target (it sets every key, None where unknown); a Context's is empty until
    the runner sets it."""

    arch: str | None
    num_hidden_layers: int | None
    inner: str | None  # the language-model class inside a multimodal wrapper
    source: str | None  # where arch came from: the config's path, "drafter manifest" or "--arch"


@dataclass
class Check:
    name: str
    status: str  # pass | fail | warn | skip
    reason: str
    # Each check's own findings, JSON-ready, written into doctor's report as they are: open-ended per check (the
    # runner reads only exit_code, hint and table). A Mapping, so a check's TypedDict (an engine's answer) fits.
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    stack: Stack
    python: str | None  # the engine's Python; None when not available
    python_note: str
    site_packages: Path | None
    lock_path: Path | None
    target_dir: Path | None
    draft_dir: Path | None
    arch: str | None = None  # override of the target architecture
    # The engine's JSON answers by question name (ask_engine): each check checks the shape of its own answer.
    engine_answers: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None  # the drafter's manifest as read_drafter_manifest returns it (set by the runner)
    facts: TargetFacts = field(default_factory=TargetFacts)  # target_facts() (set by the runner)
    allow_other_model: bool = False  # --allow-other-model (model-identity)


class DoctorCheck(Protocol):
    """One doctor check: its name, whether it needs the engine's Python, the engine questions it needs
    asked (all checks' questions go to the engine in one subprocess), and the check itself."""

    name: str
    needs_engine: bool

    def questions(self, ctx: Context) -> dict[str, Question]: ...

    def run(self, ctx: Context) -> Check: ...


# ---------------------------------------------------------------- context


def resolve_python(stack: Stack, python: str | None) -> tuple[str | None, str]:
    """The engine's Python: --python, this one (if it has the pinned engine), or a cached engine env."""
    if python:
        return python, f"--python {python}"
    dist, version = stack.engine["package"], stack.engine["version"]
    if package_version(dist) == version:
        return sys.executable, f"this Python has {dist} {version}"
    if stack.engine["package"] in engine_envs.KNOWN:
        spec = f"{dist}=={version}"
        py = engine_envs.env_python(spec)
        if py:
            return str(py), f"cached engine env {py.parent.parent}"
        return None, (
            f"{dist} {version} is neither in this Python nor in a cached env; run: python -m speclock.engines.envs ensure {spec}"
        )
    return None, f"{dist} {version} is not installed in this Python ({sys.executable}); pass --python"


def _repo_path(rel: str, what: str, stack: Stack) -> Path | None:
    """A model path from the stack file: inside the repository (a stack is data; it must not point elsewhere)."""
    if not rel:
        return None
    return stack_model_path(REPO_ROOT, rel, what, stack.path)


def _given_file(value: str | None, option: str, what: str) -> Path | None:
    if not value:
        return None
    p = Path(value)
    if not p.exists():
        raise BadInput(f"{option} {p}: no {what} there", hint=f"give the path of an existing {what}")
    if p.is_dir():
        raise BadInput(f"{option} {p} is a directory, where the {what} file belongs", hint=f"give the {what} file itself")
    return p


def build_context(opts: DoctorOptions) -> Context:
    image = not opts.stack and (in_image() or IMAGE.lock_file.is_file())
    target: Path | None
    draft: Path | None
    if image:
        stack = load_stack(IMAGE.stack_file)
        lock = IMAGE.lock_file
        # A target.path stack's image holds no target: with nothing mounted, exit 3 naming --model (target_folder),
        # as smoke does, rather than a page of checks that each find the folder empty.
        target = target_folder(stack, None) if stack.target["path"] and in_image() and not opts.target else IMAGE.target_dir
        draft = IMAGE.draft_dir
    else:
        stack = load_stack(opts.stack or DEFAULT_STACK)
        lock = REPO_ROOT / "locks" / f"{stack.name}.lock"
        target = _repo_path(stack.target["path"], "target.path", stack) if stack.target["path"] else None
        draft = _repo_path(stack.draft["path"], "draft.path", stack)
    lock = _given_file(opts.lock, "--lock", "lock file") or lock
    if opts.target:
        # A folder named on the command line must be a model folder: a typo must not turn into a skipped check.
        target = require_model_folder(opts.target, what="target", option="--target")
        read_model_config(target, what="target", option="--target")
    if opts.draft:
        draft = require_model_folder(opts.draft, what="drafter", option="--draft")
        read_model_config(draft, what="drafter", option="--draft")
        read_drafter_manifest(draft)  # checked when present; `speclock doctor --draft` also requires it (runner)
    if opts.python and not Path(opts.python).is_file() and not shutil.which(opts.python):
        raise BadInput(
            f"--python {opts.python}: no Python executable there", hint="give the engine's python (a path or a command on PATH)"
        )
    python, note = resolve_python(stack, opts.python)
    site = None
    if opts.site_packages and not Path(opts.site_packages).is_dir():
        raise BadInput(f"--site-packages {opts.site_packages} is not a folder", hint="give the engine's site-packages folder")
    if python:
        site = Path(opts.site_packages) if opts.site_packages else default_site_packages(python)
    return Context(stack, python, note, site, lock, target, draft, opts.arch, allow_other_model=opts.allow_other_model)


# ---------------------------------------------------------------- target and drafter facts


def load_manifest(draft_dir: Path | None) -> dict[str, Any] | None:
    """The drafter's manifest, checked (speclock.drafter.models.read_drafter_manifest); None when there is none."""
    if not draft_dir or not Path(draft_dir).is_dir():
        return None
    return read_drafter_manifest(draft_dir)


def target_facts(ctx: Context, manifest: dict[str, Any] | None) -> TargetFacts:
    """Architecture, layer count and inner language-model class of the target."""
    facts: TargetFacts = {"arch": None, "num_hidden_layers": None, "inner": None, "source": None}
    target_dir = ctx.target_dir
    cfg_path = target_dir / "config.json" if target_dir else None
    if target_dir and cfg_path and (cfg_path.exists() or cfg_path.is_symlink()):
        cfg = read_model_config(target_dir, what="target")  # types checked: BadInput naming file and key
        text = cfg.get("text_config") or None
        facts["arch"] = config_architecture(cfg)
        facts["num_hidden_layers"] = cfg.get("num_hidden_layers") or (text or {}).get("num_hidden_layers")
        if text:
            facts["inner"] = config_architecture(text) or INNER_BY_MODEL_TYPE.get(text.get("model_type") or "")
        facts["source"] = str(cfg_path)
    if manifest and isinstance(manifest.get("target"), dict):
        t = manifest["target"]
        facts["arch"] = facts["arch"] or t.get("architecture")
        facts["num_hidden_layers"] = facts["num_hidden_layers"] or t.get("num_hidden_layers")
        facts["source"] = facts["source"] or "drafter manifest"
    if ctx.arch:
        facts["arch"], facts["source"] = ctx.arch, "--arch"
    return facts


# ---------------------------------------------------------------- engine questions (one subprocess)


def ask_engine(ctx: Context, request: dict[str, Question], timeout: int = 240) -> dict[str, Any]:
    env = ctx.stack.engine_env
    if env:  # the stack's engine.env, set in the engine's Python before any question imports the engine
        request = {"_engine_env": ["setenv", [env]], **request}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    try:
        proc = engine_subprocess(["batch", f.name], python=ctx.python, site_packages=ctx.site_packages, timeout=timeout)
    finally:
        Path(f.name).unlink(missing_ok=True)
    # The batch probe answers one JSON object, {question: answer}; each answer's shape is checked by its check.
    answers: dict[str, Any] = last_json(proc, f"asking {ctx.stack.engine['name']} in {ctx.python}")
    answers["_stderr_tail"] = proc.stderr.strip().splitlines()[-3:]
    return answers
