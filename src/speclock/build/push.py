"""`speclock push-image`: push a built image to any OCI registry, print the digest the registry serves
(read back with skopeo) and the command that runs it by that digest on a GPU host. Its SBOM, and with --attestation
a signed smoke report (docs/attestation.md), go beside it as OCI referrers."""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from typing import Any, NotRequired, TypedDict

from speclock.build.builders import get_builder
from speclock.build.labels import LABEL_PREFIX, OCI_PREFIX, is_dirty
from speclock.build.records import BuildRecord, read_record
from speclock.build.registry import referrers
from speclock.build.registry.client import RegistryClient, registry_digest, split_registry
from speclock.build.runtimes import GPUS_HELP, Mount, gpu_host_commands, gpu_host_serve_commands, parse_gpus
from speclock.build.sbom.referrer import push_sbom_referrer
from speclock.core import dsse
from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import MAX_READ_BYTES, read_bytes
from speclock.core.jsonread import loads
from speclock.engines.serve import DEFAULT_PORT
from speclock.spec.stack import DEFAULT_STACK, Stack, load_stack

# The printed lines of a target.path stack mount the model (its image holds none) from this placeholder, which the
# user replaces with the model's folder on the GPU host (a plain path, so the line stays unquoted and copyable).
MODEL_PLACEHOLDER = "/path/to/model"


def printed_mounts(stack: Stack) -> list[Mount]:
    """The mounts the printed run and serve lines carry: the target's, read-only, for a target.path stack; none else."""
    return [Mount(MODEL_PLACEHOLDER, "/opt/speclock/target", readonly=True)] if stack.target["path"] else []


def is_loopback(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def destination(registry: str, stack_name: str, tag: str, repository: str | None = None) -> str:
    host, name = split_registry(registry, repository or f"speclock-{stack_name}")  # the SBOM push reads it the same way
    return f"{host}/{name}:{tag}"


def built_dirty(record: BuildRecord) -> bool:
    """Whether the build's inputs had uncommitted edits (io.speclock.dirty; older records: the revision)."""
    labels = record.get("labels") or {}
    if f"{LABEL_PREFIX}.dirty" in labels:
        return labels[f"{LABEL_PREFIX}.dirty"] == "true"
    return is_dirty(labels.get(f"{OCI_PREFIX}.revision", ""))


def refusals(record: BuildRecord, stack_name: str, builder_name: str) -> list[tuple[str, str]]:
    """(why, what to do) for each reason not to push this build."""
    out = []
    verdict = record["selfcheck"].get("verdict") if "selfcheck" in record else None
    if verdict != "pass":
        reason = "its self-check did not run" if verdict is None else f"its self-check verdict is {verdict!r}"
        out.append(
            (
                reason,
                f"`speclock build-image --stack {stack_name} --builder {builder_name}` (or `invoke "
                f"build-image`) runs the image's self-check and records its verdict; fix what it reports "
                f"(`speclock run-image --stack {stack_name}` runs the self-check again to look at it)",
            )
        )
    if built_dirty(record):
        revision = (record.get("labels") or {}).get(f"{OCI_PREFIX}.revision", "?")
        out.append(
            (
                f"it was built from uncommitted edits (revision {revision}, {LABEL_PREFIX}.dirty=true): its "
                "labels name no commit that holds its inputs",
                "commit the edits (`git status` lists them) and build again (`speclock build-image "
                f"--stack {stack_name} --builder {builder_name}`)",
            )
        )
    return out


def attestation_subjects(data: bytes, source: str) -> tuple[list[str], str]:
    """(the subjects' sha256 digests, predicateType) of a DSSE envelope holding an in-toto statement. The signature is
    not checked here (push has no public key): `speclock gate --verify-key` checks it wherever the report is used."""
    envelope = dsse.parse(data, source)
    try:
        doc = loads(envelope["payload"]) if envelope["payloadType"] == dsse.INTOTO_PAYLOAD_TYPE else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("subject"), list):
        raise BadInput(
            f"{source}: the envelope holds no in-toto statement (payloadType {envelope['payloadType']!r})",
            hint="give the attestation.intoto.json that `speclock selfcheck --sign-key` wrote",
        )
    subjects = dsse.statement_subjects(
        doc, source, hint="give the attestation.intoto.json that `speclock selfcheck --sign-key` wrote"
    )
    digests = [str(s["digest"].get("sha256")) for s in subjects]
    return digests, str(doc.get("predicateType") or "")


