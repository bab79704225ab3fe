"""The upgrade's soak step: the candidate image's own `speclock soak` for a short window, gated on its drift.

A smoke run measures one pass on a fresh engine. The soak (speclock.verify.soak) keeps ONE engine up and
measures acceptance window by window; its verdict fails when the worst window's mean acceptance length is
more than the drift limit below the first window's (or greedy outputs change beyond numeric ties, or the
engine fails). The upgrade runs it in the candidate image, hardened like doctor and smoke, for `--soak-s`
seconds (default 60; 0 skips it), on SOAK_PROMPTS prompts per window so a short soak still has several
windows on a CPU. The soak's verdict is the step's: a drifted soak fails the upgrade, with the soak's reason.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from speclock.build.builders import ensure_in_docker
from speclock.build.records import BuildRecord
from speclock.build.run import run_image
from speclock.core.docmodel import DocModel, validate
from speclock.core.errors import BadInput
from speclock.core.files import read_json
from speclock.core.heartbeat import Progress
from speclock.upgrade.record import SoakSummary, SoakWindowSummary, Step
from speclock.verify.report_types import SoakDoc, SoakWindow
from speclock.verify.soak import SOAK_SCHEMA

DEFAULT_SOAK_S = 60.0
SOAK_PROMPTS = 8

# (speclock arguments, host folder the command sees as /out) -> exit code
Runner = Callable[[list[str], Path], int]


def soak_command(soak_s: float, max_drift: float) -> list[str]:
    """`speclock soak` arguments for the image (its stack, models and prompts are the image's own)."""
    return [
        "soak",
        "--minutes",
        f"{soak_s / 60:.6g}",
        "--max-drift",
        f"{max_drift:g}",
        "--num-prompts",
        str(SOAK_PROMPTS),
        "--out",
        "/out",
    ]


def image_runner(record: BuildRecord) -> Runner:
    """Runs the command in the built image, hardened (speclock run-image's settings); the image's log goes to stderr."""

    def run(args: list[str], out: Path) -> int:
        return run_image(ensure_in_docker(record), args, out_dir=out, stdout=2).returncode

    return run


# soak.json's model (speclock.verify.report_types.SoakDoc): what the upgrade reads by key, typed; not published.
SOAK = DocModel(
    SoakDoc, SOAK_SCHEMA, "", "soak result", "warn", "give the soak.json `speclock soak` wrote in the image, unedited"
)


def read_soak(path: Path) -> SoakDoc:
    """The soak's result as the image wrote it (speclock.soak/v1), validated against its model (SoakDoc): BadInput
    naming the file and the key path."""
    doc = read_json(path, what="soak result", expect=object, hint=SOAK.hint)
    if not isinstance(doc, dict) or doc.get("schema") != SOAK_SCHEMA:
        raise BadInput(f"{path}: not a {SOAK_SCHEMA} document", hint=SOAK.hint)
    validate(SOAK, doc, str(path))
    return cast(SoakDoc, doc)


def _window_summary(w: SoakWindow) -> SoakWindowSummary:
    return {
        "t_start_s": w.get("t_start_s"),
        "mean_acceptance_length": w.get("mean_acceptance_length"),
        "acceptance_rate": w.get("acceptance_rate"),
        "tok_s": w.get("tok_s"),
        "outputs_same": w.get("outputs_same"),
        "numeric_ties": w.get("numeric_ties"),
        "mismatches": w.get("mismatches"),
    }


def soak_summary(doc: SoakDoc) -> SoakSummary:
    """What upgrade.json and summary.md show of a soak: per window and the drift."""
    return {
        "verdict": doc["verdict"],
        "seconds": doc["seconds"],
        "max_drift": doc.get("max_drift"),
        "prompts": doc.get("prompts"),
        "max_tokens": doc.get("max_tokens"),
        "drift": doc["drift"],
        "windows": [_window_summary(w) for w in doc["windows"]],
        "failures": doc["failures"],
    }


def run_soak_step(step: Step, runner: Runner, out: Path, *, soak_s: float, max_drift: float, progress: Progress = print) -> None:
    """Fill `step` (speclock.upgrade.steps.Step) from a soak of `soak_s` seconds run by `runner` into `out`."""
    step.data = {"soak_s": soak_s, "max_drift": max_drift}
    if soak_s <= 0:
        step.status, step.detail = "skipped", "not asked for (--soak-s 0)"
        return
    if out.exists():  # a soak.json of an earlier run must never stand in for this one
        shutil.rmtree(out)
    out.mkdir(parents=True)
    progress(f"  soak: one engine for {soak_s:g} s, {SOAK_PROMPTS} prompts per window, drift limit {max_drift:.0%}")
    t0 = time.monotonic()
    try:
        code = runner(soak_command(soak_s, max_drift), out)
    finally:
        step.seconds = round(time.monotonic() - t0, 1)
    step.data["exit_code"], step.data["outputs"] = code, str(out)
    try:
        doc = read_soak(out / "soak.json")
    except BadInput as err:  # no result, or a damaged one: the soak did not run to its verdict
        step.status = "fail"
        step.detail = f"the soak in the image gave no verdict (exit {code}): {err.message}"
        return
    step.data.update(soak_summary(doc))
    windows, drift = doc["windows"], doc["drift"]
    if doc["verdict"] == "pass" and code == 0:
        first = windows[0]["mean_acceptance_length"] if windows else 0.0
        worst = windows[int(drift.get("worst_window") or 0)]["mean_acceptance_length"] if windows else 0.0
        step.status = "pass"
        step.detail = (
            f"{len(windows)} windows in {doc['seconds']:.0f} s on one engine: mean acceptance length "
            f"{first:.3f} in the first, {worst:.3f} at worst ({drift['worst_drop']:.1%} lower, "
            f"limit {max_drift:.0%})"
        )
    else:
        step.status = "fail"
        step.detail = "; ".join(doc["failures"]) or f"the soak exited {code} with verdict {doc['verdict']}"
