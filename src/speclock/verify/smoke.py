"""`speclock smoke`: prove that speculative decoding works in the engine at hand.

Runs the stack's engine twice on the same chat-templated prompts, greedily: without the drafter
(the judge of losslessness and the throughput baseline) and with it (counters taken as deltas
around the run). Compares the outputs token for token, computes the report contract's metrics,
compares acceptance with speclock's reference decoder on the same drafter and prompts (recorded
in the drafter's manifest, or run live), applies the stack's thresholds and writes the report.
The report is written even when the engine fails mid-run, with the failure in it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from speclock.core.args import non_negative_float, positive_int
from speclock.core.errors import BadInput, EnvironmentProblem, SpeclockError
from speclock.core.files import clean_stale_temps, expect, os_error, read_json
from speclock.core.layout import IMAGE, in_image, REPO_ROOT
from speclock.drafter.manifest import load_drafter
from speclock.drafter.models import (DRAFT_MANIFEST, check_reference_record, config_architecture,
                                     read_drafter_manifest, read_model_config, stack_model_path)
from speclock.drafter.models import check_drafter_manifest, target_sha256 as weights_sha256
from speclock.drafter.reference import load_target, run_reference
from speclock.engines import EngineConfig, SpecCounters, aux_layer_ids, get_engine, package_version, running
from speclock.spec.prompts import chat_prompt_ids, load_prompts, packaged_file, prompts_sha256
from speclock.spec.stack import load_stack
from speclock.verify import lossless
from speclock.verify.gate import evaluate, failures_of
from speclock.verify.report import SCHEMA_ID, human_table, validate_report, write_atomic, write_report

MANIFEST = DRAFT_MANIFEST


def _log(msg: str) -> None:
    print(f"smoke: {msg}", file=sys.stderr, flush=True)


@dataclass
class SmokeInputs:
    stack: Any  # speclock.spec.stack.Stack
    target: Path
    draft: Path
    prompts_file: Path
    num_prompts: int
    max_tokens: int
    k: int
    out_dir: Path
    reference: str = "recorded"  # recorded | live | off
    server_url: str = ""  # spec-decoding server (attach instead of starting the engine)
    plain_server_url: str = ""  # the same model served without a drafter
    thresholds: dict[str, Any] = field(default_factory=dict)
    plain_cache: Path | None = None  # reuse no-drafter outputs across runs (fault sweeps, tests)


# ---------------------------------------------------------------- inputs

def default_out_dir(stack_name: str) -> Path:
    return Path("/tmp/speclock-out") if in_image() else REPO_ROOT / "out" / f"smoke-{stack_name}"


def resolve_inputs(args: argparse.Namespace) -> SmokeInputs:
    """Paths from the flags, else from the image layout (inside an image), else from the stack."""
    inside = in_image()
    if args.stack:
        stack = load_stack(args.stack)
    elif inside:
        stack = load_stack(IMAGE.stack_file)
    else:
        stack = load_stack("cpu-vllm")
    smoke = stack.smoke
    if args.target:
        target = Path(args.target)
    elif inside:
        target = IMAGE.target_dir
    elif stack.target["path"]:
        target = stack_model_path(REPO_ROOT, stack.target["path"], "target.path", getattr(stack, "path", None))
    else:
        raise BadInput(f"stack {stack.name} ships its target in {stack.target['package']}; on the host give the converted folder",
                       hint="--target DIR (e.g. made by `python -m speclock.drafter.models convert`)")
    if args.draft:
        draft = Path(args.draft)
    else:
        draft = IMAGE.draft_dir if inside else stack_model_path(REPO_ROOT, stack.draft["path"], "draft.path",
                                                                getattr(stack, "path", None))
    if args.prompts:
        prompts = Path(args.prompts)
    elif inside:
        prompts = IMAGE.prompts_file
    elif smoke["prompts_file"]:
        prompts = packaged_file(smoke["prompts_file"])
    else:
        raise BadInput(f"stack {stack.name} names no prompts", hint="--prompts FILE (JSONL)")
    # Every model file smoke reads is checked here, before an engine starts or anything is written.
    read_model_config(target, what="target", option="--target")
    read_model_config(draft, what="draft", option="--draft")
    read_drafter_manifest(draft)  # optional, but when present its recorded references must be well-formed
    thresholds = dict(stack.thresholds)
    for key in ("min_mean_acceptance_length", "min_speedup", "max_reference_gap"):
        override = getattr(args, key, None)
        if override is not None:
            thresholds[key] = override
    n = args.num_prompts or smoke["num_prompts"]
    if n < 1 or (args.max_tokens is not None and args.max_tokens < 1):
        raise BadInput("--num-prompts and --max-tokens must be at least 1")
    out_dir = prepare_out_dir(Path(args.out) if args.out else default_out_dir(stack.name), "--out")
    plain_cache = prepare_out_dir(Path(args.plain_cache), "--plain-cache") if getattr(args, "plain_cache", None) else None
    return SmokeInputs(
        stack=stack, target=target, draft=draft, prompts_file=prompts, num_prompts=n,
        max_tokens=args.max_tokens or smoke["max_tokens"], k=smoke["num_speculative_tokens"],
        out_dir=out_dir, reference=args.reference,
        server_url=args.server or "", plain_server_url=args.plain_server or "", thresholds=thresholds,
        plain_cache=plain_cache)


def prepare_out_dir(path: Path, option: str) -> Path:
    """Create an output folder up front: a file in the way, no permission or a full disk is reported (exit 2/3)
    before the engine runs for minutes, not after."""
    if path.exists() and not path.is_dir():
        raise BadInput(f"{option} {path} is a file, where an output folder belongs", hint=f"give {option} a folder path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, path, "create the output folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise EnvironmentProblem(f"permission denied: cannot write into {path}",
                                 hint=f"give {option} a folder this user may write")
    clean_stale_temps(path)  # temp files a killed run left (the writers' TEMP_PREFIX)
    return path


def image_identity() -> dict[str, str]:
    """{ref, digest} of the image we run in: env (set by `docker run -e`), else image.json, else the host."""
    info: dict[str, Any] = {}
    if in_image() and IMAGE.build_info.is_file():
        try:
            info = read_json(IMAGE.build_info, what="image build info")
        except SpeclockError:
            info = {}  # the identity is informational: a damaged image.json leaves it empty, never crashes
    info = {k: v for k, v in info.items() if isinstance(v, str)}
    ref = os.environ.get("SPECLOCK_IMAGE_REF") or info.get("ref") or info.get("tag") or ("" if in_image() else "host")
    digest = os.environ.get("SPECLOCK_IMAGE_DIGEST") or info.get("digest") or ""
    return {"ref": str(ref), "digest": str(digest)}


# ---------------------------------------------------------------- reference

def reference_key(inp: SmokeInputs, texts: list[str]) -> dict[str, Any]:
    # Tensors only (config excluded): a drafter keeps its identity when only its config changes,
    # so a recorded reference still judges an engine that is fed the wrong layers.

    return {"target_sha256": weights_sha256(inp.target), "drafter_sha256": weights_sha256(inp.draft),
            "prompts_sha256": prompts_sha256(texts), "num_prompts": len(texts), "k": inp.k, "max_tokens": inp.max_tokens}


REFERENCE_KEY_FIELDS = ("target_sha256", "drafter_sha256", "prompts_sha256", "num_prompts", "k", "max_tokens")


def lookup_recorded(manifest_path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The recorded reference metrics for `key` in a drafter manifest, or None.

    Every record is checked first (speclock.drafter.models.check_reference_record): a record of the wrong
    shape is BadInput naming the manifest and the key, never a crash and never a match. A match
    needs all six key fields equal with equal JSON types (3 is not "3", 1 is not true).
    """
    if not manifest_path.exists() and not manifest_path.is_symlink():
        return None
    manifest = read_drafter_manifest(manifest_path.parent) if manifest_path.name == DRAFT_MANIFEST else None
    if manifest is None:  # a manifest under another name (tests, tools): read and check it the same way

        manifest = check_drafter_manifest(read_json(manifest_path, what="drafter manifest"), manifest_path)
    found = None
    for i, rec in enumerate(manifest.get("reference") or []):
        check_reference_record(rec, f"reference[{i}]", manifest_path)
        rkey = rec["key"]
        if all(type(rkey.get(f)) is type(key.get(f)) and rkey.get(f) == key.get(f) for f in REFERENCE_KEY_FIELDS):
            found = rec["metrics"]  # the last record for a key wins (record_reference replaces in place)
    return found


