"""Cached engine environments on the build host: real vllm / sglang installs that tests and
`speclock doctor --stack` import, installed at most once per machine and reused by CI.

The CUDA builds of the engines import on a CPU-only machine, so their model registries, EAGLE-3
interfaces and compiled libraries can be checked without a GPU. Each environment lives in
`cache_dir()/envs/<name>-<version>`; a marker file written last says it is complete, so an
interrupted install is wiped and redone instead of half-used. Installs go through uv with a
hardlinked package cache, so two engines that share torch's CUDA libraries store them once.

    python -m speclock.engines.envs ensure vllm==0.33.0      # idempotent; prints the python path
    python -m speclock.engines.envs list
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput, EnvironmentProblem, SpeclockError
from speclock.core.files import atomic_write_json, os_error, read_json
from speclock.core.heartbeat import Progress
from speclock.core.layout import cache_dir, cache_subdir
from speclock.core.locks import exclusive
from speclock.core.names import normalize
from speclock.core.toolenv import tool_env

MARKER = ".speclock-env.json"
KNOWN = ("vllm", "sglang")
# Extra requirements per release, where a resolver's choice breaks the engine's imports.
EXTRA = {
    # uv otherwise takes cuda-python 12.6 (no dependency on cuda-bindings), whose own cuda/bindings
    # files overwrite cuda-bindings 13 and break nvidia-cutlass-dsl, so vLLM cannot import Kimi-K2.5.
    "vllm==0.33.0": ["cuda-python>=13"],
}


def envs_root() -> Path:
    return cache_subdir("envs", what="engine env folder")


def parse_spec(spec: str) -> tuple[str, str]:
    name, sep, version = spec.partition("==")
    name = normalize(name.strip())
    version = version.strip()
    # The version names a folder that an incomplete install gets removed from: a plain version only.
    if not sep or name not in KNOWN or not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}", version):
        raise BadInput(
            f"engine spec {spec!r} is not NAME==VERSION with NAME in {', '.join(KNOWN)} and a plain version",
            hint="e.g. vllm==0.33.0 or sglang==0.5.23",
        )
    return name, version


def env_dir(spec: str) -> Path:
    name, version = parse_spec(spec)
    return envs_root() / f"{name}-{version}"


def env_python(spec: str) -> Path | None:
    """The python of a complete cached environment for `spec`, or None when it is not installed."""
    d = env_dir(spec)
    marker = d / MARKER
    if not marker.is_file():
        return None
    try:  # a marker that is not our JSON object (binary, torn, edited) means: not complete, redo
        info = read_json(marker, what="engine env marker")
    except BadInput:
        return None
    py = d / "bin" / "python"
    return py if info.get("spec") == spec and py.exists() else None


def env_python_for_dir(d: Path) -> Path | None:
    """The python of a cached env folder whose marker is complete (for `list`), else None."""
    try:
        info = read_json(d / MARKER, what="engine env marker")
    except BadInput:
        return None
    spec = info.get("spec")
    return (d / "bin" / "python") if isinstance(spec, str) and (d / "bin" / "python").exists() else None


def _base_python() -> str:
    # The interpreter behind the running venv, so the engine env gets the same minor version.
    return getattr(sys, "_base_executable", None) or sys.executable


def _uv() -> list[str]:
    exe = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(exe).exists():
        return [sys.executable, "-m", "uv"]
    return [exe]


def ensure(spec: str, log: Progress = print) -> Path:
    """Install `spec` (e.g. vllm==0.33.0) into its cached env unless already complete; return its python.

    One process installs at a time (a lock beside the env): another one that asked for the same env meanwhile
    would otherwise see the half-made env as an interrupted one and remove it under the installer."""
    py = env_python(spec)
    if py:
        return py
    d = env_dir(spec)
    with exclusive(
        d.with_name(d.name + ".lock"), on_wait=lambda: log(f"engine env {d}: another process is installing it; waiting")
    ):
        return _ensure_locked(spec, d, log)


def _ensure_locked(spec: str, d: Path, log: Progress) -> Path:
    py = env_python(spec)
    if py:  # made by the process this one waited for
        return py
    name, version = parse_spec(spec)
    if d.exists() or d.is_symlink():
        log(f"engine env {d}: incomplete from an earlier run, removing it")
        try:
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d)
            else:
                d.unlink()
        except OSError as err:
            raise os_error(err, d, "remove the incomplete engine env") from None
    uv_cache = cache_dir() / "uv"  # same filesystem as the envs, so installs hardlink from it
    env = tool_env(dict(os.environ, UV_CACHE_DIR=str(uv_cache), UV_LINK_MODE="hardlink"))
    if "SSL_CERT_FILE" not in env and Path("/etc/ssl/certs/ca-certificates.crt").exists():
        env["SSL_CERT_FILE"] = "/etc/ssl/certs/ca-certificates.crt"  # intercepting proxies
    t0 = time.time()
    log(f"engine env {d}: creating with {_base_python()}")
    _run(_uv() + ["venv", "--python", _base_python(), str(d)], env=env, what=f"creating the env {d}", stdout=subprocess.DEVNULL)
    cmd = _uv() + ["pip", "install", "--python", str(d / "bin" / "python"), f"{name}=={version}", *EXTRA.get(spec, [])]
    log(f"engine env {d}: {' '.join(cmd[1:])}")
    _run(cmd, env=env, what=f"installing {spec} into {d}")
    freeze = _run(
        _uv() + ["pip", "freeze", "--python", str(d / "bin" / "python")],
        env=env,
        what=f"listing the packages of {d}",
        capture_output=True,
        text=True,
    ).stdout
    info = {"spec": spec, "installed_s": round(time.time() - t0, 1), "packages": freeze.split()}
    # The marker is written last and atomically (fsynced): it exists only for a complete env.
    atomic_write_json(d / MARKER, info, indent=1)
    log(f"engine env {d}: ready in {info['installed_s']} s")
    return d / "bin" / "python"


# kw goes to subprocess.run as given (stdout=, capture_output=, text=): its output is str or bytes as text= says
def _run(cmd: list[str], *, env: dict[str, str], what: str, **kw: Any) -> subprocess.CompletedProcess[Any]:
    """Run uv; a missing uv or a failed step is an environment problem (exit 3), not a traceback."""
    try:
        proc = subprocess.run(cmd, env=env, **kw)
    except OSError as err:
        raise EnvironmentProblem(
            f"{what}: cannot run {cmd[0]}: {err.strerror or err}", hint="install uv (pip install uv) in the speclock environment"
        ) from None
    if proc.returncode != 0:
        raise EnvironmentProblem(
            f"{what} failed (exit {proc.returncode})",
            hint="see the uv output above; the env is left incomplete and is redone on the next run",
        )
    return proc


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except SpeclockError as err:
        print(f"speclock.engines.envs: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("speclock.engines.envs: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m speclock.engines.envs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("ensure", help="install engine envs unless cached; print each python path")
    e.add_argument("specs", nargs="+", help="NAME==VERSION, e.g. vllm==0.33.0")
    sub.add_parser("list", help="list cached engine envs")
    args = p.parse_args(argv)
    if args.cmd == "ensure":
        for spec in args.specs:
            print(ensure(spec, log=lambda m: print(m, file=sys.stderr, flush=True)))
        return 0
    for d in sorted(envs_root().iterdir()):
        if d.name.endswith(".lock") and d.is_file():  # an install's lock (ensure), not an env
            continue
        marker = d / MARKER
        state = "ready" if marker.is_file() and env_python_for_dir(d) else "incomplete"
        print(f"{d.name:24} {state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