def check_attestation_of_build(data: bytes, source: str, record: BuildRecord) -> None:
    """BadInput unless the envelope's subject names the build's image ID (what its self-check signs), checked before
    anything is pushed. After the push, push_attestation_referrer checks the pushed manifest's digests as well."""
    subjects, _ = attestation_subjects(data, source)
    image_id = record["image_id"].removeprefix("sha256:")
    if image_id not in subjects:
        named = ", ".join(f"sha256:{s[:16]}" for s in subjects) or "nothing"
        raise BadInput(
            f"{source}: subject: the attestation is for {named}, not for the image {record['ref']} to be pushed "
            f"(image ID sha256:{image_id[:16]}, from its build record)",
            hint="attach the attestation of this build's own self-check (`speclock selfcheck --sign-key` in the image "
            "names its image ID); a host run's attestation names a lock, not an image",
        )


def push_attestation_referrer(
    registry: str, repository: str, digest: str, data: bytes, *, insecure: bool, source: str = "the attestation"
) -> dict[str, Any]:  # an OCI descriptor (open-ended: annotations, artifactType)
    """Push a DSSE envelope beside the image manifest `digest` as an OCI referrer (artifactType
    application/vnd.dsse.envelope.v1+json: the bytes are the envelope; its payload's type is in-toto's). Its subject
    must be this image: the manifest's digest, or its config's (the image ID a build's self-check names)."""
    reg = RegistryClient(registry, repository, insecure=insecure)
    subject = referrers.subject_manifest(reg, digest, then="its attestation")
    manifest = referrers.registry_json(reg, subject[1], f"manifest {digest}")
    ours = {digest.partition(":")[2], str((manifest.get("config") or {}).get("digest", "")).partition(":")[2]} - {""}
    subjects, predicate_type = attestation_subjects(data, source)
    if not ours & set(subjects):
        raise BadInput(
            f"{source}: subject: the attestation is for sha256:{', sha256:'.join(s[:16] for s in subjects)}, "
            f"not for the image {reg.name}@{digest} (manifest or config digest)",
            hint="attach the attestation of this image's own self-check (run by digest, signed with "
            "--sign-key); a host run's attestation names a lock, not an image",
        )
    pushed = referrers.push_referrer(
        reg,
        digest,
        data,
        artifact_type=dsse.ENVELOPE_MEDIA_TYPE,
        title="attestation.intoto.json",  # the name selfcheck gives it
        subject=subject,
        layer_annotations={"in-toto.io/predicate-type": predicate_type},
    )
    pushed["attestation_digest"] = pushed.pop("blob_digest")
    return pushed


class PushResult(TypedDict):
    """What push-image did (its --json answer)."""

    ref: str
    pushed: str
    digest: str
    by_digest: str
    builder: str
    run: dict[str, str]  # runtime -> the command line that runs the pushed image on a GPU host
    serve: dict[str, str]  # runtime -> the command line that serves it
    model_placeholder: NotRequired[str]
    sbom: NotRequired[dict[str, Any] | None]  # the SBOM referrer's OCI descriptor (registry JSON)
    attestation: NotRequired[dict[str, Any] | None]  # the attestation referrer's OCI descriptor (registry JSON)
    forced: NotRequired[list[str]]


