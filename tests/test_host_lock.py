"""The build host's environment is locked (issue #38, item 5): scripts/requirements-host.lock.txt.

Fast: every line is one package at one exact version with a sha256; every input requirement (requirements-host,
-lint, -host-data) and every dependency pyproject.toml declares is in it at a version it allows; the cpu-vllm
lock's versions and wheels agree where both name a package; the stack's excluded CUDA packages are out; and the
lock is closed: each locked package's own requirements (read from this venv, which the bootstrap installed from
the lock) are locked too. Slow (PyPI): `scripts/lock_host.py --check` resolves the inputs afresh and finds the
committed lock unchanged.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "scripts" / "requirements-host.lock.txt"
INPUTS = ("requirements-host.txt", "requirements-lint.txt", "requirements-host-data.txt")
LINE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9-]*)==(?P<version>\S+)(?P<hashes>( --hash=sha256:[0-9a-f]{64})+)$")


def _lock() -> dict[str, tuple[str, set[str]]]:
    """name -> (version, sha256s); fails on any line that is not `name==version --hash=sha256:...`."""
    got: dict[str, tuple[str, set[str]]] = {}
    for n, line in enumerate(LOCK.read_text().splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, f"{LOCK.name}:{n}: {line!r} is not `name==version --hash=sha256:<64 hex>` (re-lock: scripts/lock_host.py)"
        name = m["name"]
        assert name == canonicalize_name(name), f"{LOCK.name}:{n}: {name} is not a canonical name"
        assert name not in got, f"{LOCK.name}:{n}: {name} twice"
        got[name] = (m["version"], set(re.findall(r"sha256:([0-9a-f]{64})", m["hashes"])))
    return got


def _inputs() -> list[tuple[str, Requirement]]:
    out = []
    for name in INPUTS:
        for line in (ROOT / "scripts" / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                out.append((name, Requirement(line)))
    return out


def _engine_lock() -> dict:
    return json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())


def test_every_entry_is_pinned_and_hashed():
    lock = _lock()
    assert len(lock) > 150, f"{LOCK.name} holds {len(lock)} packages: the whole host venv is locked"
    assert list(lock) == sorted(lock), f"{LOCK.name} is sorted by name (diffs stay readable)"
    for name, (version, _) in lock.items():
        assert str(Version(version)) == version, f"{LOCK.name}: {name}=={version} is not a normalized PEP 440 version"


def test_every_input_and_declared_dependency_is_locked():
    lock = _lock()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [("pyproject.toml", Requirement(r)) for r in project["dependencies"]]
    declared += [
        (f"pyproject.toml [{extra}]", Requirement(r)) for extra, reqs in project["optional-dependencies"].items() for r in reqs
    ]
    for where, req in [*_inputs(), *declared]:
        name = canonicalize_name(req.name)
        assert name in lock, f"{where}: {req} is not in {LOCK.name} (re-lock: python scripts/lock_host.py)"
        version = lock[name][0]
        assert req.specifier.contains(version, prereleases=True), f"{where}: {req}, but {LOCK.name} has {name}=={version}"
    for where, req in _inputs():
        if where != "requirements-host-data.txt":
            pins = [s for s in req.specifier if s.operator == "=="]
            assert pins, f"scripts/{where}: {req} is not pinned (==)"


def test_the_cpu_vllm_lock_agrees_and_its_excluded_packages_are_out():
    lock = _lock()
    engine = _engine_lock()
    shared = 0
    for pkg in engine["packages"]:
        name = canonicalize_name(pkg["name"])
        if name in lock:
            shared += 1
            version, hashes = lock[name]
            assert version == pkg["version"], f"{LOCK.name}: {name}=={version}, locks/cpu-vllm.lock: {pkg['version']}"
            assert pkg["sha256"] in hashes, f"{LOCK.name}: {name} lacks the cpu-vllm lock's wheel ({pkg['filename']})"
    assert shared > 100, f"only {shared} packages shared with the cpu-vllm lock: the host runs the image's engine"
    assert lock["torch"][0].endswith("+cpu"), "the host's torch is the CPU build the cpu-vllm lock pins"
    for name in engine["stack_data"]["python"]["exclude"]:
        assert canonicalize_name(name) not in lock, f"{LOCK.name} holds {name}, which the cpu-vllm stack excludes"


def test_the_lock_is_closed():
    """Each locked package's requirements (markers evaluated for this Python, extras followed) are locked too,
    or excluded by the cpu-vllm stack. The metadata is this venv's, so it must be the lock's own install."""
    lock = _lock()
    excluded = {canonicalize_name(n) for n in _engine_lock()["stack_data"]["python"]["exclude"]}
    stale = []
    for name, (version, _) in lock.items():
        try:
            if md.version(name) != version:
                stale.append(f"{name} {md.version(name)} (locked {version})")
        except md.PackageNotFoundError:
            stale.append(f"{name} missing")
    if stale:
        pytest.skip(f"this venv is not the lock's ({', '.join(stale[:3])}...): run scripts/bootstrap.sh")
    # Data wheels are installed without their dependencies; the rest are walked from the inputs down.
    todo = [(canonicalize_name(r.name), frozenset(r.extras)) for where, r in _inputs() if "data" not in where]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        for raw in md.requires(name) or []:
            req = Requirement(raw)
            envs = [{"extra": e} for e in sorted(extras)] or [{"extra": ""}]
            if req.marker and not any(req.marker.evaluate(env) for env in envs):
                continue
            dep = canonicalize_name(req.name)
            if dep in excluded:
                continue
            assert dep in lock, f"{name} requires {req}, which {LOCK.name} lacks (re-lock: python scripts/lock_host.py)"
            assert req.specifier.contains(lock[dep][0], prereleases=True), f"{name} requires {req}; locked {lock[dep][0]}"
            todo.append((dep, frozenset(req.extras)))
    walked = {n for n, _ in seen}
    data = {canonicalize_name(r.name) for where, r in _inputs() if "data" in where}
    assert set(lock) - walked - data == set(), f"{LOCK.name} holds packages nothing requires: {set(lock) - walked - data}"


def test_bootstrap_installs_the_lock_hash_checked():
    text = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert 'lock="$ROOT/scripts/requirements-host.lock.txt"' in text
    assert "--require-hashes --no-deps" in text, "the bootstrap installs the lock hash-checked, resolving nothing"


@pytest.mark.slow
def test_the_committed_lock_is_what_the_inputs_resolve_to():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lock_host.py"), "--check"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
