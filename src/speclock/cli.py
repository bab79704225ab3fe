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

from speclock import __version__
from speclock.core.errors import SpeclockError
from speclock.core.files import current_input, os_error

COMMAND_MODULES = [
    "speclock.spec.cli",
    "speclock.build.fetch",
    "speclock.build.hostenv",
    "speclock.build.image",
    "speclock.build.push",
    "speclock.build.sbom",
    "speclock.build.run",
    "speclock.build.nixcheck",
    "speclock.verify.smoke.cli",
    "speclock.engines.serve",
    "speclock.verify.gate",
    "speclock.verify.selfcheck",
    "speclock.patches.cli",
    "speclock.verify.doctor.runner",
    "speclock.kernels.build",
    "speclock.train.cli",
    "speclock.upgrade.cli",
    "speclock.verify.soak",
]


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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in modules or COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: list[str] | None = None, *, modules: list[str] | None = None) -> int:
    """Run the CLI. `modules` limits it to some command modules (build steps that carry only a few)."""
    parser = build_parser(modules)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    debug = bool(args.verbose or os.environ.get("SPECLOCK_DEBUG"))
    try:
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


def _fail(command: str, err: SpeclockError, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"speclock {command}: error: {err}", file=sys.stderr)
    return err.exit_code