def push_image(
    stack_name: str,
    registry: str,
    *,
    builder_name: str = "buildah",
    tag: str | None = None,
    repository: str | None = None,
    insecure: bool | None = None,
    force: bool = False,
    gpus: str = "all",
    attestation: str | None = None,
) -> PushResult:
    record = read_record(stack_name, builder_name, tag)
    # read and matched to the build before any registry call: a bad file, or one of another image, pushes nothing
    signed = None
    if attestation:
        signed = read_bytes(attestation, what="--attestation file", max_bytes=MAX_READ_BYTES)
        check_attestation_of_build(signed, attestation, record)
    gpu_selection = parse_gpus(gpus)
    dest = destination(registry, stack_name, record["tag"], repository)
    refused = refusals(record, stack_name, builder_name)
    if refused and not force:
        raise CheckFailed(
            f"refusing to push {record['ref']}: " + "; ".join(why for why, _ in refused),
            hint="; ".join(fix for _, fix in refused) + "; or pass --force to push it anyway",
        )
    builder = get_builder(builder_name)
    insecure = is_loopback(registry) if insecure is None else insecure
    pushed = builder.push(record["ref"], dest, insecure=insecure)
    # What the registry serves for the tag now, read back: the digest to pull and run by.
    digest = registry_digest(dest, insecure=insecure)
    if digest != pushed:
        raise CheckFailed(
            f"the registry serves {digest} for {dest}, but the push wrote {pushed}",
            hint="another push of the same tag came in between: push again, and pull by the digest this prints",
        )
    by_digest = f"{dest.rsplit(':', 1)[0]}@{digest}"
    stack = load_stack(stack_name)
    mounts = printed_mounts(stack)
    result: PushResult = {
        "ref": record["ref"],
        "pushed": dest,
        "digest": digest,
        "by_digest": by_digest,
        "builder": builder_name,
        "run": gpu_host_commands(by_digest, gpu_selection, mounts),
        "serve": gpu_host_serve_commands(by_digest, DEFAULT_PORT[stack.engine["name"]], gpu_selection, mounts),
    }
    if mounts:
        result["model_placeholder"] = MODEL_PLACEHOLDER
    # The SBOM the image holds, beside it as an OCI referrer (images built before SBOMs have none to push).
    if f"{LABEL_PREFIX}.sbom" in (record.get("labels") or {}):
        result["sbom"] = push_sbom_referrer(registry, repository or f"speclock-{stack_name}", digest, insecure=insecure)
    else:
        result["sbom"] = None
    result["attestation"] = None
    if signed is not None and attestation:
        result["attestation"] = push_attestation_referrer(
            registry, repository or f"speclock-{stack_name}", digest, signed, insecure=insecure, source=attestation
        )
    if refused:
        result["forced"] = [why for why, _ in refused]
    return result


def _cmd_push(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    result = push_image(
        stack.name,
        args.registry,
        builder_name=args.builder,
        tag=args.tag,
        repository=args.repository,
        insecure=True if args.insecure else None,
        force=args.force,
        gpus=args.gpus,
        attestation=args.attestation,
    )
    for why in result.get("forced", []):
        print(f"warning: pushed with --force although {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"pushed {result['pushed']}\n  digest {result['digest']}\n"
            f"run it on a GPU host (the hardening of `speclock run-image`, by digest):\n"
            f"  {result['run']['docker']}\n  {result['run']['podman']}\n"
            f"serve it there (`speclock serve`: the engine's OpenAI API with the drafter, at the stack's serving k):\n"
            f"  {result['serve']['docker']}\n  {result['serve']['podman']}"
        )
        if result.get("model_placeholder"):
            print(
                f"  replace {result['model_placeholder']} with the folder of the target model on that host: the image "
                "holds none (target.path); it is mounted read-only at /opt/speclock/target"
            )
        sbom = result["sbom"]
        print(
            f"  sbom {sbom['digest']} (referrer of {result['digest']})"
            if sbom
            else "  sbom: none (the image was built before speclock put SBOMs into images; rebuild to get one)"
        )
        if result["attestation"]:
            print(f"  attestation {result['attestation']['digest']} (referrer of {result['digest']})")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "push-image",
        help="push a built image to an OCI registry and print its digest",
        description="Push the last image built for a stack (or --tag) to REGISTRY/speclock-<stack>:<tag>, "
        "print the digest the registry serves (read back with skopeo) and the docker and "
        "podman commands that run it by digest on a GPU host. Refuses an image whose "
        "self-check has not passed, or one built from uncommitted edits, unless --force.",
    )
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--registry", required=True, help="HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000")
    p.add_argument("--repository", help="repository name (default speclock-<stack>)")
    p.add_argument("--tag", help="content tag of the build to push (default: the latest build)")
    p.add_argument("--builder", default="buildah", choices=["buildah", "docker"], help="whose image store to push from")
    p.add_argument("--insecure", action="store_true", help="plain HTTP / no TLS verification (automatic for loopback)")
    p.add_argument(
        "--force",
        action="store_true",
        help="push even if the self-check has not passed or the image was built from uncommitted edits",
    )
    p.add_argument("--gpus", default="all", help=f"GPUs in the printed run commands: {GPUS_HELP} (default all)")
    p.add_argument(
        "--attestation",
        metavar="FILE",
        help="a signed smoke report of this image (attestation.intoto.json "
        "of `speclock selfcheck --sign-key`) to attach as an OCI referrer; "
        "its subject must be this image",
    )
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.set_defaults(func=_cmd_push)
