"""What a lock may point at, checked before anything is downloaded or run.

Every entry: an object of non-empty strings, a plain file name equal to its URL's basename, a wheel
whose name and version are the entry's, a URL on https PyPI or on an index a stack file names, a
sha256 of 64 hex digits. Every base recipe: only values a stack can produce (it becomes mmdebstrap's
command line, run as root). The allowed hosts come from stack files, never from the lock itself.
"""

from __future__ import annotations

import re
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any, Literal

from speclock.core.errors import BadInput
from speclock.core.files import plain_name
from speclock.core.layout import REPO_ROOT
from speclock.core.names import normalize, wheel_name_parts
from speclock.spec.lock_types import LockBase, LockEntry
from speclock.spec.stack import Stack

ENTRY_KEYS: tuple[Literal["name", "version", "filename", "url", "sha256"], ...] = ("name", "version", "filename", "url", "sha256")
# Hosts every stack may download from (PyPI's simple index and its file host).
PYPI_HOSTS = ("files.pythonhosted.org", "pypi.org")
_HEX64 = re.compile(r"[0-9a-f]{64}")
RELOCK = "re-create it with `speclock lock --stack NAME` (never edit a lock by hand)"


def _stack_index_urls(stacks_folder: Path) -> list[str]:
    """Index URLs the stack files in a folder name (torch.index and any other '*index*' key)."""
    urls: list[str] = []

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, str(k))
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, str) and "index" in key.lower() and node.startswith(("https://", "http://")):
            urls.append(node)

    try:
        files = sorted(stacks_folder.glob("*.toml")) if stacks_folder.is_dir() else []
    except OSError:
        files = []
    for f in files:
        try:
            walk(tomllib.loads(f.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # a broken stack file is its own reader's problem; it just allows no index here
    return urls


def allowed_sources(path: Path, stack: Stack | None = None) -> tuple[set[str], set[tuple[str, str]]]:
    """(https hosts, (scheme, host:port) of declared indexes) that lock URLs may point at.

    From PyPI, the stack given, the repository's stacks/*.toml and the stacks/ folder next to the
    lock's folder (an upgrade candidate's) - never from the lock itself, which could name anything."""
    urls = _stack_index_urls(REPO_ROOT / "stacks") + _stack_index_urls(Path(path).resolve().parent.parent / "stacks")
    if stack is not None:
        urls += _stack_index_urls(stack.path.parent) if stack.path.parent.name == "stacks" else []
        urls += [u for u in [str(stack.torch.get("index") or "")] if u]
    hosts = set(PYPI_HOSTS)
    declared: set[tuple[str, str]] = set()
    for url in urls:
        try:
            parsed = urllib.parse.urlparse(url)
            parsed.port  # noqa: B018  (raises ValueError on a malformed port)
        except ValueError:
            continue  # a malformed index URL allows nothing (the stack reader reports it)
        if parsed.hostname:
            declared.add((parsed.scheme, parsed.netloc.lower()))
            if parsed.scheme == "https":
                hosts.add(parsed.hostname.lower())
    return hosts, declared


def _norm_version(version: str) -> str:
    # PEP 427: a wheel's version has '-' escaped as '_'
    return version.replace("_", "-").lower()


def _url_problem(url: str, hosts: set[str], declared: set[tuple[str, str]]) -> str | None:
    try:
        parsed = urllib.parse.urlparse(url)
        netloc = parsed.netloc.lower()
        host = (parsed.hostname or "").lower()
    except ValueError as err:
        return f"is not a valid URL ({err})"
    if parsed.scheme == "file":
        # Still allowed: locks/cpu-vllm.lock takes torch from a local wheel (to be removed).
        if netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            return "is a file:// URL with a host; only file:///absolute/path is allowed"
        return None
    if parsed.scheme not in ("https", "http"):
        return f"has scheme {parsed.scheme or 'none'!r}; only https (or file://) is allowed"
    if parsed.username or parsed.password:
        return "carries credentials; a lock never holds them"
    try:
        port = parsed.port
    except ValueError:
        return "has an invalid port"
    if parsed.scheme == "https" and host in hosts and port in (None, 443):
        return None
    if (parsed.scheme, netloc) in declared:
        return None  # an index a stack file names explicitly, with this scheme and port
    if parsed.scheme == "http":
        return "is plain http; only https is allowed (or an http index a stack file names)"
    return (
        f"points at {netloc!r}, which no stack allows (allowed: https on {', '.join(sorted(hosts))}, "
        "and the hosts of indexes the stack files name)"
    )


def url_basename(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])


def entry_label(entry: LockEntry, where: str) -> str:
    """How messages name an entry: "packages[3] (torch)"."""
    return f"{where} ({entry['name'][:80]})" if entry["name"] else where


def check_entry(entry: LockEntry, where: str, path: Path, hosts: set[str], declared: set[tuple[str, str]]) -> None:
    """One package entry that fits its model (spec.lock_types.LockEntry): non-empty strings, a plain file name,
    provenance of its URL(s), sha256 format."""
    label = entry_label(entry, where)
    for field in ENTRY_KEYS:
        if not entry[field]:
            raise BadInput(f"{path}: {label}: key '{field}' is empty", hint=RELOCK)
    filename = entry["filename"]
    try:  # fetch stores <sha256>/<filename>: a '/' or '..' here would write outside the wheelhouse
        plain_name(filename, what="filename")
        bad = filename.startswith(".") or any(ord(c) < 32 for c in filename)
    except BadInput:
        bad = True
    if bad:
        raise BadInput(
            f"{path}: {label}: key 'filename' {filename[:200]!r} is not a plain file name "
            "(no '/', no '..', no leading '.', no control characters)",
            hint="a lock entry's filename is the last part of its URL; " + RELOCK,
        )
    if not _HEX64.fullmatch(entry["sha256"]):
        raise BadInput(f"{path}: {label}.sha256 {entry['sha256'][:80]!r} is not 64 lower-case hex digits", hint=RELOCK)
    urls: tuple[Literal["url", "mirror_url"], ...] = ("url", "mirror_url")
    for key in urls:
        url = entry.get(key)
        if url is None:
            continue
        if key == "mirror_url" and not url.startswith("file:///"):
            raise BadInput(
                f"{path}: {label}.mirror_url {url[:200]!r} is not a file:/// URL (a mirror is a local copy)", hint=RELOCK
            )
        problem = _url_problem(url, hosts, declared)
        if problem:
            raise BadInput(f"{path}: {label}.{key} {url[:200]!r} {problem}", hint=RELOCK)
        base = url_basename(url)
        if base != filename:
            raise BadInput(
                f"{path}: {label}.filename {filename[:200]!r} is not the file its {key} names ({base[:200]!r})",
                hint="a lock entry's filename is the last part of its URL; " + RELOCK,
            )
    if not filename.endswith(".whl"):  # pip resolves with --only-binary: every locked file is a wheel
        raise BadInput(f"{path}: {label}: key 'filename' {filename[:200]!r} is not a wheel (*.whl)", hint=RELOCK)
    parts = wheel_name_parts(filename)
    if parts is None:
        raise BadInput(
            f"{path}: {label}.filename {filename[:200]!r} is not a wheel file name "
            "(NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl)",
            hint=RELOCK,
        )
    dist, version = parts
    if normalize(dist) != normalize(entry["name"]) or _norm_version(version) != _norm_version(entry["version"]):
        raise BadInput(
            f"{path}: {label}: the wheel {filename[:200]!r} is {dist} {version}, the entry says "
            f"{entry['name'][:80]} {entry['version'][:80]}",
            hint=RELOCK,
        )


_RECIPE_VALUES: dict[Literal["tool", "format", "mode", "suite", "variant", "mirror"], str] = {
    "tool": r"mmdebstrap",
    "format": r"tar",
    "mode": r"root",
    "suite": r"[a-z][a-z0-9.-]*",
    "variant": r"minbase|essential|apt|required|important|standard",
    "mirror": r"https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~%/+-]*)?",
}


def check_base(base: LockBase, key: str, path: Path) -> None:
    """The rules of a lock's base that fits its model (spec.lock_types.LockBase): the keys its kind needs, and a
    recipe of only values a stack gives."""
    kind = base["kind"]
    if kind == "image":
        if "ref" not in base:
            raise BadInput(f"{path}: key '{key}.ref': missing (an image base names its image)", hint=RELOCK)
        return
    if kind != "debian-rootfs":
        raise BadInput(f"{path}: {key}.kind is {kind[:80]!r}, where 'debian-rootfs' or 'image' belongs", hint=RELOCK)
    sha, rec = base.get("sha256"), base.get("recipe")
    if sha is None or rec is None:
        field = "sha256" if sha is None else "recipe"
        raise BadInput(f"{path}: key '{key}.{field}': missing (a debian-rootfs base records it)", hint=RELOCK)
    if not _HEX64.fullmatch(sha):
        raise BadInput(f"{path}: {key}.sha256 is not 64 lower-case hex digits", hint=RELOCK)
    # The recipe becomes mmdebstrap's command line, run as root: only values a stack can produce.
    for field, pattern in _RECIPE_VALUES.items():
        value = rec[field]
        if not re.fullmatch(pattern, value):
            raise BadInput(f"{path}: {key}.recipe.{field} {value[:80]!r} is not a value a stack gives", hint=RELOCK)
    for i, pkg in enumerate(rec["packages"]):
        if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", pkg):
            raise BadInput(f"{path}: {key}.recipe.packages[{i}] {pkg[:80]!r} is not a Debian package name", hint=RELOCK)
    if rec["source_date_epoch"] < 0:
        raise BadInput(f"{path}: {key}.recipe.source_date_epoch is negative", hint=RELOCK)
