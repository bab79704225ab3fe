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
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import hashlib
import importlib.metadata as md
import io
import json
import sys
import tarfile
import time
import urllib.parse
import uuid
import zipfile
from pathlib import Path
from typing import Any

from speclock import __version__
from speclock.build import referrers, wheelhouse
from speclock.build.context import patch_files, sync_text, tree_files
from speclock.build.referrers import EMPTY_JSON, OCI_EMPTY  # noqa: F401 - their old home; importers keep working
from speclock.build.registry import OCI_INDEX, OCI_MANIFEST, RegistryClient  # noqa: F401 - idem (tests use OCI_*)
from speclock.build.rootfs_packages import base_packages, parse_dpkg_status, parse_os_release, read_rootfs_packages  # noqa: F401 - idem
from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.files import atomic_write_text, confined, file_sha256
from speclock.core.layout import REPO_ROOT, cache_dir
from speclock.core.names import normalize
from speclock.spec.lock import LockDoc, LockEntry, lock_path, read_lock
from speclock.spec.stack import DEFAULT_STACK, Stack, load_stack

# The staged context's config/ is copied to /opt/speclock (containers/Containerfile: COPY config /opt/speclock).
SBOM_IN_CONTEXT = "config/sbom.cdx.json"
SBOM_IN_IMAGE = "/opt/speclock/sbom.cdx.json"
SBOM_LABEL = ("io.speclock.sbom", SBOM_IN_IMAGE)
SBOM_MEDIA_TYPE = "application/vnd.cyclonedx+json"
SCHEMA_VERSION = "1.7"  # the newest the pinned cyclonedx-python-lib writes and validates

INSTALL = "pip install -r scripts/requirements-host.txt (cyclonedx-python-lib[json-validation]), or run scripts/bootstrap.sh"


def _cyclonedx():
    """The library's modules, imported on use (speclock --help stays fast; the image never makes SBOMs)."""
    try:
        # optional and slow to import (4.6 s): only SBOM makers need it, never `speclock --help` or the image
        from cyclonedx.contrib.this.builders import this_component
        from cyclonedx.model import HashAlgorithm, HashType, Property, XsUri
        from cyclonedx.model.bom import Bom, BomMetaData
        from cyclonedx.model.component import Component, ComponentScope, ComponentType, Diff, Patch, PatchClassification, Pedigree
        from cyclonedx.output import make_outputter
        from cyclonedx.schema import OutputFormat, SchemaVersion
        from packageurl import PackageURL
    except ImportError as err:
        raise EnvironmentProblem(
            f"the SBOM needs cyclonedx-python-lib, which does not import here ({err})", hint=INSTALL
        ) from None
    return argparse.Namespace(
        this_component=this_component,
        HashAlgorithm=HashAlgorithm,
        HashType=HashType,
        Property=Property,
        XsUri=XsUri,
        Bom=Bom,
        BomMetaData=BomMetaData,
        Component=Component,
        ComponentScope=ComponentScope,
        ComponentType=ComponentType,
        Diff=Diff,
        Patch=Patch,
        PatchClassification=PatchClassification,
        Pedigree=Pedigree,
        make_outputter=make_outputter,
        OutputFormat=OutputFormat,
        SchemaVersion=SchemaVersion,
        PackageURL=PackageURL,
    )


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


def _pypi_purl(cdx, pkg: LockEntry):
    """pkg:pypi/<name>@<version>?file_name=<wheel>, plus repository_url for a wheel from another index than PyPI.

    The download URL stays in the lock, not in an externalReference: the strict validator's IRI check of
    ~200 URLs costs ~15 s, and the purl with the wheel's name and sha256 already identifies the file."""
    qualifiers = {"file_name": pkg["filename"]}
    url = urllib.parse.urlsplit(pkg["url"])
    if url.scheme == "https" and url.hostname not in ("files.pythonhosted.org", "pypi.org"):
        qualifiers["repository_url"] = f"{url.scheme}://{url.netloc}{url.path.rsplit('/', 1)[0]}"
    return cdx.PackageURL(type="pypi", name=normalize(pkg["name"]), version=pkg["version"], qualifiers=qualifiers)


