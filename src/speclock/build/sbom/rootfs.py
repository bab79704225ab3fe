"""The Debian packages of a locked debian-rootfs base, read from its tarball's dpkg status (and os-release), for the
image's SBOM (build/sbom/document.py). dpkg records no .deb hash, so a package is named by name, version and arch."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import atomic_write_json, read_json
from speclock.core.heartbeat import Progress
from speclock.core.layout import cache_dir
from speclock.spec import baseimage
from speclock.spec.lock_types import LockBase


def parse_dpkg_status(text: str) -> list[dict[str, str]]:
    """The installed packages of a dpkg status file: name, version, arch, source (sorted, deduplicated)."""
    out = {}
    for para in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in para.splitlines():
            if line[:1] in (" ", "\t") and key:
                continue  # a continuation line (descriptions, conffiles): not needed
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if not fields.get("Package") or fields.get("Status", "").split()[-1:] != ["installed"]:
            continue
        source = fields.get("Source", "").split(" ")[0] or fields["Package"]
        pkg = {
            "name": fields["Package"],
            "version": fields.get("Version", ""),
            "arch": fields.get("Architecture", ""),
            "source": source,
        }
        out[(pkg["name"], pkg["arch"])] = pkg
    return [out[k] for k in sorted(out)]


def parse_os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def read_rootfs_packages(tar_path: Path) -> dict[str, Any]:
    """{"os": os-release fields (+ debian_version), "packages": [...]} from a rootfs tarball."""
    wanted = {
        "var/lib/dpkg/status": "status",
        "etc/os-release": "os",
        "usr/lib/os-release": "os",
        "etc/debian_version": "debian_version",
    }
    found: dict[str, str] = {}
    try:
        with tarfile.open(tar_path) as tar:
            for member in tar:
                name = member.name.lstrip("./")
                fh = tar.extractfile(member) if name in wanted and member.isfile() and wanted[name] not in found else None
                if fh is not None:
                    found[wanted[name]] = fh.read().decode("utf-8", "replace")
    except (OSError, tarfile.TarError) as err:
        raise CheckFailed(
            f"cannot read the base rootfs {tar_path}: {err}",
            hint="remove it from the cache; the next build or `speclock sbom` rebuilds it",
        ) from None
    if "status" not in found:
        raise CheckFailed(
            f"the base rootfs {tar_path} has no var/lib/dpkg/status: its Debian packages cannot be listed",
            hint="use a debian-rootfs base (mmdebstrap), or base.kind = 'image' in the stack",
        )
    osr = parse_os_release(found.get("os", ""))
    if "debian_version" in found:
        osr["DEBIAN_VERSION"] = found["debian_version"].strip()
    return {"os": osr, "packages": parse_dpkg_status(found["status"])}


def base_packages(base: LockBase, *, progress: Progress = print) -> dict[str, Any] | None:
    """The Debian packages of a locked debian-rootfs base (None for a base image by ref: not enumerated).

    Read once from the tarball (verified against the lock's sha256) and kept beside the cache, keyed by
    that sha256, so later SBOMs need no tarball."""
    if base.get("kind") != "debian-rootfs":
        return None
    keep = cache_dir() / "sbom" / f"base-{base['sha256']}.json"
    if keep.is_file():
        try:
            got: dict[str, Any] = read_json(keep, what="cached base package list")  # checked on the next line
            if got.get("sha256") == base["sha256"] and isinstance(got.get("packages"), list):
                return got
        except BadInput:
            pass  # damaged: read the tarball again
    progress(f"  listing the Debian packages of the base rootfs {base['sha256'][:16]}")
    got = {"sha256": base["sha256"], **read_rootfs_packages(baseimage.verified_rootfs(base, progress=progress))}
    atomic_write_json(keep, got, indent=1, sort_keys=True)
    return got
