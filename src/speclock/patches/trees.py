"""Engine source trees a series is checked against (site-packages, a downloaded wheel, pending edits)."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import os_error, read_text
from speclock.core.names import normalize
from speclock.core.versions import version_key
from speclock.patches.diff import bad_rel_path


class SourceTree:
    """Files of an engine package: a site-packages folder or a wheel that was only downloaded."""

    label = ""

    def read(self, rel: str) -> str | None:
        raise NotImplementedError


class DirTree(SourceTree):
    def __init__(self, root: Path):
        self.root = Path(root)
        self.label = str(self.root)

    def read(self, rel: str) -> str | None:
        why = bad_rel_path(rel)
        if why:  # parse_patch refuses these already; a second guard for callers with their own paths
            raise BadInput(f"{self.root}: refusing to read {why}", hint="name files inside the engine package")
        p = self.root / rel
        return read_text(p, what="engine source file") if p.is_file() else None


class WheelTree(SourceTree):
    def __init__(self, wheel: Path):
        self.label = str(wheel)
        try:
            self.zip = zipfile.ZipFile(wheel)
            self.names = set(self.zip.namelist())
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as err:
            raise EnvironmentProblem(
                f"{wheel} is not a readable wheel (zip): {err}",
                hint=f"delete {wheel} and run the command again to download it afresh",
            ) from None
        except OSError as err:
            raise os_error(err, wheel, "read the wheel") from None

    def read(self, rel: str) -> str | None:
        if rel not in self.names:
            return None
        try:
            data = self.zip.read(rel)
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as err:
            raise EnvironmentProblem(
                f"{self.label}: member {rel} cannot be read: {err}",
                hint=f"delete {self.label} and run the command again to download it afresh",
            ) from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = data.count(b"\n", 0, err.start) + 1
            raise BadInput(f"{self.label}: {rel}:{line}: not UTF-8 text", hint="a patch can only edit text files") from None


class Overlay(SourceTree):
    """A tree with pending edits on top, so a series is checked in order without writing."""

    def __init__(self, base: SourceTree):
        self.base = base
        self.label = base.label
        self.changes: dict[str, str] = {}

    def read(self, rel: str) -> str | None:
        return self.changes[rel] if rel in self.changes else self.base.read(rel)


def installed_version(site_packages: Path, dist: str) -> str | None:
    for d in md.distributions(path=[str(site_packages)]):
        if normalize(d.metadata["Name"] or "") == normalize(dist):
            return d.version
    return None


def engine_version_in(site_packages: Path, dist: str) -> str:
    """The installed engine's version; a missing folder is bad input, a missing or unversioned engine environmental."""
    if not site_packages.is_dir():
        raise BadInput(f"--site-packages {site_packages} is not a directory", hint="give the engine's site-packages folder")
    version = installed_version(site_packages, dist)
    if version is None:
        raise EnvironmentProblem(f"{dist} is not installed in {site_packages}", hint="apply patches after installing the engine")
    try:
        version_key(version)
    except ValueError:
        raise EnvironmentProblem(
            f"{dist} in {site_packages} has version {version!r}, which is not a release version", hint="reinstall the engine"
        ) from None
    return version


def default_site_packages(python: str | None = None) -> Path:
    py = python or sys.executable
    try:
        proc = subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, timeout=120
        )
    except OSError as err:
        raise BadInput(f"--python {py} cannot be run: {err.strerror or err}", hint="give the engine's python") from None
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"--python {py} did not answer within 120 s") from None
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"{py} could not tell its site-packages: {tail}", hint="give --site-packages")
    return Path(proc.stdout.strip())