def run_live_reference(inp: SmokeInputs, prompt_ids: list[list[int]]) -> dict[str, Any]:
    """speclock's own speculative decoder (training branch) on the same drafter and prompts; slow on a CPU.

    It feeds the drafter the layers recorded in its manifest (`aux_layers_after`, what it was trained
    on), not the config's ids: that is what makes it an independent judge of the engine's wiring.
    """
    target, tokenizer = load_target(inp.target)
    drafter, manifest = load_drafter(inp.draft, target)
    done = [0]

    def progress(i, n, metrics):
        if i == n or i - done[0] >= 10:
            done[0] = i
            _log(f"reference: {i}/{n} prompts, mean acceptance length so far {metrics['mean_acceptance_length']:.3f}")

    run = run_reference(target, tokenizer, drafter, manifest["aux_layers_after"], prompt_ids, inp.k, inp.max_tokens, progress=progress)
    return run.metrics


def reference_section(inp: SmokeInputs, texts: list[str], prompt_ids: list[list[int]], engine_metrics: dict | None) -> dict[str, Any]:
    key = reference_key(inp, texts)
    section: dict[str, Any] = {"status": "not computed", "key": key, "metrics": None, "gap": None, "note": ""}
    if inp.reference == "off":
        section["note"] = "reference comparison turned off (--reference off)"
        return section
    metrics = lookup_recorded(inp.draft / MANIFEST, key)
    if metrics is not None:
        section.update(status="recorded", metrics=metrics)
    elif inp.reference == "live":
        _log(f"running the reference decoder live on {len(prompt_ids)} prompts (slow on a CPU)")
        section.update(status="live", metrics=run_live_reference(inp, prompt_ids))
    else:
        section["note"] = (f"no reference recorded in {inp.draft / MANIFEST} for this (target, drafter, prompts, k, max_tokens); "
                           "run with --reference live, or record one with the training tools")
        return section
    if engine_metrics is not None:
        ref_len = float(expect(section["metrics"].get("mean_acceptance_length"), float,
                               "reference metrics mean_acceptance_length", path=inp.draft / MANIFEST))
        section["gap"] = abs(ref_len - engine_metrics["mean_acceptance_length"]) / ref_len if ref_len else None
    return section


