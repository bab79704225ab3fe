"""`speclock push-image`: push a built image to any OCI registry and print the pushed digest."""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys

from speclock.build.builders import get_builder
from speclock.build.records import read_record
from speclock.core.errors import BadInput, CheckFailed
from speclock.spec.stack import DEFAULT_STACK, load_stack


def is_loopback(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def destination(registry: str, stack_name: str, tag: str, repository: str | None = None) -> str:
    if not registry or registry.startswith(("http://", "https://", "docker://")) or " " in registry:
        raise BadInput(f"bad registry {registry!r}", hint="give HOST[:PORT], e.g. 127.0.0.1:5000 or ghcr.io/org")
    return f"{registry.rstrip('/')}/{repository or 'speclock-' + stack_name}:{tag}"


def push_image(stack_name: str, registry: str, *, builder_name: str = "buildah", tag: str | None = None,
               repository: str | None = None, insecure: bool | None = None, force: bool = False) -> dict:
    record = read_record(stack_name, builder_name, tag)
    verdict = record.get("selfcheck", {}).get("verdict")
    if verdict != "pass" and not force:
        reason = "its self-check did not run" if verdict is None else f"its self-check verdict is {verdict!r}"

        raise CheckFailed(f"refusing to push {record['ref']}: {reason}",
                          hint=f"`speclock build-image --stack {stack_name} --builder {builder_name}` (or `invoke "
                               f"build-image`) runs the image's self-check and records its verdict; fix what it reports "
                               f"(`speclock run-image --stack {stack_name}` runs the self-check again to look at it), "
                               "or pass --force to push anyway")
    builder = get_builder(builder_name)
    dest = destination(registry, stack_name, record["tag"], repository)
    digest = builder.push(record["ref"], dest, insecure=is_loopback(registry) if insecure is None else insecure)
    return {"ref": record["ref"], "pushed": dest, "digest": digest, "builder": builder_name}


def _cmd_push(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    result = push_image(stack.name, args.registry, builder_name=args.builder, tag=args.tag, repository=args.repository,
                        insecure=True if args.insecure else None, force=args.force)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"pushed {result['pushed']}\n  digest {result['digest']}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("push-image", help="push a built image to an OCI registry and print its digest",
                       description="Push the last image built for a stack (or --tag) to REGISTRY/speclock-<stack>:<tag>. "
                                   "Refuses an image whose self-check has not passed unless --force.")
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--registry", required=True, help="HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000")
    p.add_argument("--repository", help="repository name (default speclock-<stack>)")
    p.add_argument("--tag", help="content tag of the build to push (default: the latest build)")
    p.add_argument("--builder", default="buildah", choices=["buildah", "docker"], help="whose image store to push from")
    p.add_argument("--insecure", action="store_true", help="plain HTTP / no TLS verification (automatic for loopback)")
    p.add_argument("--force", action="store_true", help="push even if the self-check has not passed")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.set_defaults(func=_cmd_push)
