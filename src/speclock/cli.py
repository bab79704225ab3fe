"""The `speclock` command line: one sub-command per concern, errors turned into exit codes here.

Each module in COMMAND_MODULES has `add_commands(subparsers)`, which adds its sub-commands and
sets `func` (taking the parsed args, returning an exit code) on each. Modules import heavy
dependencies (torch, the engines) inside their functions, so `speclock --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from pathlib import Path

from speclock import __version__
from speclock.core import layout
from speclock.core.errors import BadInput, SpeclockError
from speclock.core.files import current_input, os_error

# command name -> the module that adds it (tests/test_cli_rules.py holds this to what each module adds). A run
# that names its command imports only that module: importing all of them costs ~0.2 s of every command's start
# (docs/benchmarks.md, "Warm rebuild (#37)"); --help, no command or an unknown one imports them all.
COMMANDS = {
    "lock": "speclock.spec.cli",
    "stack": "speclock.spec.cli",
    "fetch": "speclock.build.fetch",
    "host-env": "speclock.build.hostenv.command",
    "build-image": "speclock.build.image",
    "push-image": "speclock.build.push",
    "sbom": "speclock.build.sbom.document",
    "run-image": "speclock.build.run",
    "nix-check": "speclock.build.nixcheck",
    "smoke": "speclock.verify.smoke.cli",
    "serve": "speclock.engines.serve",
    "gate": "speclock.verify.gate",
    "selfcheck": "speclock.verify.selfcheck",
    "patches": "speclock.patches.cli",
    "doctor": "speclock.verify.doctor.runner",
    "kernels-build": "speclock.kernels.build",
    "train": "speclock.train.cli",
    "upgrade": "speclock.upgrade.cli",
    "soak": "speclock.verify.soak",
    "schemas": "speclock.verify.schemas",
}
COMMAND_MODULES = list(dict.fromkeys(COMMANDS.values()))


def build_parser(modules: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speclock",
        description=(
            "Build reproducible container images for EAGLE-3 speculative decoding, prove "
            "each image works (doctor, smoke test) and gate engine upgrades on acceptance.\n\n"
            "Exit codes: 0 ok, 1 check or gate failed, 2 bad input, 3 environment problem."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"speclock {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks on errors")
    parser.add_argument(
        "--root",
        metavar="DIR",
        help="the project (stacks/, locks/, patches/, models/); default: $SPECLOCK_ROOT, else the nearest folder "
        "at or above the working directory holding stacks/ and locks/",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in modules or COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: list[str] | None = None, *, modules: list[str] | None = None) -> int:
    """Run the CLI. `modules` limits it to some command modules (build steps that carry only a few)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    root = _global_root(argv)
    if root is not None:
        # Before the command modules are imported (they bind layout.REPO_ROOT at import); the processes speclock
        # starts (build steps, workers) find the same project through the variable.
        path = Path(os.path.abspath(Path(root).expanduser()))  # ".." folded, as SPECLOCK_ROOT is
        if not path.is_dir():
            print(
                f"speclock: error: --root {root}: {path} is not a folder\n  what to do: {layout.NO_PROJECT_HINT}", file=sys.stderr
            )
            return 2
        os.environ[layout.ROOT_ENV] = str(path)
        layout.use_root(path)
    parser = build_parser(modules or _named_module(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    debug = bool(args.verbose or os.environ.get("SPECLOCK_DEBUG"))
    try:
        _check_root(args)
        return int(args.func(args) or 0)
    except SpeclockError as err:
        return _fail(args.command, err, debug)
    except KeyboardInterrupt:
        print(f"speclock {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as err:
        # Disk full, permission denied, a directory where a file belongs: the user can act on it.
        return _fail(args.command, os_error(err), debug)
    except Exception as err:  # a defect or an input no reader checked: never exit 1 ("check failed")
        if debug:
            traceback.print_exc()
        where = current_input()
        cause = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
        print(
            f"speclock {args.command}: error: unexpected failure" + (f" while reading {where}" if where else "") + f": {cause}\n"
            "  what to do: check that input; if it is valid, rerun with SPECLOCK_DEBUG=1 (or -v) and report the "
            "traceback to the speclock maintainers",
            file=sys.stderr,
        )
        return 3


def _named_module(argv: list[str]) -> list[str] | None:
    """[the module of the command argv names], or None (every module: no command, an unknown one, --help before it)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--root":
            skip = True
        elif not arg.startswith("-"):
            return [COMMANDS[arg]] if arg in COMMANDS else None
        elif arg not in ("-v", "--verbose") and not arg.startswith("--root="):
            return None  # --help, --version, a typo: the whole parser answers
    return None


def _global_root(argv: list[str]) -> str | None:
    """The value of the global --root (options before the command name), read before the parser exists."""
    for i, arg in enumerate(argv):
        if not arg.startswith("-"):
            return None  # the command: what follows is its own
        if arg == "--root":
            return argv[i + 1] if i + 1 < len(argv) else None  # a missing value: the parser says so
        if arg.startswith("--root="):
            return arg.split("=", 1)[1]
    return None


def _check_root(args: argparse.Namespace) -> None:
    """Bad input (exit 2) when the project root cannot serve this command: an explicit root that is not a
    folder, or no project found for a command that names a stack by name (stacks/<name>.toml of the project).
    Commands given paths, and everything inside an image, run as they are."""
    if layout.ROOT.problem:
        raise BadInput(layout.ROOT.problem, hint=layout.NO_PROJECT_HINT)
    stack = getattr(args, "stack", None)
    named = isinstance(stack, str) and "/" not in stack and not stack.endswith(".toml")
    if named and not layout.ROOT.found:
        raise layout.no_project()


def _fail(command: str, err: SpeclockError, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"speclock {command}: error: {err}", file=sys.stderr)
    if layout.ROOT.source == "none" and "no speclock project here" not in str(err):
        # the paths above were taken from the working directory, for want of a project: say so
        print(f"  note: no speclock project was found at or above {layout.ROOT.path}; {layout.NO_PROJECT_HINT}", file=sys.stderr)
    return err.exit_code
