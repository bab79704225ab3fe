"""pip's resolver (`pip install --dry-run --report`) run for one target's Python and platform tags; its report as lock entries."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.jsonread import parse_json
from speclock.core.names import normalize
from speclock.core.toolenv import tool_env
from speclock.spec.lock_types import LockEntry
from speclock.spec.provenance import url_basename
from speclock.spec.stack import Stack

# glibc of the base, by Debian suite: the newest manylinux tag the image can run.
SUITE_GLIBC = {"bullseye": 31, "bookworm": 36, "trixie": 41}


# pip's words for an index it could not reach (urllib3's connection errors, DNS, a proxy or TLS failure), the most
# telling first: the first one in pip's output is named.
_UNREACHABLE = (
    "Connection refused",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "No route to host",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "SSLError",
    "NewConnectionError",
    "Could not fetch URL",
    "connection broken by",
)


class IndexUnreachable(EnvironmentProblem):
    """pip reached no package index (offline, a proxy, DNS): exit 3, whatever pip's last line says."""


def platform_tags(stack: Stack) -> list[str]:
    """Wheel platform tags the image accepts: manylinux up to the base's glibc."""
    glibc = SUITE_GLIBC.get(stack.base["suite"], 36) if stack.base["kind"] == "debian-rootfs" else 34
    tags = [f"manylinux_2_{n}_x86_64" for n in range(glibc, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def pip_report(
    requirements: list[str],
    stack: Stack,
    *,
    no_deps: bool,
    extra_index: str | None,
    python: str | None = None,
    platforms: list[str] | None = None,
    constraints: list[str] | None = None,
) -> list[dict[str, Any]]:  # pip's report items (see report_entry)
    """Run pip's resolver for a target's interpreter and platform (default: the image's); return the report's
    install list. `constraints` (`name==version` lines) go to pip as a constraints file."""
    pyver = python or stack.python["version"]
    platforms = platforms or platform_tags(stack)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--quiet",
        "--ignore-installed",
        "--only-binary=:all:",
        "--python-version",
        pyver,
        "--implementation",
        "cp",
        "--abi",
        f"cp{pyver.replace('.', '')}",
        "--abi",
        "abi3",
        "--abi",
        "none",
        "--disable-pip-version-check",
        "--retries",
        "2",
    ]
    for tag in platforms:
        cmd += ["--platform", tag]
    if no_deps:
        cmd.append("--no-deps")
    if extra_index:
        cmd += ["--extra-index-url", extra_index]
    with tempfile.TemporaryDirectory(prefix="speclock-lock-") as tmp:
        report = Path(tmp) / "report.json"
        if constraints:
            (Path(tmp) / "constraints.txt").write_text("".join(f"{c}\n" for c in constraints))
            cmd += ["-c", str(Path(tmp) / "constraints.txt")]
        cmd += ["--report", str(report), *requirements]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=tool_env())  # HOME: speclock's, not the user's
        if proc.returncode != 0:
            err = "\n".join(line for line in proc.stderr.splitlines() if "is ignored" not in line and "Retrying" not in line)
            missing = re.search(r"No matching distribution found for (\S+)", err)
            unreachable = next((sign for sign in _UNREACHABLE if sign in proc.stderr), None)
            if missing and unreachable:  # pip found nothing because it reached no index: not the stack's fault
                raise IndexUnreachable(
                    f"pip could not reach the package index while resolving stack {stack.name} ({unreachable}), "
                    f"so it cannot tell whether {missing[1]} exists",
                    hint="check network access to the package index (and PIP_CERT behind a proxy), or point pip at a "
                    "mirror (PIP_INDEX_URL); then run the command again",
                )
            if missing:
                raise BadInput(
                    f"stack {stack.path}: the resolver found no wheel for {missing[1]} (Python {pyver}, {platforms[0]}).",
                    hint="check the version in the stack (engine.version, torch.version, python.extra): "
                    f"`pip index versions {missing[1].split('=')[0].split('<')[0].split('>')[0]}` lists what exists",
                )
            raise EnvironmentProblem(
                f"pip could not resolve the stack {stack.name}:\n{err.strip()[-2000:]}",
                hint="check network access to the package index (and PIP_CERT behind a proxy)",
            )
        doc = parse_json(report.read_text(), report, what="pip installation report", error=EnvironmentProblem, allow_nan=True)
        install: list[dict[str, Any]] = doc["install"]  # pip's report format: a list of objects, one per wheel
        return install


# An item of pip's installation report (pip's JSON format: `metadata` holds every core metadata field): dict[str, Any],
# of which report_entry reads the few keys a lock entry needs.
def report_entry(item: dict[str, Any]) -> LockEntry:
    """The lock entry of one item of pip's installation report."""
    info = item["download_info"]
    url = info["url"]
    hashes = info.get("archive_info", {}).get("hashes", {})
    sha = hashes.get("sha256") or info.get("archive_info", {}).get("hash", "sha256=").split("=", 1)[1]
    if not sha:
        raise EnvironmentProblem(f"the index gave no sha256 for {url}", hint="use an index that publishes hashes (PyPI does)")
    return {
        "name": normalize(item["metadata"]["name"]),
        "version": item["metadata"]["version"],
        "filename": url_basename(url),  # URL-decoded, as read_lock checks it
        "url": url,
        "sha256": sha,
    }
