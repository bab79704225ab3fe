"""Smoke's inputs: the typed options, the paths and settings resolved from them (flags, else the image
layout, else the stack), the output folder made up front, and the shared flags of smoke, soak and selfcheck."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from speclock.core.args import int_range, non_negative_float
from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import clean_stale_temps, os_error
from speclock.core.layout import IMAGE, REPO_ROOT, in_image
from speclock.drafter.models import draft_folder, read_drafter_manifest, require_runnable_model, target_folder
from speclock.engines import DEFAULT_CONCURRENCY
from speclock.spec.profile_values import PROFILES
from speclock.spec.prompts import load_prompts, packaged_file
from speclock.spec.stack import DEFAULT_STACK, load_stack
from speclock.verify.model_pin import ALLOW_FLAG, check_served
from speclock.verify.profiles import Profile, resolve_profile
from speclock.verify.report_types import IdentityCheck


def log(msg: str) -> None:
    print(f"smoke: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SmokeOptions:
    """The smoke flags (add_smoke_arguments), as the CLI of smoke, soak and selfcheck parsed them."""

    stack: str | None = None
    target: str | None = None
    draft: str | None = None
    prompts: str | None = None
    num_prompts: int | None = None
    max_tokens: int | None = None
    profile: str | None = None
    reference: str = "recorded"
    server: str | None = None
    plain_server: str | None = None
    min_mean_acceptance_length: float | None = None
    min_speedup: float | None = None  # no flag yet: a threshold override a caller may set
    max_reference_gap: float | None = None  # no flag yet: idem
    plain_cache: str | None = None
    concurrency: int = DEFAULT_CONCURRENCY  # server mode: requests in flight at once (smoke --concurrency)
    speed_prompts: int | None = None  # batch-1 speed overrides of smoke.speed_* (--speed-prompts ...)
    speed_max_tokens: int | None = None
    speed_repeats: int | None = None
    speed_concurrent: int | None = None  # speed under load: requests at once (--speed-concurrent)
    out: str | None = None
    allow_other_model: bool = False  # serve a model folder whose identity differs from the lock's (marked in the report)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SmokeOptions:
        """The options from a parsed command line (the CLI functions only; a missing flag keeps its default)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


@dataclass
class SmokeInputs:
    stack: Any  # speclock.spec.stack.Stack
    target: Path
    draft: Path
    prompts_file: Path
    num_prompts: int
    max_tokens: int
    k: int
    out_dir: Path
    reference: str = "recorded"  # recorded | live | off
    server_url: str = ""  # spec-decoding server (attach instead of starting the engine)
    plain_server_url: str = ""  # the same model served without a drafter
    thresholds: dict[str, Any] = field(default_factory=dict)
    plain_cache: Path | None = None  # reuse no-drafter outputs across runs (fault sweeps, tests)
    concurrency: int = DEFAULT_CONCURRENCY  # server mode: requests in flight at once
    profile: Profile | None = None  # quick | full | sampled (speclock.verify.profiles)
    speed_prompts: int = 16  # batch 1: the first N prompts, one request at a time (speclock.verify.speed)
    speed_max_tokens: int = 128
    speed_repeats: int = 3  # runs per engine (plain, drafted, plain again); 0 = speed not measured
    speed_concurrent: int = 0  # speed under load: requests at once; 0 = not measured (speclock.verify.speed)
    run_id: str = ""  # the report's run.id (selfcheck passes its own; empty: a new one)
    identity: dict[str, IdentityCheck] = field(default_factory=dict)  # "target"/"draft" against the lock (model_pin)


# ---------------------------------------------------------------- inputs

SPEED_KEYS = ("speed_prompts", "speed_max_tokens", "speed_repeats", "speed_concurrent")  # smoke.speed_*, and their flags


def default_out_dir(stack_name: str) -> Path:
    return Path("/tmp/speclock-out") if in_image() else REPO_ROOT / "out" / f"smoke-{stack_name}"


def resolve_inputs(opts: SmokeOptions) -> SmokeInputs:
    """Paths from the flags, else from the image layout (inside an image), else from the stack."""
    inside = in_image()
    if opts.stack:
        stack = load_stack(opts.stack)
    elif inside:
        stack = load_stack(IMAGE.stack_file)
    else:
        stack = load_stack(DEFAULT_STACK)
    smoke = stack.smoke
    profile = resolve_profile(
        stack, opts.profile or smoke["profile"], source="--profile" if opts.profile else f"{stack.path}: key 'smoke.profile'"
    )
    target = target_folder(stack, opts.target)
    draft = draft_folder(stack, opts.draft)
    if opts.prompts:
        prompts = Path(opts.prompts)
    elif inside:
        prompts = IMAGE.prompts_file
    elif smoke["prompts_file"]:
        prompts = packaged_file(smoke["prompts_file"])
    else:
        raise BadInput(f"stack {stack.name} names no prompts", hint="--prompts FILE (JSONL)")
    # Every model file smoke reads is checked here, before an engine starts or anything is written.
    require_runnable_model(target, what="target", option="--target")  # weights and tokenizer too (#26)
    require_runnable_model(draft, what="draft", option="--draft", tokenizer=False)
    read_drafter_manifest(draft)  # optional, but when present its recorded references must be well-formed
    load_prompts(prompts)  # a bad prompt file is refused here, before --out is made (run_smoke reads it again: 80 lines)
    # the served folders against the identity the lock pins (target.path stacks): a different model is exit 2 here
    identity = check_served(stack, {"target": target, "draft": draft}, allow_other=opts.allow_other_model, log=log)
    thresholds = dict(stack.thresholds)
    for key in ("min_mean_acceptance_length", "min_speedup", "max_reference_gap"):
        override = getattr(opts, key)
        if override is not None:
            thresholds[key] = override
    n = opts.num_prompts or profile.num_prompts
    if n < 1 or (opts.max_tokens is not None and opts.max_tokens < 1):
        raise BadInput("--num-prompts and --max-tokens must be at least 1")
    out_dir = prepare_out_dir(Path(opts.out) if opts.out else default_out_dir(stack.name), "--out")
    plain_cache = prepare_out_dir(Path(opts.plain_cache), "--plain-cache") if opts.plain_cache else None
    speed = {key: getattr(opts, key) if getattr(opts, key) is not None else smoke[key] for key in SPEED_KEYS}
    return SmokeInputs(
        stack=stack,
        target=target,
        draft=draft,
        prompts_file=prompts,
        num_prompts=n,
        max_tokens=opts.max_tokens or profile.max_tokens,
        k=smoke["num_speculative_tokens"],
        out_dir=out_dir,
        reference=opts.reference,
        server_url=opts.server or "",
        plain_server_url=opts.plain_server or "",
        thresholds=thresholds,
        plain_cache=plain_cache,
        concurrency=opts.concurrency,
        profile=profile,
        identity=identity,
        **speed,
    )


