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
from speclock.spec.stack import DEFAULT_STACK, load_stack

__all__ = ["HARDENED", "run_image"]


def run_image(
    ref: str,
    args: list[str],
    *,
    out_dir: Path | None = None,
    capture_output: bool = False,
    timeout: int | None = None,
    env: dict[str, str] | None = None,
    stdout=None,
    runtime: str = "docker",
    gpus: Gpus = NO_GPUS,
) -> subprocess.CompletedProcess:
    # A name of our own, so a Ctrl-C (or a timeout) can remove the container: killing the client alone
    # would leave it running.
    name = f"speclock-run-{os.getpid()}-{secrets.token_hex(4)}"
    mounts = {}
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(out_dir, 0o777)  # the image runs as uid 10001
        mounts[str(out_dir.resolve())] = "/out"
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
    rc = run_image(ref, extra, out_dir=Path(args.out) if args.out else None, runtime=runtime, gpus=gpus).returncode
    failure = gpu_failure(runtime, rc, gpus, gpus_text)
    if failure:
        raise failure
    return rc


def add_commands(sub) -> None:
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