def sbom_text(stack: Stack, lock: LockDoc, *, patches: dict[str, Path], draft: dict[str, Path], progress=print) -> str:
    """The SBOM (CycloneDX JSON) of the image built from `lock`; `patches` = {"<engine>/<file>": path} in series
    order, `draft` = {"<file>": path}. Validated against the CycloneDX schema before it is returned."""
    cdx = _cyclonedx()
    sha = lambda hexdigest: [cdx.HashType(alg=cdx.HashAlgorithm.SHA_256, content=hexdigest)]  # noqa: E731
    prop = lambda k, v: cdx.Property(name=f"speclock:{k}", value=str(v))  # noqa: E731
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

    # The base rootfs and its Debian packages.
    base = lock["base"]
    listed = base_packages(base, progress=progress)
    if listed is None:
        base_c = cdx.Component(
            type=cdx.ComponentType.CONTAINER,
            name=base.get("ref", "base"),
            bom_ref="base",
            properties=[
                prop("base-kind", base.get("kind", "image")),
                prop("note", "a base image by reference: its packages are not listed"),
            ],
        )
        debs: list[Any] = []
    else:
        osr = listed["os"]
        distro = f"{osr.get('ID', 'debian')}-{osr.get('VERSION_ID', '')}".rstrip("-")
        base_c = cdx.Component(
            type=cdx.ComponentType.OPERATING_SYSTEM,
            name=osr.get("ID", "debian"),
            version=osr.get("DEBIAN_VERSION") or osr.get("VERSION_ID") or None,
            bom_ref="base",
            hashes=sha(base["sha256"]),
            properties=[prop("base-kind", "debian-rootfs"), prop("base-recipe", base.get("command", "")), prop("distro", distro)],
        )
        debs = []
        for p in listed["packages"]:
            purl = cdx.PackageURL(
                type="deb",
                namespace=osr.get("ID", "debian"),
                name=p["name"],
                version=p["version"],
                qualifiers={
                    "arch": p["arch"],
                    "distro": distro,
                    **({"upstream": p["source"]} if p["source"] != p["name"] else {}),
                },
            )
            debs.append(
                cdx.Component(
                    type=cdx.ComponentType.LIBRARY,
                    name=p["name"],
                    version=p["version"],
                    purl=purl,
                    bom_ref=f"deb:{p['name']}:{p['arch']}",
                )
            )
    components += [base_c, *debs]
    top.append(base_c)

    # The engine's patches (files) and the Python packages of the venv (the engine carries the patches as pedigree).
    engine_pkg = normalize(stack.engine["package"])
    patch_cs, pedigree = [], []
    for rel, path in patches.items():
        patch_cs.append(
            cdx.Component(
                type=cdx.ComponentType.FILE,
                name=f"patches/{rel}",
                bom_ref=f"patch:{rel}",
                hashes=sha(file_sha256(path)),
                properties=[prop("path", f"/opt/speclock/patches/{rel}")],
            )
        )
        pedigree.append(
            cdx.Patch(
                type=cdx.PatchClassification.UNOFFICIAL, diff=cdx.Diff(url=cdx.XsUri(f"file:///opt/speclock/patches/{rel}"))
            )
        )
    venv = []
    for pkg in lock["packages"]:
        venv.append(
            cdx.Component(
                type=cdx.ComponentType.LIBRARY,
                name=pkg["name"],
                version=pkg["version"],
                purl=_pypi_purl(cdx, pkg),
                bom_ref=f"pypi:{normalize(pkg['name'])}",
                hashes=sha(pkg["sha256"]),
                pedigree=cdx.Pedigree(patches=pedigree) if pedigree and normalize(pkg["name"]) == engine_pkg else None,
            )
        )
    if pedigree and not any(normalize(p["name"]) == engine_pkg for p in lock["packages"]):
        raise BadInput(
            f"the lock of stack {stack.name} has no package {stack.engine['package']} (engine.package)",
            hint=f"run `speclock lock --stack {stack.name}`",
        )
    components += venv + patch_cs
    top += venv + patch_cs

    # Build-time wheels: read at build time (the target's GGUF, the prompts, the converters), not in the image.
    for pkg in lock["assets"]:
        components.append(
            cdx.Component(
                type=cdx.ComponentType.LIBRARY,
                name=pkg["name"],
                version=pkg["version"],
                purl=_pypi_purl(cdx, pkg),
                bom_ref=f"build-asset:{normalize(pkg['name'])}",
                hashes=sha(pkg["sha256"]),
                scope=cdx.ComponentScope.EXCLUDED,
                properties=[prop("role", "build-asset")],
            )
        )

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
        cdx.Component(
            type=cdx.ComponentType.FILE,
            name=f"draft/{rel}",
            bom_ref=f"draft:{rel}",
            hashes=sha(file_sha256(path)),
            properties=[prop("path", f"/opt/speclock/draft/{rel}")],
        )
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
        return cdx.make_outputter(bom, cdx.OutputFormat.JSON, _schema(cdx)).output_as_string(indent=1) + "\n"

    # The serial number: a name-based UUID of the document itself, so the same inputs give the same bytes. The
    # document is made once with a placeholder serial, which occurs exactly once, then the serial is put in its
    # place (what a second make() with that serial would write, at half the cost).
    placeholder = uuid.UUID(int=0)
    draft_text = make(placeholder)
    serial = uuid.uuid5(uuid.NAMESPACE_URL, "urn:speclock:sbom:" + hashlib.sha256(draft_text.encode()).hexdigest())
    if draft_text.count(placeholder.urn) != 1:
        raise CheckFailed(
            f"the SBOM holds its placeholder serial {draft_text.count(placeholder.urn)} times, not once",
            hint="this is a bug in speclock.build.sbom; report it with the stack name",
        )
    text = draft_text.replace(placeholder.urn, serial.urn)
    validate_sbom(text)
    return text


