"""host-env's questions to the host: which lock target this interpreter runs, whether its glibc runs the locked
wheels, and the packages `--use-host-packages` takes from the host's Python (version-checked, not hash-checked)."""

from __future__ import annotations

import fnmatch
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from speclock.build.hostenv.record import HostPackageRow
from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.jsonread import parse_json
from speclock.core.layout import REPO_ROOT
from speclock.core.names import normalize
from speclock.core.toolenv import tool_env
from speclock.drafter.models import readable_model_folder, stack_model_path
from speclock.spec.lock import IMAGE_TARGET, LockDoc, LockEntry, lock_target, lock_targets, target_names
from speclock.spec.stack import Stack

_LOCAL_CUDA = re.compile(r"cu(\d+)")


# ---------------------------------------------------------------- which target


def running_target() -> tuple[str, str]:
    """(python 'X.Y', machine) of the interpreter running this."""
    return f"{sys.version_info.major}.{sys.version_info.minor}", platform.machine()


def _relock_hint(stack_name: str, key: str) -> str:
    return (
        f"add '{key}' to python.host_targets in stacks/{stack_name}.toml, run `speclock lock --stack {stack_name}` "
        f"and `speclock fetch --stack {stack_name} --target {key}`, then run host-env again"
    )


def choose_target(doc: LockDoc, requested: str = "auto") -> str:
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
        raise BadInput(
            f"this host runs Python {py} on {machine} ({here}); the lock of stack {doc['stack']} has no target "
            f"for it, only: {target_names(doc)}",
            hint=_relock_hint(doc["stack"], here),
        )
    t = lock_target(doc, requested)
    if (t["python"], t["machine"]) != (py, machine):
        raise BadInput(
            f"target {requested} of stack {doc['stack']} is for Python {t['python']} on {t['machine']}; this host "
            f"runs Python {py} on {machine} ({here}); the lock has: {target_names(doc)}",
            hint=f"run host-env with a Python {t['python']} interpreter on {t['machine']}, or " + _other_target_hint(doc, here),
        )
    return requested


def _other_target_hint(doc: LockDoc, here: str) -> str:
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


def check_glibc(packages: list[LockEntry]) -> None:
    have = _glibc()
    if have is None:
        return  # not glibc (or unknown): pip's own tag check will say it
    old = [
        f"{p['filename']} (glibc {'.'.join(map(str, glibc_needed(p['filename'])))})"
        for p in packages
        if glibc_needed(p["filename"]) > have
    ]
    if old:
        raise EnvironmentProblem(
            f"this host's glibc is {have[0]}.{have[1]}; {len(old)} locked wheels need a newer one: " + ", ".join(old[:5]),
            hint="run on a host with a newer glibc (the lock's manylinux tags say which)",
        )


# ---------------------------------------------------------------- host packages


def select_host_packages(patterns: tuple[str, ...], packages: list[LockEntry], key: str) -> list[LockEntry]:
    """The target's packages named by --use-host-packages (names or fnmatch patterns, normalized); each pattern must
    match at least one, so a typo is bad input, not a silently hash-checked package."""
    chosen: dict[str, LockEntry] = {}
    for pattern in patterns:
        pat = normalize(pattern.strip()) if not any(c in pattern for c in "*?[") else pattern.strip().lower().replace("_", "-")
        hits = [p for p in packages if fnmatch.fnmatchcase(normalize(p["name"]), pat)]
        if not hits:
            raise BadInput(
                f"--use-host-packages: {pattern!r} matches no package of the lock's target {key}",
                hint="name packages the lock has (see the target's packages in the lock file), e.g. torch,triton",
            )
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


def host_versions(python: Path, names: list[str]) -> dict[str, dict[str, str] | None]:
    """{name: {version, location} or None} as the new environment's Python sees them (the host's site-packages)."""
    code = (
        "import json, sys, importlib.metadata as md\nout = {}\nfor n in sys.argv[1:]:\n"
        "    try:\n        d = md.distribution(n)\n        out[n] = {'version': d.version, 'location': str(d.locate_file(''))}\n"
        "    except md.PackageNotFoundError:\n        out[n] = None\nprint(json.dumps(out))\n"
    )
    proc = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, env=clean_env())
    if proc.returncode != 0:
        raise EnvironmentProblem(
            f"could not ask {python} for the host's packages: {proc.stderr.strip()[-500:]}",
            hint="check the host's Python installation",
        )
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    answer: dict[str, dict[str, str] | None] = parse_json(
        last, f"{python} -c ...", what="answer about the host's packages", error=EnvironmentProblem
    )
    return answer


def check_host_packages(python: Path, chosen: list[LockEntry], stack: Stack) -> list[HostPackageRow]:
    """EnvironmentProblem (exit 3) unless the host has each chosen package at the lock's version; the record rows."""
    found = host_versions(python, [p["name"] for p in chosen])
    rows: list[HostPackageRow] = []
    bad: list[str] = []
    for p in chosen:
        have = found.get(p["name"])
        if have is None:
            bad.append(f"{p['name']} is not installed (lock: {p['version']})")
        elif not version_matches(have["version"], p["version"], stack.gpu["cuda"]):
            bad.append(f"{p['name']} {have['version']} (lock: {p['version']})")
        else:
            rows.append(
                {
                    "name": p["name"],
                    "lock_version": p["version"],
                    "host_version": have["version"],
                    "location": have["location"],
                    "checked": "version",
                }
            )
    if bad:
        raise EnvironmentProblem(
            f"--use-host-packages: the host's Python does not have the locked versions: {'; '.join(bad)}",
            hint="install the lock's versions on the host, or leave those packages out of "
            "--use-host-packages so they come from the wheelhouse (hash-checked)",
        )
    return rows


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for pip and the env's Python: no PIP_* settings and no pip config files (the lock decides,
    not a find-links or constraint file of this machine), no PYTHONPATH of the caller; HOME under speclock's cache."""
    env = tool_env({k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, **extra)
    return env


# ---------------------------------------------------------------- the model folders the environment links to


def model_folders(stack: Stack, model: str | None, draft: str | None) -> tuple[str | None, str | None]:
    """(target, drafter) folders the env links to, resolved: --model and --draft checked (exit 2 naming the flag and
    path), and a target.path stack's folder taken when no --model is given: missing, exit 3 naming --model. Checked
    before anything is made; the image mounts the same folders read-only (`run-image --model/--draft`)."""
    if model:
        model = str(readable_model_folder(model, what=f"--model {model}", hint="give --model the target model's folder"))
    elif stack.target["path"]:
        folder = stack_model_path(REPO_ROOT, stack.target["path"], "target.path", stack.path)
        model = str(
            readable_model_folder(
                folder,
                what=f"{stack.path}: target.path {folder}",
                hint="add --model DIR (the target model's folder on this host), or put the model at target.path",
                absent=EnvironmentProblem,
            )
        )
    if draft:
        draft = str(readable_model_folder(draft, what=f"--draft {draft}", hint="give --draft an exported drafter's folder"))
    return model, draft
