"""`speclock serve`: the stack's engine as an OpenAI-compatible server, with the stack's target, drafter,
engine settings (and the GPU arch's overrides), engine.env and the k it serves with.

The k a stack serves with (`serve.num_speculative_tokens`) is set from measured tokens/s and may differ
from smoke's k: the acceptance gate stays at k = 3, the engines' own CI standard, while the fastest k
for serving depends on the target, the drafter and the GPU (docs/gpu-runs/README.md). The server is
exec'ed, so inside a container it is PID 1's only child of note and gets the runtime's signals itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from speclock.core.args import draft_length, host_address, tcp_port
from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.layout import IMAGE, in_image
from speclock.drafter.models import draft_folder, read_model_config, target_folder
from speclock.drafter.weights_check import check_model_weights
from speclock.engines import EngineConfig, visible_arch
from speclock.engines.sglang import launch_command
from speclock.spec.k_schedule import vllm_speculative_config
from speclock.spec.stack import Stack, load_stack

DEFAULT_STACK = "cpu-vllm"
DEFAULT_PORT = {"vllm": 8000, "sglang": 30000}
# The engine's own server entry points (module run with `python -m`).
SERVER_MODULE = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}


def serving_k(stack: Stack) -> int:
    """serve.num_speculative_tokens, or smoke's k where the stack sets none (0)."""
    k: int = stack.section("serve").get("num_speculative_tokens") or stack.smoke["num_speculative_tokens"]
    return k


def _flags(settings: dict[str, Any]) -> list[str]:
    """Engine settings (keyword names) as server flags: key_name -> --key-name; True -> bare flag; False/None -> left out;
    a table -> JSON."""
    out: list[str] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (dict, list)):
            out += [flag, json.dumps(value, sort_keys=True)]
        else:
            out += [flag, str(value)]
    return out


def server_command(
    stack: Stack,
    *,
    target: Path,
    draft: Path | None,
    k: int,
    host: str,
    port: int,
    arch: str | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The command line that starts the stack's engine server (argv, no shell)."""
    engine = stack.engine["name"]
    settings = stack.engine_settings_for(arch)
    if engine == "vllm":
        cmd = [
            python,
            "-m",
            SERVER_MODULE[engine],
            "--model",
            str(target),
            "--served-model-name",
            stack.target["name"],
            "--host",
            host,
            "--port",
            str(port),
        ]
        cmd += _flags(settings)
        if draft is not None:
            cmd += [
                "--speculative-config",
                json.dumps(
                    {
                        "method": "eagle3",
                        "model": str(draft),
                        "num_speculative_tokens": k,
                        **vllm_speculative_config(stack.k_per_batch_size),
                    },
                    sort_keys=True,
                ),
            ]
        return cmd
    if engine == "sglang":
        cmd = launch_command(
            EngineConfig(target, draft, k, settings, k_per_batch_size=stack.k_per_batch_size), port=port, python=python
        )
        return cmd + ["--host", host, "--served-model-name", stack.target["name"]]
    raise BadInput(f"stack {stack.name}: engine {engine!r} has no server command here", hint="use vllm or sglang")


def _resolve(args: argparse.Namespace) -> tuple[Stack, Path, Path | None]:
    """Stack, target and drafter: from the flags, else the image's layout, else the repository's stack."""
    inside = in_image()
    stack = load_stack(args.stack or (IMAGE.stack_file if inside else DEFAULT_STACK))
    target = target_folder(stack, args.target)
    draft = None if args.no_draft else draft_folder(stack, args.draft)
    # configs and weights (headers, sizes, config shapes) before the server starts and loads them (#40)
    check_model_weights(target, read_model_config(target, what="target", option="--target"), what="target")
    if draft is not None:
        check_model_weights(draft, read_model_config(draft, what="draft", option="--draft"), what="draft")
    return stack, target, draft


def _cmd_serve(args: argparse.Namespace) -> int:
    stack, target, draft = _resolve(args)
    engine = stack.engine["name"]
    k = args.num_speculative_tokens or serving_k(stack)
    port = args.port or DEFAULT_PORT[engine]
    arch = visible_arch(stack)
    cmd = server_command(stack, target=target, draft=draft, k=k, host=args.host, port=port, arch=arch)
    env = {**os.environ, **stack.engine_env}
    if args.print_command:
        print(
            json.dumps({"argv": cmd, "env": stack.engine_env, "k": k if draft else 0, "arch": arch}, indent=2)
            if args.json
            else " ".join(shlex.quote(c) for c in cmd)
        )
        return 0
    if importlib.util.find_spec(SERVER_MODULE[engine].split(".")[0]) is None:
        raise EnvironmentProblem(
            f"the engine package {stack.engine['package']} is not installed here",
            hint="run `speclock serve` inside the image (docker run IMAGE serve), or in a host "
            "environment made by `speclock host-env`",
        )
    print(
        f"speclock serve: {stack.name}: {engine} on {args.host}:{port}, "
        + (f"EAGLE-3 drafter {draft}, k={k}" if draft else "no drafter"),
        file=sys.stderr,
        flush=True,
    )
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="start the stack's engine as an OpenAI-compatible server with its drafter",
        description="Starts the stack's engine server (vLLM: its OpenAI API server; SGLang: launch_server) with the "
        "stack's target, EAGLE-3 drafter, engine settings (with gpu.arch_settings for the visible GPU) and "
        "engine.env, drafting serve.num_speculative_tokens tokens per step (the k measured fastest for "
        "serving; smoke's k where the stack sets none). Inside an image it serves the image's own target "
        "and drafter: `docker run --gpus all -p 8000:8000 IMAGE serve --host 0.0.0.0`.",
    )
    p.add_argument("--stack", help="stack name or file (default: the image's stack, else cpu-vllm)")
    p.add_argument("--target", help="target model folder (default: the image's /opt/speclock/target)")
    p.add_argument("--draft", help="EAGLE-3 drafter folder (default: the image's, or the stack's draft.path)")
    p.add_argument("--no-draft", action="store_true", help="serve the target alone (for a throughput comparison)")
    p.add_argument("--num-speculative-tokens", "-k", type=draft_length, default=0, help="override the stack's serving k")
    p.add_argument("--host", type=host_address, default="127.0.0.1", help="address to listen on (0.0.0.0 inside a container)")
    p.add_argument("--port", type=tcp_port, default=0, help="port (default: 8000 for vLLM, 30000 for SGLang)")
    p.add_argument("--print-command", action="store_true", help="print the server command and exit")
    p.add_argument("--json", action="store_true", help="with --print-command: argv, env, k and arch as JSON")
    p.set_defaults(func=_cmd_serve)
