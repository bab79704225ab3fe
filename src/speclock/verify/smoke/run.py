"""Smoke's run: the engine without and with the drafter, the verdict and report.json (the numbers: smoke/measure.py)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import inspect
import json
import os
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from speclock.core import jsonread
from speclock.core.errors import BadInput, EnvironmentProblem, SpeclockError
from speclock.core.files import atomic_write_text, expect, os_error, read_json
from speclock.core.layout import IMAGE, in_image
from speclock.drafter.models import config_architecture, read_model_config
from speclock.drafter.models import target_sha256 as weights_sha256
from speclock.engines import (
    EngineConfig,
    EngineSession,
    SpecCounters,
    aux_layer_ids,
    get_engine,
    package_version,
    running,
    visible_arch,
)
from speclock.spec.prompts import chat_prompt_ids, load_prompts
from speclock.spec.stack import Stack
from speclock.verify.checks import failures_of, warnings_of
from speclock.verify.gate import evaluate
from speclock.verify.profiles import Profile
from speclock.verify.report import validate_report, write_report
from speclock.verify.report_types import SMOKE_SCHEMA_ID, EngineInfo, ImageIdentity, ProfileRecord, ReferenceSection, SmokeReport
from speclock.verify.smoke.inputs import SmokeInputs, log
from speclock.verify.smoke.measure import Measured, PassResult, backend_run, measure, metrics_of, throughput_section
from speclock.verify.smoke.reference import reference_key, reference_section
from speclock.verify.smoke.worker import WorkerSession, timed, worker_session
from speclock.verify.speed import CPU_NOTE, summarize_batch1, warm_runs
from speclock.verify.speed_load import loaded_runs, summarize_loaded


def image_identity() -> ImageIdentity:
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


def _plain_cache_file(cache: Path, inp: SmokeInputs, report: SmokeReport, prompt_ids: list[list[int]]) -> Path:
    """No-drafter outputs depend only on engine, settings, target, prompts and length: key them by all of those."""

    key = json.dumps(
        [
            report["engine"]["package"],
            report["engine"]["version"],
            inp.stack.engine["settings"],
            weights_sha256(inp.target),
            prompt_ids,
            inp.max_tokens,
        ],
        sort_keys=True,
    )
    return cache / f"plain-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _engine(engine_name: str, config: EngineConfig, label: str) -> running | worker_session:
    """One engine in its own worker process (smoke/worker.py: a crash fails fast, Ctrl-C stops it); attached to a
    running server (nothing is started) the session lives in this process."""
    return running(get_engine(engine_name), config) if config.server_url else worker_session(engine_name, config, label)


def _generate(
    inp: SmokeInputs,
    config: EngineConfig,
    prompt_ids: list[list[int]],
    label: str,
    passes: list[dict[str, Any] | None],
    speed: bool,
    report: SmokeReport,
) -> tuple[list[PassResult], list[int] | None, SpeedRuns]:
    """Start one engine, warm up, generate once per pass (None = greedy, else {temperature, seed}) with counters as
    deltas around each pass, then (speed) the batch-1 runs until steady; stop. Returns ([(outputs, seconds,
    counters) per pass], captured layers, the batch-1 runs)."""
    name = inp.stack.engine["name"]
    t0 = time.perf_counter()
    log(f"starting {name} {label}")
    with _engine(name, config, label) as session:
        can_sample = (
            session.sampling
            if isinstance(session, WorkerSession)
            else "sampling" in inspect.signature(session.generate).parameters
        )
        if any(passes) and not can_sample:
            raise BadInput(
                f"the {name} adapter generates greedily only",
                hint="run the quick or full profile here; the sampled profile needs an adapter that takes "
                "sampling parameters (the offline vLLM engine)",
            )
        if gpu := getattr(session, "gpu", None):  # a worker says which GPU its engine sees (WorkerSession.gpu)
            report.setdefault("gpu", {}).update(gpu)
        log(f"{name} {label} ready in {time.perf_counter() - t0:.1f} s")
        timed(session, prompt_ids[:1], 4)  # warm-up: first-call costs stay out of the timing
        results: list[PassResult] = []
        for sampling in passes:
            before = session.counters()
            outputs, seconds = timed(session, prompt_ids, inp.max_tokens, sampling)
            results.append((outputs, seconds, session.counters() - before))
            which = f" (pass {len(results)} of {len(passes)}, {sampling})" if sampling else ""
            log(f"{label}{which}: {len(prompt_ids)} prompts, {sum(map(len, outputs))} tokens in {seconds:.1f} s")
        speed_runs = SpeedRuns([], [], False)
        if speed and inp.speed_repeats:

            def once() -> tuple[int, float]:
                outputs, seconds = timed(session, prompt_ids[: inp.speed_prompts], inp.speed_max_tokens, one_at_a_time=True)
                return sum(map(len, outputs)), seconds

            speed_runs = SpeedRuns(*warm_runs(once, inp.speed_repeats))  # until steady (docs/smoke.md, Warm-up)
            if inp.speed_concurrent:  # under load: requests at once, each run at least MIN_LOADED_RUN_S long
                speed_runs = speed_runs._replace(loaded=_loaded_runs(session, inp, prompt_ids, label))
            shown = ", ".join(f"{t / s:.1f}" for t, s in speed_runs.kept)
            warm = ", ".join(f"{t / s:.1f}" for t, s in speed_runs.warmup)
            log(
                f"{label} at batch 1: {shown} tok/s ({min(inp.speed_prompts, len(prompt_ids))} prompts x "
                f"{inp.speed_max_tokens} tokens)"
                + (f" after warm-up runs {warm}" if warm else "")
                + ("" if speed_runs.steady else " (not steady: the last runs still differ by more than 5%)")
            )
        captured = session.captured_layers() if passes else None
    return results, captured, speed_runs


class SpeedRuns(NamedTuple):
    """One engine's batch-1 runs: the kept ones (tokens, seconds), the warm-up runs before them, whether they settled;
    `loaded`: the same under load (smoke.speed_concurrent requests at once), `batches`: the fewest batches in a run."""

    kept: list[tuple[int, float]]
    warmup: list[tuple[int, float]]
    steady: bool
    loaded: SpeedRuns | None = None
    batches: int = 0


def _loaded_runs(session: EngineSession, inp: SmokeInputs, prompt_ids: list[list[int]], label: str) -> SpeedRuns:
    """smoke.speed_concurrent requests at once (the prompts cycled), speed_max_tokens each, warmed up like batch 1."""
    batch = [prompt_ids[i % len(prompt_ids)] for i in range(inp.speed_concurrent)]
    counts: list[int] = []

    def one_batch() -> tuple[int, float]:
        outputs, seconds = timed(session, batch, inp.speed_max_tokens)
        return sum(map(len, outputs)), seconds

    def one_run() -> tuple[int, float]:
        tokens, seconds, batches = loaded_runs(one_batch)
        counts.append(batches)
        return tokens, seconds

    kept, warmup, steady = warm_runs(one_run, inp.speed_repeats)
    log(
        f"{label} with {inp.speed_concurrent} at once: {', '.join(f'{t / s:.1f}' for t, s in kept)} tok/s "
        f"(runs of {min(counts)}+ batches)" + ("" if steady else " (not steady)")
    )
    return SpeedRuns(kept, warmup, steady, None, min(counts))


def sampling_passes(profile: Profile | None) -> list[dict[str, Any] | None]:
    """One greedy pass, or one {temperature, seed} pass per seed of a sampled profile."""
    if profile is None or not profile.sampled:
        return [None]
    if not profile.per_request_seed:  # seeds name the passes; the engine's own generator draws (see profiles.py)
        return [{"temperature": profile.temperature} for _ in profile.seeds]
    return [{"temperature": profile.temperature, "seed": seed} for seed in profile.seeds]


def backend_variants(stack: Stack, settings: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """(backend name, engine settings) per attention backend the stack lists (smoke.attention_backends, merged
    into the settings under smoke.attention_backend_setting); [(None, settings)] when it lists none."""
    names = list(stack.smoke.get("attention_backends") or [])
    key = stack.smoke.get("attention_backend_setting") or "attention_backend"
    return [(name, {**settings, key: name}) for name in names] or [(None, dict(settings))]


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
        log(f"ignoring a damaged plain-output cache ({str(err).splitlines()[0]}); running without the drafter again")
        return None
    return outputs, float(seconds)


def skeleton(inp: SmokeInputs, texts: list[str]) -> SmokeReport:
    """The report with everything known before the engine runs (what a failed run still reports)."""
    tcfg = read_model_config(inp.target, what="target")
    n_layers = int(tcfg.get("num_hidden_layers") or 0)
    ids, ids_source = aux_layer_ids(inp.draft, n_layers)
    engine = inp.stack.engine
    engine_info: EngineInfo = {
        "name": engine["name"],
        "package": engine["package"],
        "version": package_version(engine["package"]),
        "pinned_version": engine["version"],
        "mode": "server" if inp.server_url else "offline",
    }
    if inp.server_url:  # server mode: requests in flight at once; the measured speedup depends on it (docs/smoke.md)
        engine_info["concurrency"] = inp.concurrency
    report: SmokeReport = {
        "schema": SMOKE_SCHEMA_ID,
        "stack": inp.stack.name,
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "image": image_identity(),
        "engine": engine_info,
        "target": {"path": str(inp.target), "arch": config_architecture(tcfg) or "?", "num_layers": n_layers},
        "draft": {"path": str(inp.draft), "aux_layer_ids": ids, "aux_layer_ids_source": ids_source, "captured_layers": None},
        "num_speculative_tokens": inp.k,
        "max_tokens": inp.max_tokens,
        "profile": _profile_record(inp),
        "prompts": {"source": str(inp.prompts_file), "count": len(texts)},
        "metrics": metrics_of(SpecCounters()),
        "throughput": {"baseline_tok_s": None, "spec_tok_s": None, "speedup": None},
        "lossless": {"checked": 0, "mismatches": 0, "first_mismatches": []},
        "reference": None,
        "thresholds": inp.thresholds,
        "run": {"id": inp.run_id or uuid.uuid4().hex, "completed": False, "stage": "start", "error": None, "seconds": None},
        "verdict": "fail",
        "failures": [],
    }
    if "target" in inp.identity:  # the served model against the lock's identity (verify.model_pin)
        report["target"]["identity"] = inp.identity["target"]
    if "draft" in inp.identity:
        report["draft"]["identity"] = inp.identity["draft"]
    return report


def _profile_record(inp: SmokeInputs) -> ProfileRecord:
    if inp.profile is None:
        return {"name": "quick"}
    rec = inp.profile.describe()
    rec["num_prompts"], rec["max_tokens"] = inp.num_prompts, inp.max_tokens  # what ran (flags may shorten it)
    return rec


def run_smoke(inp: SmokeInputs) -> tuple[SmokeReport, int]:
    """Run the smoke test; return (report, exit code). The report is written to inp.out_dir/report.json."""
    t_start = time.perf_counter()
    texts = load_prompts(inp.prompts_file)
    if len(texts) < inp.num_prompts:
        log(f"{inp.prompts_file} holds {len(texts)} prompts; using all of them")
    texts = texts[: inp.num_prompts]
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
            raise EnvironmentProblem(
                f"the engine package {report['engine']['package']} is not installed here",
                hint="run inside the image, or install the stack's engine in this environment",
            )
        get_engine(inp.stack.engine["name"])  # an unknown engine is bad input before anything runs
        arch = visible_arch(inp.stack)
        settings = inp.stack.engine_settings_for(arch)  # e.g. a Blackwell attention backend
        report.setdefault("gpu", {})["arch"] = arch
        run["stage"] = "plain (no drafter)"
        env = inp.stack.engine_env
        plain_cfg = EngineConfig(inp.target, None, inp.k, settings, inp.plain_server_url, env, concurrency=inp.concurrency)
        cache_file = _plain_cache_file(inp.plain_cache, inp, report, prompt_ids) if inp.plain_cache else None
        cached = read_plain_cache(cache_file, len(prompt_ids)) if cache_file else None
        speed = inp.speed_repeats > 0
        before = first_spec_runs = SpeedRuns([], [], False)
        if cached is not None:
            plain, plain_s = cached
            log(f"plain outputs reused from {cache_file}")
            report["lossless"]["plain_from"] = str(cache_file)
        if cached is None or speed:
            # the no-drafter pass is greedy in every profile: the lossless judge and the throughput baseline
            results, _, before = _generate(inp, plain_cfg, prompt_ids, "without drafter", [] if cached else [None], speed, report)
            if cached is None:
                [(plain, plain_s, _)] = results
                if cache_file:
                    try:
                        atomic_write_text(cache_file, json.dumps({"outputs": plain, "seconds": plain_s}))
                    except OSError as err:
                        raise os_error(err, cache_file, "write the plain-output cache") from None
        backends: list[Measured] = []
        for backend, backend_settings in backend_variants(inp.stack, settings):
            run["stage"] = "speculative (with drafter)" + (f", attention backend {backend}" if backend else "")
            spec_cfg = EngineConfig(
                inp.target,
                inp.draft,
                inp.k,
                backend_settings,
                inp.server_url,
                env,
                concurrency=inp.concurrency,
                k_per_batch_size=inp.stack.k_per_batch_size,
            )
            passes = sampling_passes(inp.profile)
            # batch-1 speed with the first backend only (one more pass per backend would not change the verdict)
            results, captured, spec_runs = _generate(
                inp,
                spec_cfg,
                prompt_ids,
                "with drafter" + (f" ({backend})" if backend else ""),
                passes,
                speed and not backends,
                report,
            )
            run["stage"] = "compare"
            backends.append(measure(inp, backend, passes, results, captured, plain, plain_s, prompt_ids, run))
            if spec_runs.kept:
                first_spec_runs = spec_runs
        if speed:
            # plain again: the machine's drift while the drafted engine ran brackets the speedup (speclock.verify.speed)
            run["stage"] = "plain again (no drafter, batch-1 speed)"
            _, _, after = _generate(inp, plain_cfg, prompt_ids, "without drafter, again", [], True, report)
            report["throughput"] = throughput_section(
                summarize_batch1(
                    before.kept,
                    first_spec_runs.kept,
                    after.kept,
                    prompts=min(inp.speed_prompts, len(prompt_ids)),
                    max_tokens=inp.speed_max_tokens,
                    warmup=[before.warmup, first_spec_runs.warmup, after.warmup],
                    steady_runs=[before.steady, first_spec_runs.steady, after.steady],
                ),
                backends[0]["concurrent"],
            )
            loads = [r.loaded for r in (before, first_spec_runs, after)]
            if all(x is not None and x.kept for x in loads):
                lb, ls, la = (x for x in loads if x is not None)
                report["throughput"]["loaded"] = summarize_loaded(
                    lb.kept,
                    ls.kept,
                    la.kept,
                    requests=inp.speed_concurrent,
                    max_tokens=inp.speed_max_tokens,
                    batches=min(lb.batches, ls.batches, la.batches),
                    warmup=[lb.warmup, ls.warmup, la.warmup],
                    steady_runs=[lb.steady, ls.steady, la.steady],
                )
        else:
            report["throughput"] = throughput_section(None, backends[0]["concurrent"])
        if not inp.stack.is_gpu:
            report["throughput"]["note"] = CPU_NOTE
        first = backends[0]
        report["metrics"], report["lossless"] = first["metrics"], first["lossless"]
        report["draft"]["captured_layers"] = first["captured_layers"]
        if first.get("sampled"):
            report["sampled"] = first["sampled"]
        if first["backend"] is not None:  # the stack lists attention backends: every variant has a name
            report["attention_backends"] = [backend_run(b["backend"], b) for b in backends if b["backend"] is not None]
        run["completed"], run["stage"] = True, "done"
        code = 0
    except (BadInput, EnvironmentProblem) as err:
        run["error"] = str(err)
        code = err.exit_code
    except Exception as err:  # an engine crash: the report says so and the check fails
        run["error"] = f"{type(err).__name__}: {err}"
        log("engine failure:\n" + traceback.format_exc(limit=6))
        code = 1
    reference_error = None
    reference: ReferenceSection
    try:
        if inp.profile is not None and inp.profile.sampled:
            # the reference decoder is greedy: its acceptance says nothing about a sampled run's
            reference = {
                "status": "not computed",
                "key": reference_key(inp, texts),
                "metrics": None,
                "gap": None,
                "note": "sampled profile: the reference decoder is greedy, so engine and reference "
                "are compared in the quick and full profiles only",
            }
        else:
            reference = reference_section(inp, texts, prompt_ids, report["metrics"] if run["completed"] else None)
    except (BadInput, EnvironmentProblem) as err:
        reference = {"status": "not computed", "key": None, "metrics": None, "gap": None, "note": str(err)}
        with contextlib.suppress(BadInput, EnvironmentProblem):  # keep the key: a report without it matches no baseline
            reference["key"] = reference_key(inp, texts)
        if isinstance(err, BadInput):  # a damaged recorded reference is bad input, never a silent "no reference"
            reference_error = err
    report["reference"] = reference
    if reference.get("note"):
        log(f"reference: {reference['note']}")
    checks = evaluate(report, inp.thresholds)
    failures = failures_of(checks)
    report["warnings"] = warnings_of(checks)  # e.g. a batch-1 speedup whose interval straddles min_speedup
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
        validate_report(jsonread.loads(json.dumps(report)), "the report being written")  # as the file will read
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
    log(f"wrote {path} in {run['seconds']:.1f} s")
    return report, code
