"""`speclock smoke`: prove that speculative decoding works in the engine at hand.

Runs the stack's engine twice on the same chat-templated prompts, greedily: without the drafter
(the judge of losslessness and the throughput baseline) and with it (counters taken as deltas
around the run). Compares the outputs token for token, computes the report contract's metrics,
compares acceptance with speclock's reference decoder on the same drafter and prompts (recorded
in the drafter's manifest, or run live), applies the stack's thresholds and writes the report.
The report is written even when the engine fails mid-run, with the failure in it.

inputs.py (options, paths, flags), reference.py (recorded or live reference), run.py (the run and
its report), measure.py (the runs' counters and timings as the report's numbers), worker.py (each
engine in its own process), cli.py (the command).
"""

from speclock.engines import visible_arch
from speclock.verify.smoke.cli import add_commands
from speclock.verify.smoke.inputs import (
    SmokeInputs,
    SmokeOptions,
    add_smoke_arguments,
    default_out_dir,
    prepare_out_dir,
    resolve_inputs,
    server_url,
)
from speclock.verify.smoke.reference import (
    REFERENCE_KEY_FIELDS,
    lookup_recorded,
    reference_key,
    reference_section,
    run_live_reference,
)
from speclock.verify.smoke.run import image_identity, read_plain_cache, run_smoke, skeleton

__all__ = [
    "add_commands",
    "add_smoke_arguments",
    "default_out_dir",
    "image_identity",
    "lookup_recorded",
    "prepare_out_dir",
    "read_plain_cache",
    "reference_key",
    "REFERENCE_KEY_FIELDS",
    "reference_section",
    "resolve_inputs",
    "run_live_reference",
    "run_smoke",
    "server_url",
    "skeleton",
    "SmokeInputs",
    "SmokeOptions",
    "visible_arch",
]
