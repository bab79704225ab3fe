"""`speclock nix-check`: verify flake.nix against the lock files, offline, with the host's nix.

What it runs (and what tests/test_nix_*.py run too):
  * `nix-instantiate --parse` on every .nix file;
  * `nix eval --json .#lib.stacks` compared with every locks/*.lock (engine, torch, CUDA, archs,
    patches, every wheel's URL and sha256);
  * `nix build --offline .#checks.x86_64-linux.*` WITHOUT nixpkgs (the checks use builtins only);
  * `nix flake check --offline` with nixpkgs replaced by the test double in nix/nixpkgs-double,
    which only proves the nixpkgs-dependent outputs evaluate to derivations of the right shape.
Packages and dev shells are built for real only where nixpkgs is reachable (`nix build .#...`).

Flakes see only git-tracked files, so the checks run on a scratch copy of the tracked (and
untracked, not ignored) files, `git add`ed; the checkout itself is never modified.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.heartbeat import Progress
from speclock.core.jsonread import parse_json
from speclock.core.layout import REPO_ROOT
from speclock.spec.lock import LockDoc, LockEntry, read_lock

SYSTEM = "x86_64-linux"
DOUBLE = "nix/nixpkgs-double"
# Debian's nix-bin (2.8) as root, without a daemon: no build users, no sandbox (Debian's build has
# no sandbox shell, so /bin/sh is missing inside it), no binary cache (unreachable here), no
# global flake registry (fetched from the network otherwise).
NIX_CONFIG = "\n".join(
    [
        "experimental-features = nix-command flakes",
        "build-users-group =",
        "sandbox = false",
        "substituters =",
        "flake-registry = /dev/null",
        "warn-dirty = false",
    ]
)


def nix_env() -> dict[str, str]:
    env = dict(os.environ)
    env["NIX_CONFIG"] = NIX_CONFIG + ("\n" + os.environ["NIX_CONFIG"] if os.environ.get("NIX_CONFIG") else "")
    # builtin:fetchurl downloads through the host's CA bundle (an intercepting proxy's CA too).
    for var in ("NIX_SSL_CERT_FILE", "SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var):
            env.setdefault("NIX_SSL_CERT_FILE", os.environ[var])
            break
    else:
        if Path("/etc/ssl/certs/ca-certificates.crt").is_file():
            env.setdefault("NIX_SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    return env


def require_nix() -> str:
    nix = shutil.which("nix")
    if not nix or not shutil.which("nix-instantiate"):
        raise EnvironmentProblem("nix is not installed", hint="apt-get install -y nix-bin (Debian/Ubuntu), then run again")
    return nix


def run_nix(args: list[str], *, cwd: Path, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a nix command in `cwd`; CheckFailed with its stderr when it fails and `check` is set."""
    proc = subprocess.run(args, cwd=cwd, env=nix_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        err = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("warning:"))
        raise CheckFailed(f"`{' '.join(args)}` failed in {cwd}:\n{err[-4000:]}")
    return proc


def nix_eval_json(flake: Path, attr: str, *extra: str) -> Any:
    out = run_nix(["nix", "eval", "--offline", "--json", f".#{attr}", *extra], cwd=flake).stdout
    return parse_json(out, f"`nix eval .#{attr}`", what="output", expect=object, error=EnvironmentProblem, allow_nan=True)


def double_args(flake: Path) -> list[str]:
    """Replace nixpkgs by the test double (shape evaluation only)."""
    return ["--override-input", "nixpkgs", f"path:{flake / DOUBLE}"]


def poisoned_nixpkgs(flake: Path) -> list[str]:
    """Replace nixpkgs by a flake that throws when imported: what evaluates with it needs no nixpkgs."""
    poison = flake.parent / (flake.name + "-no-nixpkgs")
    poison.mkdir(exist_ok=True)
    (poison / "flake.nix").write_text("{ outputs = _: { }; }\n")
    (poison / "default.nix").write_text('_: throw "speclock test: nixpkgs was used where it must not be"\n')
    return ["--override-input", "nixpkgs", f"path:{poison}"]


def tracked_files(repo: Path) -> list[str]:
    proc = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True, check=True
    )
    return [p for p in proc.stdout.decode().split("\0") if p and (repo / p).is_file()]