def prepare_out_dir(path: Path, option: str) -> Path:
    """Create an output folder up front: a file in the way, no permission or a full disk is reported (exit 2/3)
    before the engine runs for minutes, not after."""
    if path.exists() and not path.is_dir():
        raise BadInput(f"{option} {path} is a file, where an output folder belongs", hint=f"give {option} a folder path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, path, "create the output folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise EnvironmentProblem(
            f"permission denied: cannot write into {path}", hint=f"give {option} a folder this user may write"
        )
    clean_stale_temps(path)  # temp files a killed run left (the writers' TEMP_PREFIX)
    return path


def server_url(text: str) -> str:
    """--server/--plain-server: an http(s) URL with a host (argparse type: anything else is exit 2 at parse time)."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL with a host (e.g. http://127.0.0.1:8000)")
    return text


def add_smoke_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", help="stack name or path (default: the image's stack; on the host cpu-vllm)")
    p.add_argument("--target", help="target model folder (default: the image's /opt/speclock/target)")
    p.add_argument("--draft", help="EAGLE-3 drafter folder (default: the image's, or the stack's draft.path)")
    p.add_argument("--prompts", help="JSONL prompt file (default: the image's, or the stack's MT-Bench questions)")
    p.add_argument(
        "--profile",
        choices=PROFILES,
        help="quick (default in an image: greedy, the stack's smoke.max_tokens), full (greedy, 256 tokens, per-position "
        "drift; what upgrade and GPU runs use) or sampled (temperature > 0 over several seeds, acceptance with a "
        "95%% confidence interval, gated two-sided); the stack's smoke.profile is the default (docs/smoke.md)",
    )
    p.add_argument(
        "--num-prompts",
        type=int_range(1, 100_000),
        help="prompts to use (default: the profile's, i.e. the stack's smoke.num_prompts)",
    )
    p.add_argument(
        "--max-tokens",
        type=int_range(1, 32_768),
        help="new tokens per prompt (default: the profile's: smoke.max_tokens, 256 for full)",
    )
    p.add_argument(
        "--reference",
        choices=["recorded", "live", "off"],
        default="recorded",
        help="engine-vs-reference comparison: the result recorded in the drafter's manifest (default), "
        "run the reference decoder now (slow on a CPU), or skip",
    )
    p.add_argument(
        "--server", type=server_url, help="URL of a running engine server with the drafter (instead of starting the engine)"
    )
    p.add_argument("--plain-server", type=server_url, help="URL of the same model served without a drafter (with --server)")
    p.add_argument(
        "--min-mean-acceptance-length",
        dest="min_mean_acceptance_length",
        type=non_negative_float,
        help="override the stack's floor (e.g. to show that a too-high floor fails)",
    )
    p.add_argument(
        "--plain-cache",
        help="folder to keep and reuse no-drafter outputs, keyed by engine, settings, target, "
        "prompts and max_tokens (for sweeps over many drafters; a self-check runs both)",
    )
    add_speed_arguments(p)
    p.add_argument(
        ALLOW_FLAG,
        dest="allow_other_model",
        action="store_true",
        help="run a target (or drafter) folder whose identity differs from the one the stack's lock pins, instead of "
        "refusing it (exit 2); the report marks it (target.identity.allowed_other) and the gate WARNs",
    )
    p.add_argument(
        "--out", help="output folder for report.json (default: /tmp/speclock-out in an image, out/smoke-<stack> on the host)"
    )


def add_speed_arguments(p: argparse.ArgumentParser) -> None:
    """The batch-1 speed flags (smoke, selfcheck, soak; upgrade passes them to the candidate's self-check)."""
    p.add_argument(
        "--speed-prompts",
        type=int_range(1, 1000),
        help="batch-1 speed: prompts, one request at a time (default: the stack's smoke.speed_prompts)",
    )
    p.add_argument(
        "--speed-max-tokens",
        type=int_range(1, 4096),
        help="batch-1 speed: new tokens per request (default: smoke.speed_max_tokens)",
    )
    p.add_argument(
        "--speed-repeats",
        type=int_range(0, 20),
        help="batch-1 speed: runs per engine, median kept (default: "
        "smoke.speed_repeats; 0 = not measured, which fails a "
        "stack's min_speedup)",
    )
    p.add_argument(
        "--speed-concurrent",
        type=int_range(0, 4096),
        help="speed under load: requests at once, speed_repeats runs of at least 3 s per engine (default: "
        "smoke.speed_concurrent; 0 = not measured, which fails a stack's min_concurrent_speedup)",
    )
