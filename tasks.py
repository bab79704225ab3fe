"""invoke tasks: one per `speclock` sub-command, generated from the CLI parser (speclock.tasks_from_cli),
so each task takes exactly its sub-command's options; plus `test` and `nix-check`, which run pytest, and `lint` (ruff and mypy).

Run `invoke --list` for the tasks and `invoke --help TASK` for a task's options.
"""

import os
import shlex
import sys
from pathlib import Path

from invoke import Collection, task
from invoke.exceptions import Exit

ROOT = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep)}
sys.path.insert(0, str(ROOT / "src"))  # the tasks come from this checkout's CLI, like the commands they run


def speclock(c, argv):
    """Run the speclock CLI with this checkout's source; its exit code becomes the task's."""
    cmd = " ".join([shlex.quote(sys.executable), "-m", "speclock", *(shlex.quote(str(a)) for a in argv)])
    # the project is this checkout, also for `invoke -r CHECKOUT task` run from another folder (only the CLI's tasks:
    # the tests make projects of their own in temp folders and find them from there)
    return c.run(cmd, env={**ENV, "SPECLOCK_ROOT": str(ROOT)}, pty=False)


@task(
    help={
        "fast": "skip the slow tests (real image builds, engine runs)",
        "workers": "pytest-xdist workers (default 2: the CI machine's cores); 0 runs the suite in this process, in file order",
    }
)
def test(c, fast=False, workers=2):
    """Run the test suite (what CI runs)."""
    marker = ["-m", "not slow"] if fast else []
    # Each worker runs a fixed share of the files, balanced on measured time (tests/conftest.py says how).
    parallel = ["-n", str(workers), "--dist", "loadscope"] if int(workers) > 0 else []
    # The 15 slowest tests at the end of every run: where the suite's time goes (CI has 90 minutes).
    argv = [shlex.quote(sys.executable), "-m", "pytest", "-q", "--durations=15", *parallel, *marker]
    c.run(" ".join(argv), env=ENV, pty=False)


@task
def lint(c):
    """ruff (lint and format check) over the repository and mypy over src/, configured in pyproject.toml."""
    failed = []
    for argv in (["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]):
        # every checker runs, so one CI run shows all findings; the task fails if any found one
        if c.run(" ".join([shlex.quote(sys.executable), "-m", *argv]), env=ENV, pty=False, warn=True).exited != 0:
            failed.append(" ".join(argv))
    if failed:
        raise Exit(f"lint: findings from {', '.join(failed)} (above)", code=1)


@task(name="lock-host", help={"check": "only say whether the inputs still resolve to the committed lock (exit 1 if not)"})
def lock_host(c, check=False):
    """Re-lock speclock's own host environment (scripts/requirements-host.lock.txt, hash-checked by bootstrap.sh)."""
    argv = [shlex.quote(sys.executable), str(ROOT / "scripts" / "lock_host.py"), *(["--check"] if check else [])]
    c.run(" ".join(argv), env=ENV, pty=False)


@task(name="nix-check", help={"offline": "skip the test that downloads a locked wheel from PyPI"})
def nix_check(c, offline=False):
    """Check flake.nix: .nix syntax, pins equal locks/*.lock, checks without nixpkgs, shape with a nixpkgs double."""
    tests = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").glob("test_nix_*.py")
        if not (offline and p.name == "test_nix_wheels.py")
    )
    c.run(" ".join([shlex.quote(sys.executable), "-m", "pytest", "-q", *tests]), env=ENV, pty=False)


# Hand-written tasks (they run pytest or a script, not the CLI) keep their names; `speclock nix-check` is the CLI's.
HAND_WRITTEN = [test, lint, nix_check, lock_host]
ns = Collection(*HAND_WRITTEN)
try:
    from speclock.tasks_from_cli import SignalForwardingLocal, cli_tasks

    ns.configure({"runners": {"local": SignalForwardingLocal}})  # Ctrl-C reaches the command once; exit 130

    for t in cli_tasks(speclock, skip={t.name for t in HAND_WRITTEN}):
        ns.add_task(t)
except Exception as err:  # a CLI module that does not import: `invoke test` must still run and show it
    print(f"tasks.py: the CLI tasks are missing: {type(err).__name__}: {err}", file=sys.stderr)
