"""`speclock host-env`: a stack's locked environment on a GPU host without a container runtime.

The lock carries a target per Python version x machine (spec.lock); this builds the running host's
target as a virtual environment laid out like the image's /opt/speclock, so `DIR/bin/speclock
selfcheck` (or `speclock selfcheck --env DIR`) runs doctor, smoke and gate there the way an image does:

    DIR/bin/python            the venv's Python (the host's interpreter)
    DIR/bin/speclock          runs speclock with the image's environment: SPECLOCK_HOME=DIR/speclock,
                              SPECLOCK_IN_IMAGE=1 (the image layout), offline model hubs, engine.env
    DIR/speclock/             what the image has in /opt/speclock: stacks/<stack>.toml, lock.json (the
                              lock as this target sees it, spec.lock.target_lock), locks/<stack>.lock (the
                              same), target/ (converted from the GGUF wheel; a link to --model DIR or to
                              target.path where the image mounts it), prompts/prompts.jsonl (from
                              the prompts wheel), draft/, patches/, baselines/, patches-applied.json, src/
                              (this speclock), host-env.json (the record: stack, lock, target, what was
                              hash-checked and what was only version-checked)

Every wheel comes from the wheelhouse (`speclock fetch --stack S --target T`), is hash-checked here and
again by pip (`pip install --no-index --no-deps --require-hashes`); nothing is downloaded. The build
happens in DIR.tmp-<pid> and is renamed to DIR at the end: a failure or Ctrl-C (exit 130) removes the
temp folder, and the parent folders this run made, and leaves no DIR (a temp folder a killed run left is
removed by the next run).

What goes in is the image's plan (build.envplan): the same wheels, the same [prune] hook, the same kernel build
(build.hostenv.venv carries it out; build.hostenv.host asks the host).

`--use-host-packages torch,triton,nvidia-*` takes those packages from the host's Python instead
(`--system-site-packages`): each must be installed there at the lock's version. A local version label
on the host (2.11.0+cu130) matches a lock version without one (2.11.0) when it names the stack's CUDA
release (gpu.cuda 13.0 -> +cu130; torch 2.11.0 on PyPI IS the cu130 build); any other difference is
refused. Those packages are recorded as version-checked, not hash-checked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import NoReturn

from speclock.build.envplan import plan_environment
from speclock.build.hostenv.host import check_glibc, choose_target, model_folders, select_host_packages

# glibc_needed, version_matches, RECORD, read_record, RUN_ENV: host-env's API, as doctor, selfcheck and the tests import it
# (the `X as X` form re-exports them for mypy's strict mode).
from speclock.build.hostenv.host import glibc_needed as glibc_needed
from speclock.build.hostenv.host import version_matches as version_matches
from speclock.build.hostenv.record import RECORD as RECORD
from speclock.build.hostenv.record import HostEnvRecord
from speclock.build.hostenv.record import read_record as read_record
from speclock.build.hostenv.venv import RUN_ENV as RUN_ENV
from speclock.build.hostenv.venv import HostEnvOptions, build_env, find_wheels
from speclock.core.errors import BadInput
from speclock.core.files import os_error, pid_alive
from speclock.core.heartbeat import Progress
from speclock.core.names import normalize
from speclock.kernels.build import check_host_compiler
from speclock.spec.lock import lock_path, read_lock, target_lock
from speclock.spec.stack import DEFAULT_STACK, load_stack


def clean_stale_builds(dest: Path) -> list[Path]:
    """Remove DIR.tmp-<pid> / DIR.old-<pid> folders whose process is gone (a killed host-env)."""
    removed = []
    for p in dest.parent.glob(f"{dest.name}.*-*"):
        m = re.fullmatch(re.escape(dest.name) + r"\.(tmp|old)-(\d+)", p.name)
        if m and p.is_dir() and not p.is_symlink() and (int(m[2]) != os.getpid()) and not pid_alive(int(m[2])):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


# ---------------------------------------------------------------- the build


def build_host_env(opts: HostEnvOptions, progress: Progress = print) -> HostEnvRecord:
    """Build the environment; returns its record. See the module docstring."""
    started = time.monotonic()
    if not opts.dest:
        raise BadInput("--dest is required", hint="give the folder to create, e.g. --dest ~/envs/cpu-vllm")
    stack = load_stack(opts.stack)
    model, draft = model_folders(stack, opts.model, opts.draft)  # checked before anything is made
    opts = replace(opts, model=model, draft=draft)
    lock_file = Path(opts.lock) if opts.lock else lock_path(stack)
    full = read_lock(lock_file, stack=stack)
    key = choose_target(full, opts.target)
    plan = plan_environment(stack, target_lock(full, key))  # the image's plan, for this target's lock
    view = plan.lock  # lock.json of the env: this target only, its lock_from the full lock
    host = select_host_packages(opts.host_packages, plan.packages, key) if opts.host_packages else []
    host_names = {p["name"] for p in host}
    if normalize(stack.engine["package"]) in host_names and stack.patch_series:
        raise BadInput(
            f"--use-host-packages takes the engine {stack.engine['package']} from the host, but stack {stack.name} "
            "patches it (patches.series): a host's site-packages is never patched",
            hint=f"leave {stack.engine['package']} out of --use-host-packages",
        )
    install = [p for p in plan.packages if p["name"] not in host_names]
    toolchain = plan.kernel_toolchain if stack.kernels and not opts.kernels else []
    needed = list({p["filename"]: p for p in install + plan.assets + toolchain}.values())
    check_glibc(needed)
    if stack.kernels:
        _check_kernels_input(opts, stack.name)
    elif opts.kernels:
        raise BadInput(
            f"--kernels {opts.kernels}: stack {stack.name} builds no speclock kernels (kernels.build is empty)",
            hint="leave --kernels out, or add kernels.build to the stack and re-lock",
        )
    dest = Path(opts.dest).expanduser().absolute()
    if dest.exists() or dest.is_symlink():
        if not dest.is_dir():
            raise BadInput(f"--dest {dest} is a file, not a folder", hint="give the path of a new folder for the environment")
        if not opts.force:
            try:
                rec = read_record(dest)
                same = (
                    rec["lock_sha256"],
                    rec["target"],
                    sorted(rec["host_packages_requested"]),
                    rec.get("target_folder"),
                    rec.get("draft_folder"),
                ) == (full["lock_sha256"], key, sorted(opts.host_packages), opts.model, opts.draft)
            except BadInput:
                same = False
            if same:
                progress(
                    f"{dest} is already the host environment of {stack.name} (target {key}, lock {full['lock_sha256'][:12]})"
                )
                return rec
            raise BadInput(
                f"--dest {dest} exists",
                hint="give a new folder, or --force to replace it (it is replaced only once the new environment is complete)",
            )
    made = _make_parents(dest)
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    try:
        for stale in clean_stale_builds(dest):
            progress(f"  removed {stale}, left by a host-env run that was killed")
        try:
            tmp.mkdir()  # now, not after minutes of hashing: a folder no one may write to fails at once
        except OSError as err:
            raise os_error(err, dest, "create --dest") from None
        progress(
            f"host environment for {stack.name}: target {key} (Python {view['python']['version']}), {len(install)} "
            f"wheels hash-checked from the wheelhouse"
            + (f", {len(host)} from the host: {', '.join(sorted(host_names))}" if host else "")
        )
        wheels = find_wheels(needed, Path(opts.wheelhouse) if opts.wheelhouse else None, stack.name, key)
        record = build_env(plan, full, key, install, host, wheels, tmp, dest, opts, progress)
        _swap_in(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in reversed(made):  # the parents this run made, deepest first; only while empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    progress(
        f"host environment ready in {time.monotonic() - started:.0f} s: {dest}\n"
        f"  run: {dest}/bin/speclock selfcheck    (or: speclock selfcheck --env {dest})"
    )
    return record


def _check_kernels_input(opts: HostEnvOptions, stack_name: str) -> None:
    """Before anything is made: --kernels is a built library, else this host can build one (a C++ compiler for nvcc)."""
    if opts.kernels:
        if not all((Path(opts.kernels) / f).is_file() for f in ("kernels.json", "libspeclock_fp8.so")):
            raise BadInput(
                f"--kernels {opts.kernels}: not a built kernel library (needs kernels.json and libspeclock_fp8.so)",
                hint=f"copy /opt/speclock/kernels out of the image of {stack_name} (docker cp), or leave "
                "--kernels out: host-env builds the library with the lock's nvcc and the host's g++",
            )
        return
    check_host_compiler()  # exit 3 naming g++ and --kernels (kernels.build of the stack needs a library)


def _make_parents(dest: Path) -> list[Path]:
    """Make the missing parent folders of `dest`; returns those made (outermost first). An OSError removes them again
    and is turned into an error naming --dest (exit 2: a part is a file; 3: not writable, read-only file system)."""
    missing = []
    folder = dest.parent
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    made: list[Path] = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
    except OSError as err:
        for folder in reversed(made):
            folder.rmdir()
        raise os_error(err, err.filename or dest.parent, "create the parent folder of --dest") from None
    return made


def _swap_in(tmp: Path, dest: Path) -> None:
    """tmp -> dest; an old dest (--force) is moved aside first and removed after."""
    old = None
    if dest.exists() or dest.is_symlink():
        old = dest.with_name(f"{dest.name}.old-{os.getpid()}")
        os.rename(dest, old)
    try:
        os.rename(tmp, dest)
    except OSError:
        if old is not None:
            os.rename(old, dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- running speclock inside an environment


def env_command(env_dir: Path, args: list[str]) -> list[str]:
    """The command that runs `speclock ARGS` inside a host environment (its bin/speclock), checked."""
    env_dir = Path(env_dir).expanduser().absolute()
    read_record(env_dir)
    script = env_dir / "bin" / "speclock"
    if not script.is_file():
        raise BadInput(f"{env_dir} has no bin/speclock", hint="re-create it with `speclock host-env --force`")
    return [str(script), *args]


def _cmd_host_env(args: argparse.Namespace) -> int:
    patterns = tuple(p for p in (args.use_host_packages or "").split(",") if p.strip())
    opts = HostEnvOptions(
        stack=args.stack,
        dest=args.dest,
        target=args.target,
        wheelhouse=args.wheelhouse,
        host_packages=patterns,
        lock=args.lock,
        force=args.force,
        kernels=args.kernels,
        model=args.model,
        draft=args.draft,
    )
    out = (lambda m: print(m, file=sys.stderr)) if args.json else print

    def on_term(
        signum: int, frame: FrameType | None
    ) -> NoReturn:  # a `kill` cleans up like Ctrl-C: the temp folder goes, exit 130
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        record = build_host_env(opts, progress=out)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(
            json.dumps(
                {
                    "stack": record["stack"],
                    "target": record["target"],
                    "lock_sha256": record["lock_sha256"],
                    "python": record["python"],
                    "machine": record["machine"],
                }
                | {
                    "dest": str(Path(args.dest).expanduser().absolute()),
                    "hash_checked": len(record["hash_checked"]),
                    "version_checked": [r["name"] for r in record["version_checked"]],
                },
                indent=2,
            )
        )
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "host-env",
        help="build a stack's locked environment on a host without containers (a venv)",
        description="Build the lock's target for this host's Python and machine as a venv at DEST, offline "
        "from the wheelhouse (hash-checked, pip --no-index --require-hashes), laid out like the "
        "image (pruned as [prune] says, target converted, prompts, drafter, patches applied, "
        "kernels built for kernels.build), so that `DEST/bin/speclock "
        "selfcheck` runs doctor, smoke and gate there. Built in DEST.tmp-<pid>, renamed at the "
        "end. Exit 2: no target for this host's Python/machine (add it to python.host_targets "
        "and re-lock), DEST exists or is a file; 3: DEST not writable, no g++ for a stack "
        "with kernels.build (or pass --kernels), a wheel missing from the wheelhouse (`speclock fetch "
        "--target T`), a host package missing or at another version; 1: a wheel with the wrong "
        "sha256. docs/host-env.md.",
    )
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--dest", required=True, metavar="DIR", help="the environment folder to create (must not exist, or --force)")
    p.add_argument(
        "--target",
        default="auto",
        metavar="TARGET",
        help="the lock's target: 'auto' (default: this host's '<python>-<machine>', else the image target when "
        "the host runs the image's Python), 'image', or a host target such as '3.12-x86_64'",
    )
    p.add_argument(
        "--wheelhouse",
        metavar="DIR",
        help="where the wheels are: fetch's store (<sha256>/<file>, default "
        "$SPECLOCK_CACHE/wheelhouse) or a plain folder of wheels",
    )
    p.add_argument(
        "--use-host-packages",
        metavar="NAMES",
        default="",
        help="comma-separated packages (or patterns: 'nvidia-*') the host's Python already has at the lock's "
        "versions, used from there (--system-site-packages), version-checked instead of hash-checked",
    )
    p.add_argument("--lock", metavar="PATH", help="the lock to use (default locks/<stack>.lock)")
    p.add_argument(
        "--kernels",
        metavar="DIR",
        help="for stacks with kernels.build: take speclock's built kernel library from "
        "DIR (kernels.json and libspeclock_fp8.so, e.g. /opt/speclock/kernels copied out of the stack's image) "
        "instead of building it here with the lock's nvcc wheels and the host's g++",
    )
    p.add_argument(
        "--model",
        metavar="DIR",
        help="the target model's folder: DEST/speclock/target links to it (the image's read-only mount at "
        "/opt/speclock/target, as `run-image --model`); default for a stack with target.path: that folder",
    )
    p.add_argument("--draft", metavar="DIR", help="a drafter folder: DEST/speclock/draft links to it instead of the stack's copy")
    p.add_argument("--force", action="store_true", help="replace DEST if it exists (only once the new one is complete)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_cmd_host_env)
