"""Doctor's runner: the checks in their order, one engine subprocess for all their questions, the
report (table or speclock.doctor/v1 JSON), the exit code and the `speclock doctor` command."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import Any, TypedDict

from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.heartbeat import Progress
from speclock.drafter.models import read_drafter_manifest, read_model_config
from speclock.verify.doctor.archs import CudaDriver, GpuArchs
from speclock.verify.doctor.aux_layers import AuxLayers
from speclock.verify.doctor.context import (
    Check,
    Context,
    DoctorCheck,
    DoctorOptions,
    Question,
    ask_engine,
    build_context,
    load_manifest,
    target_facts,
)
from speclock.verify.doctor.eagle3 import Eagle3Target
from speclock.verify.doctor.engine_import import EngineImport
from speclock.verify.doctor.flashinfer_kernels import FlashInferKernels
from speclock.verify.doctor.import_traps import ImportTraps
from speclock.verify.doctor.jit_needs import SglangJit
from speclock.verify.doctor.kernels import Kernels
from speclock.verify.doctor.model_identity import ModelIdentity
from speclock.verify.doctor.patches import Patches
from speclock.verify.doctor.pruned import Pruned
from speclock.verify.doctor.torch_archs import TorchArchs
from speclock.verify.doctor.triton_build import TritonBuild
from speclock.verify.doctor.versions import LockVersions
from speclock.verify.doctor.weights import Weights

DOCTOR_SCHEMA = "speclock.doctor/v1"
DESCRIPTION = """`speclock doctor`: static self-checks of an engine environment, no GPU needed.

They catch, before any GPU time is spent, the failures that cost EAGLE-3 deployments days:
an EAGLE-3 check that the engine runs on the OUTER model class (which a hand patch of the inner
class never touched), a drafter whose `eagle_aux_hidden_state_layer_ids` mean different layers
in vLLM and SGLang, kernels with no code for the GPU the image targets, a runtime need of the
serving path the image lacks (Triton's C compiler, FlashInfer's precompiled kernels, an
engine.env setting), and drift from the lock.

