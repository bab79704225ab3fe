"""`speclock patches check|apply|verify|label`: the command line of the patch series."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from speclock.core.errors import BadInput, CheckFailed
from speclock.core.versions import version_key
from speclock.patches.probes import ProbeResult
from speclock.patches.series import (
    LABEL_KEY,
    PatchResult,
    SeriesRecord,
    apply_series,
    check_series,
    load_series,
    series_label,
    verify_series,
)
from speclock.patches.trees import DirTree, SourceTree, WheelTree, default_site_packages, engine_version_in
from speclock.patches.wheels import fetch_wheel
from speclock.spec.stack import DEFAULT_STACK, load_stack


def version_arg(text: str) -> str:
    """argparse type: a release version (versions.py syntax), refused at parse time otherwise."""
    try:
        version_key(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version (e.g. 0.17.1)") from None
    return text.strip()


def _check_output_path(path: Path, option: str) -> None:
    """Refuse an output path that cannot be written, before anything else is written."""
    if path.is_dir():
        raise BadInput(f"{option} {path} is a directory, where a file belongs", hint="give a file path")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise BadInput(f"{option} {path}: {parent} is a file, where a directory belongs", hint="choose another path")
            break


def _print_check(results: list[PatchResult], version: str, where: str) -> None:
    print(f"patch series against {where} ({version}):")
    for r in results:
        rng = "" if r.in_range else f"  [Versions '{r.patch.versions}' excludes {version}]"
        print(f"  {r.patch.name:52} {r.state.upper():16}{rng}")
        print("      " + r.reason.replace("\n", "\n      "))
        if r.state == "upstream":
            print(f"      retirable: remove it from the series for {version} and later")


def _cmd_check(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    patches = load_series(stack)
    if not patches:
        print(f"stack {stack.name} has no patches")
        return 0
    if args.site_packages:
        tree: SourceTree = DirTree(Path(args.site_packages))
        version = engine_version_in(Path(args.site_packages), stack.engine["package"])
    else:
        version = args.engine_version or stack.engine["version"]
        try:
            version_key(version)
        except ValueError:
            raise BadInput(f"{stack.path}: key 'engine.version': {version!r} is not a version", hint="e.g. 0.33.0") from None
        tree = WheelTree(fetch_wheel(stack.engine["package"], version, log=lambda m: print(m, file=sys.stderr)))
    results = check_series(patches, tree, version)
    if args.json:
        print(
            json.dumps(
                {"stack": stack.name, "engine_version": version, "source": tree.label, "patches": [r.as_json() for r in results]},
                indent=2,
            )
        )
    else:
        _print_check(results, version, tree.label)
    return 1 if any(r.state == "conflict" for r in results) else 0


def _print_record(rec: SeriesRecord, as_json: bool, line: Callable[[str, ProbeResult], str]) -> None:
    """An apply/verify record: the JSON itself, or one line per probe (`line(patch name, probe result)`)."""
    if as_json:
        print(json.dumps(rec, indent=2))
        return
    for e in rec["patches"]:
        for pr in e["probes"]:
            print(line(e["patch"], pr))


def _cmd_apply(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    if args.record:
        _check_output_path(Path(args.record), "--record")
    site = Path(args.site_packages) if args.site_packages else default_site_packages(args.python)
    print(f"applying {len(stack.patch_series)} patch(es) of stack {stack.name} to {site}")
    rec = apply_series(
        stack, site, python=args.python, record=Path(args.record) if args.record else None, run_probes=not args.no_runtime_probes
    )
    _print_record(
        rec, args.json, lambda patch, pr: f"  {patch}: probe {pr['probe']}: {'pass' if pr['passed'] else 'FAIL'} ({pr['reason']})"
    )
    if not args.json:
        print(f"label {LABEL_KEY}={rec['label']}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    site = Path(args.site_packages) if args.site_packages else default_site_packages(args.python)
    if not site.is_dir():
        raise BadInput(f"--site-packages {site} is not a directory", hint="give the engine's site-packages folder")
    rec = verify_series(stack, site, python=args.python, run_probes=not args.no_runtime_probes)
    _print_record(
        rec, args.json, lambda patch, pr: f"{'PASS' if pr['passed'] else 'FAIL'}  {patch}: {pr['probe']}: {pr['reason']}"
    )
    if not rec["ok"]:
        raise CheckFailed(f"{len(rec['failures'])} patch probe(s) failed", hint="rebuild the image; a patch did not take effect")
    return 0


def _cmd_label(args: argparse.Namespace) -> int:
    key, value = series_label(load_series(load_stack(args.stack)))
    print(f"{key}={value}")  # exactly what the image carries
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "patches",
        help="check, apply and verify engine patch series",
        description="Engine patch series: lifecycle check against any release, "
        "all-or-nothing apply at image build, probes that prove the effect.",
    )
    ps = p.add_subparsers(dest="patches_command", metavar="ACTION", required=True)
    c = ps.add_parser(
        "check",
        help="for each patch: applies / already-applied / upstream (retirable) / conflict",
        description="Check the stack's series against an engine release: its wheel is downloaded "
        "into the cache (no install) unless --site-packages names an installed engine. "
        "Exit 1 when a patch conflicts.",
    )
    c.add_argument("--stack", default=DEFAULT_STACK)
    c.add_argument("--engine-version", type=version_arg, help="release to check against (default: the stack's pin)")
    c.add_argument("--site-packages", help="check an installed engine instead of a downloaded wheel")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_check)
    a = ps.add_parser(
        "apply",
        help="apply the series to an installed engine (all or nothing) and verify it",
        description="Apply at image build: checks versions and every hunk first, writes nothing "
        "unless all apply, then runs every probe. Exit 1 on conflict or failed probe, "
        "2 when a patch's Versions excludes the pinned engine.",
    )
    a.add_argument("--stack", required=True)
    a.add_argument("--site-packages", help="engine site-packages (default: that of --python)")
    a.add_argument("--python", help="the engine's python, for runtime probes (default: this one)")
    a.add_argument("--record", help="write the JSON record of what was applied here")
    a.add_argument("--no-runtime-probes", action="store_true", help="only static probes (no engine import)")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=_cmd_apply)
    v = ps.add_parser("verify", help="run every patch's probes against an installed engine")
    v.add_argument("--stack", required=True)
    v.add_argument("--site-packages")
    v.add_argument("--python")
    v.add_argument("--no-runtime-probes", action="store_true")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=_cmd_verify)
    lb = ps.add_parser("label", help="print the image label (io.speclock.patches=VALUE) for a stack's series")
    lb.add_argument("--stack", required=True)
    lb.set_defaults(func=_cmd_label)
