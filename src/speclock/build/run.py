"""`speclock run-image`: run a built image the way it runs in production: non-root, read-only root
filesystem, no network, no capabilities; under docker or podman, with or without GPUs (build.runtimes).
buildah-built images are copied into docker first; podman shares buildah's image store."""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
from pathlib import Path

from speclock.build.builders import ensure_in_docker
from speclock.build.records import read_record
from speclock.build.runtimes import (
    GPUS_HELP,
    HARDENED,
    NO_GPUS,
    RUNTIMES,
    Gpus,
    Mount,
    check_gpus,
    default_gpus,
    ensure_in_podman,
    extra_run_args,
    gpu_failure,
    parse_gpus,
    pick_runtime,
    podman_limit_args,
    run_argv,
    runtime_cli,
)
from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.layout import ImageLayout
from speclock.drafter.models import readable_model_folder
from speclock.spec.stack import DEFAULT_STACK, Stack, load_stack

__all__ = ["HARDENED", "model_mounts", "run_image"]

# The one documented place for models at run time (docs/run.md, "Where the model goes"): the image's own folders
# (containers/Containerfile's SPECLOCK_HOME, whatever this host's is), mounted read-only over them.
IN_IMAGE = ImageLayout(Path("/opt/speclock"))
MODEL_MOUNTS = {"--model": IN_IMAGE.target_dir, "--draft": IN_IMAGE.draft_dir}


def model_mount(option: str, value: str) -> Mount:
    """--model/--draft DIR as a read-only mount, checked before any container starts: an existing, readable, non-empty
    folder (not a symbolic-link loop), resolved; BadInput (exit 2) naming the flag and the path otherwise."""
    hint = f"give {option} the host folder of the model (a Hugging Face folder: config.json, weights, tokenizer)"
    real = readable_model_folder(value, what=f"{option} {value}", hint=hint)
    if ":" in str(real) or "," in str(real):  # `-v HOST:INSIDE:ro` cannot carry them
        raise BadInput(f"{option} {value}: the path {real} holds ':' or ',', which a bind mount cannot name", hint=hint)
    return Mount(str(real), str(MODEL_MOUNTS[option]), readonly=True)


def model_mounts(stack: Stack, model: str | None, draft: str | None) -> list[Mount]:
    """The read-only model mounts of a run. A target.path stack's image holds no target: without --model it is
    exit 3 naming the flag, before any container starts."""
    if not model and stack.target["path"]:
        raise EnvironmentProblem(
            f"stack {stack.name} serves its target from target.path ({stack.target['path']}): its image holds no "
            f"target, and none is mounted",
            hint=f"add --model DIR (the model's folder on this host; mounted read-only at {IN_IMAGE.target_dir})",
        )
    return [model_mount(option, value) for option, value in (("--model", model), ("--draft", draft)) if value]


def run_image(
    ref: str,
    args: list[str],
    *,
    out_dir: Path | None = None,
    capture_output: bool = False,
    timeout: int | None = None,
    env: dict[str, str] | None = None,
    stdout: int | None = None,  # a file descriptor for the run's output (None: this process's stdout)
    runtime: str = "docker",
    gpus: Gpus = NO_GPUS,
    mounts: list[Mount] | None = None,
) -> subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]:  # str output with capture_output
    # A name of our own, so a Ctrl-C (or a timeout) can remove the container: killing the client alone
    # would leave it running.
    name = f"speclock-run-{os.getpid()}-{secrets.token_hex(4)}"
    mounts = list(mounts or [])
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(out_dir, 0o777)  # the image runs as uid 10001
        mounts.insert(0, Mount(str(out_dir.resolve()), "/out"))
    # SPECLOCK_RUN_ARGS: extra `run` options, e.g. on a CI runner (ci/speclock-upgrade.yml).
    cmd = run_argv(
        runtime,
        ref,
        args,
        gpus=gpus,
        name=name,
        env=env,
        mounts=mounts,
        extra=extra_run_args(),
        cli=runtime_cli(runtime),
        limits=podman_limit_args() if runtime == "podman" else None,
    )
    try:
        if capture_output:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return subprocess.run(cmd, timeout=timeout, stdout=stdout)
    except BaseException:
        _remove_container(runtime, name)
        raise


def _remove_container(runtime: str, name: str) -> None:
    """Stop and remove a container we started (after Ctrl-C or a timeout); quietly, within seconds."""
    try:
        subprocess.run([*runtime_cli(runtime), "rm", "-f", name], capture_output=True, timeout=10)
    except (Exception, KeyboardInterrupt):  # cleanup only: never hide the interrupt or failure that led here
        pass


def _cmd_run(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    gpus_text = args.gpus or default_gpus(stack.is_gpu)
    gpus = parse_gpus(gpus_text)
    mounts = model_mounts(stack, args.model, args.draft)
    record = read_record(stack.name, args.builder, args.tag)
    runtime = pick_runtime(args.runtime)
    check_gpus(runtime, gpus, gpus_text)
    ref = ensure_in_podman(record) if runtime == "podman" else ensure_in_docker(record)
    extra = args.args[1:] if args.args[:1] == ["--"] else args.args
    print(
        f"running {ref} under {runtime} (--gpus {gpus_text}) {' '.join(extra) or '(default command)'}",
        file=sys.stderr,
        flush=True,
    )
    for mount in mounts:
        print(f"  mounted read-only: {mount.host} -> {mount.inside}", file=sys.stderr, flush=True)
    out_dir = Path(args.out) if args.out else None
    rc = run_image(ref, extra, out_dir=out_dir, runtime=runtime, gpus=gpus, mounts=mounts).returncode
    failure = gpu_failure(runtime, rc, gpus, gpus_text)
    if failure:
        raise failure
    return rc


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run-image",
        help="run a built image hardened (non-root, read-only, no network)",
        description="Run the last image built for a stack under docker or podman with production "
        "settings: user 10001, read-only root, tmpfs /tmp, no network, no capabilities "
        "(the same under both runtimes). Arguments after -- go to the image's speclock "
        "entrypoint (default: its self-check).",
    )
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--builder", default="buildah", choices=["buildah", "docker"], help="which builder's build to run")
    p.add_argument("--tag", help="content tag (default: the latest build)")
    p.add_argument("--out", help="host folder mounted at /out for reports")
    p.add_argument(
        "--model",
        metavar="DIR",
        help=f"the target model's folder on this host, mounted read-only at {IN_IMAGE.target_dir} (required for a "
        "stack with target.path: its image holds no target; docs/run.md, Where the model goes)",
    )
    p.add_argument(
        "--draft", metavar="DIR", help=f"a drafter folder mounted read-only at {IN_IMAGE.draft_dir}, over the image's own"
    )
    p.add_argument(
        "--runtime",
        default="auto",
        choices=["auto", *RUNTIMES],
        help="container runtime (default auto: docker when its daemon answers, else podman)",
    )
    p.add_argument(
        "--gpus",
        help=f"GPUs for the container: {GPUS_HELP} (default: all for a GPU stack, none for a "
        "CPU stack); docker --gpus, podman CDI devices nvidia.com/gpu",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the image's entrypoint")
    p.set_defaults(func=_cmd_run)