def flake_copy(dest: Path, repo: Path = REPO_ROOT, skip_prefixes: tuple[str, ...] = ("models/",)) -> Path:
    """A git repository at `dest` with the checkout's tracked and untracked (not ignored) files, all
    `git add`ed: what the flake sees once they are committed. Large model folders are left out."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in tracked_files(repo):
        if rel.startswith(skip_prefixes):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, target)
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    git_add(dest)
    return dest


def git_add(repo: Path) -> None:
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)


def nix_files(flake: Path) -> list[Path]:
    return sorted(p for p in flake.rglob("*.nix") if ".git" not in p.parts)


def parse_all(flake: Path) -> list[str]:
    for path in nix_files(flake):
        run_nix(["nix-instantiate", "--parse", str(path)], cwd=flake)
    return [str(p.relative_to(flake)) for p in nix_files(flake)]


def _locked_wheel(p: LockEntry) -> dict[str, str]:
    return {"name": p["name"], "version": p["version"], "filename": p["filename"], "url": p["url"], "sha256": p["sha256"]}


def _pinned_wheel(p: dict[str, Any]) -> dict[str, Any]:
    return {k: p[k] for k in ("name", "version", "filename", "url", "sha256")}


def expected_pins(lock: LockDoc) -> dict[str, Any]:
    """What `lib.stacks.<name>` must say, computed from the lock in Python."""
    data = lock["stack_data"]
    return {
        "engine": {k: data["engine"][k] for k in ("name", "package", "version")},
        "torch": data["torch"]["version"],
        "cuda": data["gpu"]["cuda"],
        "archs": data["gpu"]["archs"],
        "patches": data["patches"]["series"],
        "python": data["python"]["version"],
        "lockSha256": lock["lock_sha256"],
        "wheels": [_locked_wheel(p) for p in lock["packages"]],
        "assets": [_locked_wheel(p) for p in lock["assets"]],
    }


def actual_pins(pins: dict[str, Any]) -> dict[str, Any]:
    return {
        "engine": {k: pins["engine"][k] for k in ("name", "package", "version")},
        "torch": pins["torch"]["version"],
        "cuda": pins["cuda"],
        "archs": pins["archs"],
        "patches": pins["patches"],
        "python": pins["python"]["version"],
        "lockSha256": pins["lockSha256"],
        "wheels": [_pinned_wheel(p) for p in pins["wheels"]],
        "assets": [_pinned_wheel(p) for p in pins["assets"]],
    }


def compare_pins(flake: Path) -> dict[str, int]:
    """lib.stacks equals what every locks/*.lock says; returns wheels compared per stack."""
    poison = poisoned_nixpkgs(flake)
    names = nix_eval_json(flake, "lib.stackNames", *poison)
    on_disk = sorted(p.stem for p in (flake / "locks").glob("*.lock"))
    if sorted(names) != on_disk:
        raise CheckFailed(f"the flake provides stacks {names}, the lock files are {on_disk}")
    stacks = nix_eval_json(flake, "lib.stacks", *poison)
    counts = {}
    for name in names:
        lock = read_lock(flake / "locks" / f"{name}.lock")
        want, got = expected_pins(lock), actual_pins(stacks[name])
        diffs = [k for k in want if want[k] != got[k]]
        if diffs:
            raise CheckFailed(f"stack {name}: flake lib.stacks.{name} differs from locks/{name}.lock in: {', '.join(diffs)}")
        counts[name] = len(want["wheels"]) + len(want["assets"])
    return counts


def build_checks(flake: Path, *, override: list[str] | None = None) -> list[str]:
    """Build every check offline; by default with nixpkgs poisoned, proving they do not need it."""
    override = poisoned_nixpkgs(flake) if override is None else override
    names: list[str] = nix_eval_json(flake, f"checks.{SYSTEM}", "--apply", "builtins.attrNames", *(override or []))
    run_nix(
        ["nix", "build", "--offline", "--no-link", *(override or []), *[f'.#checks.{SYSTEM}."{n}"' for n in names]], cwd=flake
    )
    return names


def flake_check_with_double(flake: Path) -> None:
    run_nix(["nix", "flake", "check", "--offline", *double_args(flake)], cwd=flake)


def run_all(repo: Path = REPO_ROOT, progress: Progress = print) -> dict[str, Any]:
    require_nix()
    with tempfile.TemporaryDirectory(prefix="speclock-nix-") as tmp:
        flake = flake_copy(Path(tmp) / "repo", repo)
        progress("[1/4] nix-instantiate --parse on every .nix file")
        parsed = parse_all(flake)
        progress("[2/4] lib.stacks against locks/*.lock")
        wheels = compare_pins(flake)
        progress("[3/4] checks, offline, with nixpkgs replaced by a flake that throws when used")
        checks = build_checks(flake)
        progress("[4/4] nix flake check --offline with the nixpkgs test double (shape only)")
        flake_check_with_double(flake)
    return {"parsed": parsed, "wheels_compared": wheels, "checks": checks, "flake_check_with_double": "ok"}


def _cmd_nix_check(args: argparse.Namespace) -> int:
    out = (lambda m: print(m, file=sys.stderr)) if args.json else print
    if not (REPO_ROOT / "flake.nix").is_file():
        raise BadInput(f"no flake.nix in {REPO_ROOT}")
    result = run_all(progress=out)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"ok: {len(result['parsed'])} .nix files parse; pins equal the locks "
            f"({', '.join(f'{k}: {v} wheels' for k, v in result['wheels_compared'].items())}); "
            f"checks built offline: {', '.join(result['checks'])}"
        )
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "nix-check",
        help="check flake.nix against the lock files, offline",
        description="Parse every .nix file, compare the flake's lib.stacks with locks/*.lock, build the "
        "flake's offline checks without nixpkgs, and run `nix flake check --offline` with "
        "nixpkgs replaced by a test double (shape only). Needs nix (Debian: nix-bin).",
    )
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_cmd_nix_check)