def _schema(cdx):
    return cdx.SchemaVersion.from_version(SCHEMA_VERSION)


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
    cdx = _cyclonedx()
    try:
        # optional and slow (jsonschema's format checkers build ~40 grammars at import: ~3 s): only on validation
        from cyclonedx.validation.json import JsonStrictValidator
    except ImportError as err:
        raise EnvironmentProblem(
            f"validating the SBOM needs cyclonedx-python-lib[json-validation] ({err})", hint=INSTALL
        ) from None
    error = JsonStrictValidator(_schema(cdx)).validate_str(text)
    if error is not None:
        raise CheckFailed(
            f"{where} does not validate against CycloneDX {SCHEMA_VERSION}: {str(error)[:500]}",
            hint="this is a bug in speclock.build.sbom; report it with the stack name",
        )
    try:
        atomic_write_text(marker, "")
    except (OSError, BadInput):
        pass  # best effort: a read-only cache only means validating again next time


def stage_sbom(stack: Stack, lock: LockDoc, ctx: Path, *, progress=print) -> Path:
    """Write the SBOM into the staged context (config/ -> /opt/speclock/sbom.cdx.json in the image)."""
    engine = stack.engine["name"]
    patches = {f"{engine}/{name}": ctx / "patches" / engine / name for name in stack.patch_series}
    text = sbom_text(stack, lock, patches=patches, draft=tree_files(ctx / "draft"), progress=progress)
    dest = ctx / SBOM_IN_CONTEXT
    sync_text(dest, text)
    return dest


def summary(text: str) -> dict[str, Any]:
    doc = json.loads(text)
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


# ---- the OCI referrer (the mechanics: build/referrers.py) -------------------------------------------------