# ---------------------------------------------------------------- the run

def visible_arch(stack) -> str | None:
    """The stack arch name of the visible GPU (sm_100 -> sm_100a when the stack targets that), or None."""
    if not stack.is_gpu:
        return None
    try:
        # heavy, optional (torch): imported only where it is used
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
    except Exception:
        return None
    plain = f"sm_{major}{minor}"
    return plain + "a" if plain + "a" in stack.gpu["archs"] else plain


def _plain_cache_file(inp: SmokeInputs, report: dict[str, Any], prompt_ids: list[list[int]]) -> Path:
    """No-drafter outputs depend only on engine, settings, target, prompts and length: key them by all of those."""

    key = json.dumps([report["engine"]["package"], report["engine"]["version"], inp.stack.engine["settings"],
                      weights_sha256(inp.target), prompt_ids, inp.max_tokens], sort_keys=True)
    return inp.plain_cache / f"plain-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _generate(engine, config: EngineConfig, prompt_ids: list[list[int]], max_tokens: int, label: str):
    """Start, warm up, generate with counters as deltas, stop. Returns (outputs, seconds, counters, captured)."""
    t0 = time.perf_counter()
    _log(f"starting {engine.NAME} {label}")
    # `running` stops the engine on every exit; on Ctrl-C it kills what the engine started within ~2 s.
    with running(engine, config) as session:
        _log(f"{engine.NAME} {label} ready in {time.perf_counter() - t0:.1f} s; generating {len(prompt_ids)} prompts x {max_tokens} tokens")
        session.generate(prompt_ids[:1], 4)  # warm-up: first-call costs stay out of the timing
        before = session.counters()
        t1 = time.perf_counter()
        outputs = session.generate(prompt_ids, max_tokens)
        seconds = time.perf_counter() - t1
        delta = session.counters() - before
        captured = session.captured_layers()
    _log(f"{label}: {sum(map(len, outputs))} tokens in {seconds:.1f} s")
    return outputs, seconds, delta, captured


