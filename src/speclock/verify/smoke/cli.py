"""`speclock smoke`: the command (its flags are shared with soak and selfcheck: inputs.add_smoke_arguments)."""

from __future__ import annotations

import argparse
import json

from speclock.core.args import int_range
from speclock.engines import DEFAULT_CONCURRENCY
from speclock.verify.report import human_table
from speclock.verify.smoke.inputs import SmokeOptions, add_smoke_arguments, resolve_inputs
from speclock.verify.smoke.run import run_smoke

DESCRIPTION = """Runs the stack's engine twice on the same chat-templated prompts: without the drafter
(greedy: the judge of losslessness and the throughput baseline) and with it (counters taken as deltas
around each run). Compares the outputs token for token, computes the report contract's metrics,
compares acceptance with speclock's reference decoder on the same drafter and prompts (recorded
in the drafter's manifest, or run live), applies the stack's thresholds and writes the report.
The report is written even when the engine fails mid-run, with the failure in it.

Profiles (--profile, default the stack's smoke.profile; overrides in [smoke.profiles]):
  quick    greedy, the stack's prompts x smoke.max_tokens (64): the image's self-check
  full     greedy, 256 new tokens: what upgrade and GPU runs use; per-position drift gated
  sampled  temperature > 0 over several seeds: acceptance and per-position rates per seed with a
           95% confidence interval; outputs are not compared token for token (two correct samplers
           draw different tokens): acceptance is gated two-sided against a sampled baseline
The report records its profile; `speclock gate` compares it only with a baseline of the same profile.
With smoke.attention_backends listing several backends, the drafter runs once per backend.
"""


def _cmd_smoke(args: argparse.Namespace) -> int:
    inp = resolve_inputs(SmokeOptions.from_args(args))
    report, code = run_smoke(inp)
    print(json.dumps(report, indent=2) if args.json else human_table(report))
    return code


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "smoke",
        help="run the engine with and without the drafter: lossless, acceptance, speedup",
        description=DESCRIPTION + "\n\nExit 0 pass, 1 check failed (or the engine crashed), "
        "2 bad input, 3 environment problem (engine missing).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_smoke_arguments(p)
    p.add_argument(
        "--concurrency",
        type=int_range(1, 4096),
        default=DEFAULT_CONCURRENCY,
        help=f"with --server: requests in flight at once, as production traffic (default {DEFAULT_CONCURRENCY}; 1: one at a time)",
    )
    p.add_argument("--json", action="store_true", help="print the report JSON instead of the table")
    p.set_defaults(func=_cmd_smoke)