Checks (each prints PASS / FAIL / WARN / SKIP and a one-line reason):
  lock-versions   every locked package has the locked version in the engine's Python
  engine-import   the engine imports
  pruned          what [prune].packages leaves out is absent, and the engine's serving path (LLM entry,
                  OpenAI server, engine core, EAGLE-3 proposer) imports without it; a pruned package it
                  needs fails naming the stack key; nothing in site-packages matches [prune].paths
  import-traps    no known import trap of the engine springs on the GPU path (a table: engine,
                  versions, missing package, the engine.env setting that avoids it)
  patches         the stack's patch series is applied and every probe passes
  eagle3-target   the engine's registry resolves the target architecture and the engine's own
                  EAGLE-3 check passes on that class (the outer one, which the engine checks)
  weights         the target's and the drafter's safetensors files are whole and fit their config.json (headers,
                  dtypes, byte ranges inside each file, the shapes the config fixes), read by their headers alone
  model-identity  the target folder (and a drafter given by an absolute path) is the model the lock pins: config,
                  tokenizer and each weight file by size, header and bytes (docs/lock.md); one that differs fails
                  with exit 2 naming the file, unless --allow-other-model (then WARN); a lock made without the
                  model WARNs "model not pinned"
  aux-layers      the layers the engine will feed the drafter (engine's own convention, from
                  the config the drafter folder has) equal the drafter manifest's aux_layers_after
  gpu-archs       every compiled extension has SASS or usable PTX for each stack GPU arch
                  (cuobjdump), as a table per library: the engine's and its kernel packages'
                  (flashinfer + its cubin/jit-cache wheels, sgl_kernel, deep_gemm, triton, torch);
                  known gaps in the stack are accepted
  torch-archs     torch's compiled arch list (SASS + PTX) covers each stack GPU arch
  flashinfer-kernels  each arch where the engine runs FlashInfer (stack settings or the engine's
                  default) has FlashInfer's precompiled kernels (flashinfer-cubin / -jit-cache)
                  at flashinfer-python's version
  triton-build    Triton really builds and loads a C extension through its own build path
                  (C compiler, Python.h), with an empty cache; GPU stacks only (skipped where
                  [prune].packages removes triton)
  sglang-jit      SGLang's run-time JIT kernels (fused RoPE etc., nvcc through tvm_ffi) really build, for the
                  stack's first GPU arch, in the engine's run environment (engine.env + the CUDA_HOME speclock's
                  adapter makes from the lock's CUDA wheels), and the base has g++; SGLang GPU stacks only
  cuda-driver     CUDA runtime vs driver and the visible GPU's compute capability (cuda-python)
  kernels         speclock's own CUDA kernel library (kernels.build) holds a cubin for exactly each
                  stack GPU arch and no PTX (cuobjdump), and is the one its kernels.json describes

All engine questions go to the engine's Python in one subprocess (`speclock.engines.probe`).
Exit: 0 all pass (warnings allowed), 1 a check failed, 2 bad input (a model other than the lock's), 3 engine missing.
"""
# The order of the report.
DOCTOR_CHECKS: tuple[DoctorCheck, ...] = (
    LockVersions(),
    EngineImport(),
    Pruned(),
    ImportTraps(),
    Patches(),
    Eagle3Target(),
    Weights(),
    ModelIdentity(),
    AuxLayers(),
    GpuArchs(),
    TorchArchs(),
    FlashInferKernels(),
    TritonBuild(),
    SglangJit(),
    CudaDriver(),
    Kernels(),
)
CHECKS = tuple(c.name for c in DOCTOR_CHECKS)
ENGINE_CHECKS = tuple(c.name for c in DOCTOR_CHECKS if c.needs_engine)


def run_doctor(ctx: Context, only: list[str] | None = None, log: Progress | None = None) -> list[Check]:
    selected = [c for c in DOCTOR_CHECKS if not only or c.name in only]
    ctx.manifest = load_manifest(ctx.draft_dir)
    if ctx.draft_dir and (ctx.draft_dir / "config.json").is_file():
        read_model_config(ctx.draft_dir, what="drafter")  # before its path goes to the engine probe
    ctx.facts = target_facts(ctx, ctx.manifest)
    if ctx.python:
        request: dict[str, Question] = {}
        for check in selected:
            request.update(check.questions(ctx))
        if request:
            if log:
                log(f"asking {ctx.stack.engine['name']} in {ctx.python} ({len(request)} questions, one import)")
            ctx.engine_answers = ask_engine(ctx, request)
    results = []
    for check in selected:
        try:
            results.append(check.run(ctx))
        except EnvironmentProblem as err:
            results.append(Check(check.name, "fail", str(err).splitlines()[0]))
    return results


def exit_code_of(results: list[Check]) -> int | None:
    """The exit code a failed check carries (details.exit_code: model-identity's 2), else None (a failed check: 1)."""
    codes = [r.details["exit_code"] for r in results if r.status == "fail" and isinstance(r.details.get("exit_code"), int)]
    return max(codes) if codes else None


class DoctorEngine(TypedDict):
    name: str
    package: str
    version: str
    python: str | None  # the engine's Python; None when none was found


class DoctorReport(TypedDict):
    """`speclock doctor --json`: the speclock.doctor/v1 report."""

    schema: str
    stack: str
    engine: DoctorEngine
    checks: list[dict[str, Any]]  # asdict(Check): name, status, reason and the check's own open-ended details
    verdict: str  # pass | fail
    seconds: float


def doctor_json(ctx: Context, results: list[Check], verdict: str, seconds: float) -> DoctorReport:
    """The speclock.doctor/v1 report."""
    return {
        "schema": DOCTOR_SCHEMA,
        "stack": ctx.stack.name,
        "engine": {
            "name": ctx.stack.engine["name"],
            "package": ctx.stack.engine["package"],
            "version": ctx.stack.engine["version"],
            "python": ctx.python,
        },
        "checks": [asdict(r) for r in results],
        "verdict": verdict,
        "seconds": round(seconds, 1),
    }


def print_table(ctx: Context, results: list[Check], verdict: str, seconds: float) -> None:
    print(
        f"speclock doctor: stack {ctx.stack.name}, {ctx.stack.engine['package']} {ctx.stack.engine['version']}"
        f" ({ctx.python_note})"
    )
    for r in results:
        print(f"{r.status.upper():5} {r.name:14} {r.reason}")
        if r.name in ("gpu-archs", "kernels") and r.details.get("table"):
            print(r.details["table"])
    failed = sum(r.status == "fail" for r in results)
    print(f"verdict: {verdict} ({failed} failed, {sum(r.status == 'warn' for r in results)} warnings) in {seconds:.1f} s")


def doctor_main(opts: DoctorOptions) -> int:
    t0 = time.time()
    only = [c.strip() for c in opts.only.split(",")] if opts.only else None
    for c in only or []:
        if c not in CHECKS:
            raise BadInput(f"--only: unknown check {c!r}", hint=f"checks: {', '.join(CHECKS)}")
    ctx = build_context(opts)
    if opts.draft:
        # Named on doctor's command line, a drafter without its manifest would only turn aux-layers into a
        # warning and the verdict into a pass: refuse it instead.
        read_drafter_manifest(opts.draft, required=True)
    log = None if opts.json else (lambda m: print(f"  .. {m}", file=sys.stderr, flush=True))
    results = run_doctor(ctx, only, log=log)
    failed = [r for r in results if r.status == "fail"]
    verdict = "fail" if failed else "pass"
    if opts.json:
        print(json.dumps(doctor_json(ctx, results, verdict, time.time() - t0), indent=2))
    else:
        print_table(ctx, results, verdict, time.time() - t0)
    carried = exit_code_of(results)
    if carried is not None:  # a model other than the lock's: bad input, whatever else failed
        if opts.json:
            return carried
        refused = next(r for r in failed if r.details.get("exit_code") == carried)
        raise BadInput(f"doctor check {refused.name} failed", hint=refused.details.get("hint"))
    engine_missing = ctx.python is None and any(c in ENGINE_CHECKS for c in (only or CHECKS))
    if engine_missing:
        if opts.json:
            return EnvironmentProblem.exit_code
        raise EnvironmentProblem(
            f"no Python with {ctx.stack.engine['package']} {ctx.stack.engine['version']}: {ctx.python_note}",
            hint="install the engine or pass --python",
        )
    if failed and not opts.json:
        raise CheckFailed(
            f"{len(failed)} doctor check(s) failed: {', '.join(r.name for r in failed)}",
            hint="each FAIL line above says what is wrong",
        )
    return 1 if failed else 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    return doctor_main(
        DoctorOptions(
            stack=args.stack,
            python=args.python,
            site_packages=args.site_packages,
            lock=args.lock,
            target=args.target,
            draft=args.draft,
            arch=args.arch,
            only=args.only,
            json=args.json,
            allow_other_model=args.allow_other_model,
        )
    )


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor",
        help="static self-checks of an engine environment (no GPU needed)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--stack", help="check this stack on the host (default inside an image: the image's own)")
    p.add_argument("--python", help="the engine's Python (default: this one if it has the engine, else a cached engine env)")
    p.add_argument("--site-packages", help="engine site-packages to read (default: that of the engine's Python)")
    p.add_argument("--lock", help="lock file (default locks/<stack>.lock, or the image's)")
    p.add_argument("--target", help="target model folder with config.json")
    p.add_argument("--draft", help="drafter folder with config.json and speclock-manifest.json")
    p.add_argument("--arch", help="target architecture, overriding the target's config.json")
    p.add_argument("--only", help=f"comma-separated checks to run: {', '.join(CHECKS)}")
    p.add_argument(
        "--allow-other-model",
        action="store_true",
        help="a target (or drafter) folder whose identity differs from the lock's WARNs instead of failing (exit 2)",
    )
    p.add_argument("--json", action="store_true", help="print a speclock.doctor/v1 JSON report")
    p.set_defaults(func=_cmd_doctor)