def read_plain_cache(cache_file: Path, n_prompts: int) -> tuple[list[list[int]], float] | None:
    """Cached no-drafter outputs, or None when absent or damaged (a cache is rebuilt, never trusted blindly)."""
    if not cache_file.is_file():
        return None
    try:
        cached = read_json(cache_file, what="plain-output cache")
        outputs = expect(cached.get("outputs"), list, "outputs", path=cache_file)
        seconds = expect(cached.get("seconds"), float, "seconds", path=cache_file)
        if len(outputs) != n_prompts or seconds <= 0:
            raise BadInput(f"{cache_file}: {len(outputs)} outputs for {n_prompts} prompts, {seconds} s")
        for i, out in enumerate(outputs):
            for j, tok in enumerate(expect(out, list, f"outputs[{i}]", path=cache_file)):
                expect(tok, int, f"outputs[{i}][{j}]", path=cache_file)
    except BadInput as err:
        _log(f"ignoring a damaged plain-output cache ({str(err).splitlines()[0]}); running without the drafter again")
        return None
    return outputs, float(seconds)


def skeleton(inp: SmokeInputs, texts: list[str]) -> dict[str, Any]:
    """The report with everything known before the engine runs (what a failed run still reports)."""
    tcfg = read_model_config(inp.target, what="target")
    n_layers = int(tcfg.get("num_hidden_layers") or 0)
    ids, ids_source = aux_layer_ids(inp.draft, n_layers)
    engine = inp.stack.engine
    return {
        "schema": SCHEMA_ID,
        "stack": inp.stack.name,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "image": image_identity(),
        "engine": {"name": engine["name"], "package": engine["package"], "version": package_version(engine["package"]),
                   "pinned_version": engine["version"], "mode": "server" if inp.server_url else "offline"},
        "target": {"path": str(inp.target), "arch": config_architecture(tcfg) or "?", "num_layers": n_layers},
        "draft": {"path": str(inp.draft), "aux_layer_ids": ids, "aux_layer_ids_source": ids_source, "captured_layers": None},
        "num_speculative_tokens": inp.k,
        "max_tokens": inp.max_tokens,
        "prompts": {"source": str(inp.prompts_file), "count": len(texts)},
        "metrics": SpecCounters().metrics(),
        "throughput": {"baseline_tok_s": None, "spec_tok_s": None, "speedup": None},
        "lossless": {"checked": 0, "mismatches": 0, "first_mismatches": []},
        "reference": None,
        "thresholds": inp.thresholds,
        "run": {"completed": False, "stage": "start", "error": None, "seconds": None},
        "verdict": "fail",
        "failures": [],
    }