def sbom_from_image(reg: RegistryClient, digest: str) -> bytes:
    """The SBOM file as the pushed image holds it: read from its layers, topmost first (a few small layers)."""
    got = reg.manifest(digest)
    if got is None:
        raise BadInput(f"registry {reg.host} has no manifest {digest} in {reg.name}", hint="push the image first")
    media_type, body = got
    manifest = json.loads(body)
    if "layers" not in manifest:
        raise BadInput(
            f"{reg.name}@{digest} is an index ({media_type}), not an image manifest",
            hint="pass the digest of the image manifest that push-image printed",
        )
    want = SBOM_IN_IMAGE.lstrip("/")
    for layer in reversed(manifest["layers"]):
        data = reg.blob(layer["digest"])
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for member in tar:
                    name = member.name.lstrip("./")
                    fh = tar.extractfile(member) if name == want and member.isfile() else None
                    if fh is not None:
                        return fh.read()
                    if name == f"{Path(want).parent}/.wh.{Path(want).name}" or name == f"{Path(want).parent}/.wh..wh..opq":
                        break
        except tarfile.TarError as err:
            raise CheckFailed(
                f"layer {layer['digest'][:19]} of {reg.name}@{digest} is not a tar this reader takes ({err})",
                hint="push with gzip or no compression (zstd layers are not read here), or pass sbom=",
            ) from None
    raise CheckFailed(
        f"{reg.name}@{digest} holds no {SBOM_IN_IMAGE}",
        hint="rebuild the image with this speclock (build-image stages the SBOM), then push it again",
    )


def push_sbom_referrer(
    registry: str, repository: str, digest: str, *, insecure: bool, sbom: bytes | None = None
) -> dict[str, Any]:
    """Push the image's SBOM beside it as an OCI referrer: an artifact manifest (artifactType
    application/vnd.cyclonedx+json) whose `subject` is the image manifest `digest`, in REGISTRY/repository.

    `sbom`: the document; default the image's own /opt/speclock/sbom.cdx.json, read from the pushed layers.
    A registry without the referrers API (no OCI-Subject answer) gets the tag-schema fallback: the index
    tagged sha256-<hex> lists the referrer. Returns {"digest", "sbom_digest", "size", "subject", "referrers"}."""
    reg = RegistryClient(registry, repository, insecure=insecure)
    subject = referrers.subject_manifest(reg, digest, then="its SBOM")
    data = sbom if sbom is not None else sbom_from_image(reg, digest)
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("bomFormat") != "CycloneDX":
        raise BadInput(
            "the SBOM to push is not a CycloneDX JSON document",
            hint=f"pass the file {SBOM_IN_IMAGE} of the image (or nothing: it is read from the image)",
        )
    created = (doc.get("metadata") or {}).get("timestamp")
    pushed = referrers.push_referrer(
        reg,
        digest,
        data,
        artifact_type=SBOM_MEDIA_TYPE,
        title=Path(SBOM_IN_IMAGE).name,
        subject=subject,
        annotations={"org.opencontainers.image.created": created} if created else None,
    )
    pushed["sbom_digest"] = pushed.pop("blob_digest")
    return pushed


def sbom_referrers(registry: str, repository: str, digest: str, *, insecure: bool) -> list[dict[str, Any]]:
    """The CycloneDX referrers of an image manifest: the referrers API, or the tag-schema index where it is missing."""
    return referrers.list_referrers(RegistryClient(registry, repository, insecure=insecure), digest, SBOM_MEDIA_TYPE)


def pull_sbom_referrer(registry: str, repository: str, digest: str, *, insecure: bool) -> bytes:
    """The SBOM pushed beside the image `digest` (its newest CycloneDX referrer), checked against its digests."""
    return referrers.pull_referrer(
        RegistryClient(registry, repository, insecure=insecure),
        digest,
        SBOM_MEDIA_TYPE,
        what="CycloneDX",
        push_hint="push it with push_sbom_referrer (push-image does after the image)",
    )


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
    err = lambda m: print(m, file=sys.stderr)  # noqa: E731
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


def add_commands(sub) -> None:
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
