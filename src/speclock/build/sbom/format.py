"""What an SBOM is and where it lives (CycloneDX on use, schema, paths, media type), shared by its maker, components and referrer."""

from __future__ import annotations

import argparse
from typing import Any

from speclock.core.errors import EnvironmentProblem

# The staged context's config/ is copied to /opt/speclock (containers/Containerfile: COPY config /opt/speclock).
SBOM_IN_CONTEXT = "config/sbom.cdx.json"
SBOM_IN_IMAGE = "/opt/speclock/sbom.cdx.json"
SBOM_LABEL = ("io.speclock.sbom", SBOM_IN_IMAGE)
SBOM_MEDIA_TYPE = "application/vnd.cyclonedx+json"
SCHEMA_VERSION = "1.7"  # the newest the pinned cyclonedx-python-lib writes and validates

INSTALL = "pip install -r scripts/requirements-host.txt (cyclonedx-python-lib[json-validation]), or run scripts/bootstrap.sh"


# cyclonedx-python-lib's classes, imported on use (see cyclonedx()); each attribute is one of the library's names
Cdx = argparse.Namespace


def cyclonedx() -> Cdx:
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


def schema(cdx: Cdx) -> Any:  # a cyclonedx SchemaVersion (the library is imported on use)
    return cdx.SchemaVersion.from_version(SCHEMA_VERSION)


def sha256_hashes(cdx: Cdx, hexdigest: str) -> list[Any]:
    """A component's `hashes`: its sha256."""
    return [cdx.HashType(alg=cdx.HashAlgorithm.SHA_256, content=hexdigest)]


def speclock_property(cdx: Cdx, key: str, value: Any) -> Any:
    """A `speclock:<key>` property."""
    return cdx.Property(name=f"speclock:{key}", value=str(value))


def file_component(cdx: Cdx, name: str, bom_ref: str, hexdigest: str, image_path: str) -> Any:
    """A file speclock puts into the image (a patch, a drafter file): its name, sha256 and path there."""
    return cdx.Component(
        type=cdx.ComponentType.FILE,
        name=name,
        bom_ref=bom_ref,
        hashes=sha256_hashes(cdx, hexdigest),
        properties=[speclock_property(cdx, "path", image_path)],
    )