def run_smoke(inp: SmokeInputs) -> tuple[dict[str, Any], int]:
    """Run the smoke test; return (report, exit code). The report is written to inp.out_dir/report.json."""
    t_start = time.perf_counter()
    texts = load_prompts(inp.prompts_file)
    if len(texts) < inp.num_prompts:
        _log(f"{inp.prompts_file} holds {len(texts)} prompts; using all of them")
    texts = texts[:inp.num_prompts]
    try:
        # heavy, optional (transformers): imported only where it is used
        from transformers import AutoTokenizer
    except ImportError as err:
        raise EnvironmentProblem(f"transformers is not importable: {err}", hint="run in the engine's environment") from None
    tokenizer = AutoTokenizer.from_pretrained(str(inp.target))
    prompt_ids = [chat_prompt_ids(tokenizer, t) for t in texts]
    report = skeleton(inp, texts)
    code = 1
    run = report["run"]
    try:
        if not inp.server_url and not report["engine"]["version"]:
            raise EnvironmentProblem(f"the engine package {report['engine']['package']} is not installed here",
                                     hint="run inside the image, or install the stack's engine in this environment")
        engine = get_engine(inp.stack.engine["name"])
        arch = visible_arch(inp.stack)
        settings = inp.stack.engine_settings_for(arch)  # e.g. a Blackwell attention backend
        report.setdefault("gpu", {})["arch"] = arch
        run["stage"] = "plain (no drafter)"
        plain_cfg = EngineConfig(inp.target, None, inp.k, settings, inp.plain_server_url)
        cache_file = _plain_cache_file(inp, report, prompt_ids) if inp.plain_cache else None
        cached = read_plain_cache(cache_file, len(prompt_ids)) if cache_file else None
        if cached is not None:
            plain, plain_s = cached
            _log(f"plain outputs reused from {cache_file}")
            report["lossless"]["plain_from"] = str(cache_file)
        else:
            plain, plain_s, _, _ = _generate(engine, plain_cfg, prompt_ids, inp.max_tokens, "without drafter")
            if cache_file:
                try:
                    write_atomic(cache_file, json.dumps({"outputs": plain, "seconds": plain_s}))
                except OSError as err:
                    raise os_error(err, cache_file, "write the plain-output cache") from None
        run["stage"] = "speculative (with drafter)"
        spec_cfg = EngineConfig(inp.target, inp.draft, inp.k, settings, inp.server_url)
        spec, spec_s, delta, captured = _generate(engine, spec_cfg, prompt_ids, inp.max_tokens, "with drafter")
        run["stage"] = "compare"
        report["draft"]["captured_layers"] = captured
        report["metrics"] = delta.metrics()
        base_tps, spec_tps = sum(map(len, plain)) / plain_s, sum(map(len, spec)) / spec_s
        report["throughput"] = {"baseline_tok_s": round(base_tps, 2), "spec_tok_s": round(spec_tps, 2),
                                "speedup": round(spec_tps / base_tps, 4), "baseline_s": round(plain_s, 3), "spec_s": round(spec_s, 3)}
        judge = None
        if plain != spec:  # the float32 judge loads the target: only when something diverged
            run["stage"] = "lossless (judging divergences)"
            judge = lossless.float32_judge(inp.target, log=_log)
        report["lossless"] = lossless.compare(plain, spec, prompt_ids, judge)
        if report["lossless"]["numeric_ties"]:
            _log(f"lossless: {report['lossless']['numeric_ties']} prompt(s) part at numeric ties of the target "
                 f"(float32 margin <= tie limit), {report['lossless']['mismatches']} real mismatch(es)")
        run.update(completed=True, stage="done")
        code = 0
    except (BadInput, EnvironmentProblem) as err:
        run["error"] = str(err)
        code = err.exit_code
    except Exception as err:  # an engine crash: the report says so and the check fails
        run["error"] = f"{type(err).__name__}: {err}"
        _log("engine failure:\n" + traceback.format_exc(limit=6))
        code = 1
    reference_error = None
    try:
        report["reference"] = reference_section(inp, texts, prompt_ids, report["metrics"] if run["completed"] else None)
    except (BadInput, EnvironmentProblem) as err:
        try:  # keep the key: without it the report cannot be matched to a baseline's drafter
            key = reference_key(inp, texts)
        except (BadInput, EnvironmentProblem):
            key = None
        report["reference"] = {"status": "not computed", "key": key, "metrics": None, "gap": None, "note": str(err)}
        if isinstance(err, BadInput):  # a damaged recorded reference is bad input, never a silent "no reference"
            reference_error = err
    if report["reference"].get("note"):
        _log(f"reference: {report['reference']['note']}")
    failures = failures_of(evaluate(report, inp.thresholds))
    if not run["completed"]:
        # Counters of a run that did not finish say nothing about the drafter: report the crash alone.
        failures = [f"engine failed during {run['stage']}: {run['error']}"]
    if reference_error is not None:
        failures = failures + [f"reference: {str(reference_error).splitlines()[0]}"]
    report["failures"] = failures
    report["verdict"] = "fail" if failures else "pass"
    if code == 0 and failures:
        code = BadInput.exit_code if reference_error is not None else 1
    run["seconds"] = round(time.perf_counter() - t_start, 2)
    try:
        validate_report(report, "the report being written")
    except BadInput as err:
        # The engine's own counters contradict each other (or the reference disagrees with them): that is
        # a failed check of the engine, not bad input from the user. The report is still written, for
        # diagnosis; gate refuses it (exit 2) if anyone tries to pass it off.
        report["failures"] = report["failures"] + [f"inconsistent measurements: {str(err).splitlines()[0]}"]
        report["verdict"] = "fail"
        code = code or 1
    try:
        path = write_report(inp.out_dir / "report.json", report)
    except OSError as err:
        raise os_error(err, inp.out_dir / "report.json", "write the report") from None
    _log(f"wrote {path} in {run['seconds']:.1f} s")
    return report, code


