"""The SBOM components of what the lock installs (Debian base, venv wheels, build-time wheels), kept apart from the document."""

from __future__ import annotations

import functools
import urllib.parse
from pathlib import Path
from typing import Any

from speclock.build.sbom.format import Cdx, file_component, sha256_hashes, speclock_property
from speclock.build.sbom.rootfs import base_packages
from speclock.core.errors import BadInput
from speclock.core.files import file_sha256
from speclock.core.heartbeat import Progress
from speclock.core.names import normalize
from speclock.spec.lock import LockDoc, LockEntry
from speclock.spec.lock_types import LockBase
from speclock.spec.stack import Stack


def _pypi_purl(cdx: Cdx, pkg: LockEntry) -> Any:  # a packageurl PackageURL
    """pkg:pypi/<name>@<version>?file_name=<wheel>, plus repository_url for a wheel from another index than PyPI.

    The download URL stays in the lock, not in an externalReference: the strict validator's IRI check of
    ~200 URLs costs ~15 s, and the purl with the wheel's name and sha256 already identifies the file."""
    qualifiers = {"file_name": pkg["filename"]}
    url = urllib.parse.urlsplit(pkg["url"])
    if url.scheme == "https" and url.hostname not in ("files.pythonhosted.org", "pypi.org"):
        qualifiers["repository_url"] = f"{url.scheme}://{url.netloc}{url.path.rsplit('/', 1)[0]}"
    return cdx.PackageURL(type="pypi", name=normalize(pkg["name"]), version=pkg["version"], qualifiers=qualifiers)


def base_components(cdx: Cdx, base: LockBase, *, progress: Progress) -> tuple[Any, list[Any]]:
    """(the base, its Debian packages) of the lock's `base`: a Debian rootfs with every installed package, or a
    base image by reference (its packages not listed)."""
    sha = functools.partial(sha256_hashes, cdx)
    prop = functools.partial(speclock_property, cdx)
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
    return base_c, debs


def venv_components(cdx: Cdx, stack: Stack, lock: LockDoc, patches: dict[str, Path]) -> tuple[list[Any], list[Any]]:
    """(the Python packages of the venv, the engine's patch files): the engine's package carries the patches as
    pedigree; BadInput when there are patches and the lock has no engine package."""
    sha = functools.partial(sha256_hashes, cdx)
    engine_pkg = normalize(stack.engine["package"])
    patch_cs, pedigree = [], []
    for rel, path in patches.items():
        patch_cs.append(file_component(cdx, f"patches/{rel}", f"patch:{rel}", file_sha256(path), f"/opt/speclock/patches/{rel}"))
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
    return venv, patch_cs


def build_asset_components(cdx: Cdx, lock: LockDoc) -> list[Any]:
    """The build-time wheels (the lock's assets: the target's GGUF, the prompts, the converters): read at build
    time, not in the image, so listed with scope `excluded`."""
    return [
        cdx.Component(
            type=cdx.ComponentType.LIBRARY,
            name=pkg["name"],
            version=pkg["version"],
            purl=_pypi_purl(cdx, pkg),
            bom_ref=f"build-asset:{normalize(pkg['name'])}",
            hashes=sha256_hashes(cdx, pkg["sha256"]),
            scope=cdx.ComponentScope.EXCLUDED,
            properties=[speclock_property(cdx, "role", "build-asset")],
        )
        for pkg in lock["assets"]
    ]
