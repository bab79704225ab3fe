"""What a stack removes from its environment ([prune]): the script that runs right after the install.

prune_script(stack, lock) -> the text of a POSIX sh script. The image build stages it as wheels/prune.sh and
runs it in the venv stage's install step as `sh /wheels/prune.sh /opt/venv`, so the pruned files never reach
a layer; `speclock host-env` runs the same text on its venv (run_prune), so both environments lose the same files.

[prune].packages need nothing here: the lock leaves them out of the install set (spec.resolve), so they are
never downloaded nor installed. The script removes [prune].paths, globs under the venv's site-packages, as the
LOCK records them (what is locked is what is built; `lock --check` ties the record to the stack). Globs were
validated when the stack was read (spec.validate: relative, plain characters, something literal), so each is
safe inside single quotes. The script's text depends only on the lock's record and the Python version: the
same inputs give the same script, and removing the same files gives the same layer. The site-packages it
prunes is the lock's Python's (`python.version`: the image's, or a host target's as spec.lock.target_lock gives it).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from speclock.core.errors import EnvironmentProblem
from speclock.spec.lock import LockDoc, PruneRecord
from speclock.spec.stack import Stack


def locked_prune(stack: Stack, lock: LockDoc) -> PruneRecord:
    """The prune declaration the build follows: the lock's record (a stack without [prune] has none: nothing)."""
    record = lock.get("prune")
    if isinstance(record, dict):
        return {"packages": list(record.get("packages") or []), "paths": list(record.get("paths") or [])}
    return {"packages": [], "paths": []}


def prune_script(stack: Stack, lock: LockDoc) -> str:
    """A sh script that removes the stack's declared [prune] paths from the venv given as $1, and prints what it
    removed (paths per glob, MB in all) for the build log."""
    record = locked_prune(stack, lock)
    locked = lock.get("python")
    python = (locked.get("version") if locked else None) or stack.python["version"]
    site = f"lib/python{python}/site-packages"
    lines = [
        "#!/bin/sh",
        f"# speclock prune for stack {stack.name}: [prune] as locked (docs/prune.md)",
        f"# packages left out of the install set: {', '.join(record['packages']) or 'none'}",
        "set -eu",
    ]
    if not record["paths"]:
        lines.append("echo 'speclock prune: no paths declared'")
        return "\n".join(lines) + "\n"
    for glob in record["paths"]:
        if "'" in glob:  # validated stacks never get here; a hand-made lock must not break the quoting
            raise ValueError(f"[prune].paths {glob!r} holds a quote")
    lines += [
        f'sp="$1/{site}"',
        '[ -d "$sp" ] || { echo "speclock prune: no site-packages at $sp" >&2; exit 1; }',
        'before=$(du -sk "$sp" | cut -f1)',
        "total=0",
        "prune_glob() {",
        "    # '*' spans folders in -path; -prune: a removed folder is not searched",
        '    n=$(find "$sp" -mindepth 1 -path "$sp/$1" -prune -print | wc -l)',
        '    find "$sp" -mindepth 1 -path "$sp/$1" -prune -exec rm -rf {} +',
        "    total=$((total + n))",
        '    echo "speclock prune: $1: $n removed"',
        "}",
    ]
    lines += [f"prune_glob '{glob}'" for glob in record["paths"]]
    lines += [
        'after=$(du -sk "$sp" | cut -f1)',
        'echo "speclock prune: $total paths removed, $(( (before - after) / 1024 )) MB'
        ' (site-packages $((before / 1024)) MB -> $((after / 1024)) MB)"',
    ]
    return "\n".join(lines) + "\n"


def run_prune(stack: Stack, lock: LockDoc, venv: Path) -> str:
    """Run prune_script(stack, lock) on the venv at `venv`, as the image's venv step does; returns what it printed.
    EnvironmentProblem (exit 3) with its output when it fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="speclock-prune-") as fh:
        fh.write(prune_script(stack, lock))
        fh.flush()
        proc = subprocess.run(["sh", fh.name, str(venv)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise EnvironmentProblem(
            f"the [prune] hook of stack {stack.name} failed on {venv} (exit {proc.returncode}): "
            f"{(proc.stdout + proc.stderr).strip()[-800:]}",
            hint=f"check [prune].paths of stacks/{stack.name}.toml and that {venv} is writable",
        )
    return proc.stdout