def _cmd_smoke(args: argparse.Namespace) -> int:
    inp = resolve_inputs(args)
    report, code = run_smoke(inp)
    print(json.dumps(report, indent=2) if args.json else human_table(report))
    return code


def server_url(text: str) -> str:
    """--server/--plain-server: an http(s) URL with a host (argparse type: anything else is exit 2 at parse time)."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL with a host (e.g. http://127.0.0.1:8000)")
    return text


def add_smoke_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", help="stack name or path (default: the image's stack; on the host cpu-vllm)")
    p.add_argument("--target", help="target model folder (default: the image's /opt/speclock/target)")
    p.add_argument("--draft", help="EAGLE-3 drafter folder (default: the image's, or the stack's draft.path)")
    p.add_argument("--prompts", help="JSONL prompt file (default: the image's, or the stack's MT-Bench questions)")
    p.add_argument("--num-prompts", type=positive_int, help="prompts to use (default: the stack's smoke.num_prompts)")
    p.add_argument("--max-tokens", type=positive_int, help="new tokens per prompt (default: the stack's smoke.max_tokens)")
    p.add_argument("--reference", choices=["recorded", "live", "off"], default="recorded",
                   help="engine-vs-reference comparison: the result recorded in the drafter's manifest (default), "
                        "run the reference decoder now (slow on a CPU), or skip")
    p.add_argument("--server", type=server_url, help="URL of a running engine server with the drafter (instead of starting the engine)")
    p.add_argument("--plain-server", type=server_url, help="URL of the same model served without a drafter (with --server)")
    p.add_argument("--min-mean-acceptance-length", dest="min_mean_acceptance_length", type=non_negative_float,
                   help="override the stack's floor (e.g. to show that a too-high floor fails)")
    p.add_argument("--plain-cache", help="folder to keep and reuse no-drafter outputs, keyed by engine, settings, target, "
                                          "prompts and max_tokens (for sweeps over many drafters; a self-check runs both)")
    p.add_argument("--out", help="output folder for report.json (default: /tmp/speclock-out in an image, out/smoke-<stack> on the host)")


def add_commands(sub) -> None:
    p = sub.add_parser("smoke", help="run the engine with and without the drafter: lossless, acceptance, speedup",
                       description=__doc__.split("\n\n")[1] + "\n\nExit 0 pass, 1 check failed (or the engine crashed), "
                                   "2 bad input, 3 environment problem (engine missing).",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_smoke_arguments(p)
    p.add_argument("--json", action="store_true", help="print the report JSON instead of the table")
    p.set_defaults(func=_cmd_smoke)
