"""`locks/pylock.<stack>.toml`: every lock also as a PEP 751 lock file (pylock.toml, lock-version 1.0), for pip,
uv and other tools that read the standard format. Written with the lock (`write_lock_files`), checked against it
by `lock --check` (`pylock_drift`).

What it holds, and why so:
- File name: PEP 751 allows `pylock.toml` or `pylock.<name>.toml` where <name> has no '.', so a stack name's dots
  become '_' (`pylock.vllm-0_26_0-torch2_11-cu130.toml`); `pylock.cpu-vllm.toml` keeps its name.
- One multi-use file for all of a lock's targets (the image's and python.host_targets). Each target is one entry of
  `environments`, a marker of its Python and machine (`python_version == '3.11' and platform_machine == 'x86_64'
  and sys_platform == 'linux' and implementation_name == 'cpython'`). A package version locked by every target has
  no marker; one locked by only some targets (networkx 3.6.1 for 3.11, 3.7 for 3.12) is one [[packages]] entry per
  version whose `marker` names its targets. An entry lists the wheels its targets locked (cp311 and cp312 builds of
  one version); an installer takes the one whose tags fit its machine, as PEP 751 says. Two targets with the same
  Python and machine have the same marker: if they lock different package sets the file could not tell them
  apart, and `pylock_doc` refuses (exit 2) rather than write an ambiguous lock.
- Wheels: `name` (the file name), `url` and `hashes.sha256` exactly as in the lock. No `size` (the lock has none).
  A lock's mirror_url (a file of one machine) is not written: the pylock is for any machine.
- Only what is installed is a package: a target's `excluded` and `pruned` (resolved, never installed) and `assets` (data wheels
  unpacked at build time) go under [tool.speclock.targets.<key>], with the base rootfs digest(s), the stack and
  lock hashes and each target's Python, machine and platform tags: speclock's data, in the table PEP 751 gives
  tools.
- Installing offline: pip (26.3) and uv (0.13.9) both download a pylock wheel from its `url` and never take it from
  --find-links (checked); with a `path` they use the local file. `offline_pylock` adds each wheel's path in a
  wheelhouse, so `pip install --no-index -r` / `uv pip install --offline --no-index -r` install the lock without a
  network.

TOML is written by spec.toml_text (the layout tomli_w gives, byte for byte: tests/test_pylock.py) and read by tomllib.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, TypedDict

from speclock.core.errors import BadInput
from speclock.core.files import atomic_write_text, clean_stale_temps, fsync_dir, os_error, read_text
from speclock.core.names import normalize
from speclock.spec.lock import LockDoc, LockEntry, TargetView, lock_targets, write_lock
from speclock.spec.toml_text import dumps_tables

PYLOCK_VERSION = "1.0"
CREATED_BY = "speclock"
PYLOCK_SCHEMA = "speclock.pylock/v1"


def pylock_path(lock_file: str | os.PathLike[str]) -> Path:
    """locks/<stack>.lock -> locks/pylock.<stack>.toml (dots of the name as '_': PEP 751 names have none)."""
    lock_file = Path(lock_file)
    return lock_file.with_name(f"pylock.{lock_file.stem.replace('.', '_')}.toml")


def environment_marker(python: str, machine: str) -> str:
    """The PEP 508 marker of one target: its Python version and machine, CPython on Linux (what pip resolved for).
    A lock from before `python` was recorded names no version: its marker then has none."""
    version = f"python_version == '{python}' and " if python else ""
    return f"{version}platform_machine == '{machine}' and sys_platform == 'linux' and implementation_name == 'cpython'"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _version_key(python: str) -> tuple[int, ...]:
    return tuple(int(x) for x in python.split(".") if x.isdigit())


# pylock documents are dict[str, Any]: PEP 751's TOML tables, one shape for the document written (pylock_doc) and the one
# read back (read_pylock: any valid TOML), which pylock_drift compares key by key; toml_text.dumps_tables writes them.


class _Group(TypedDict):
    """One (name, version) of pylock_doc: the targets that lock it and its wheels by file name."""

    targets: list[str]
    wheels: dict[str, LockEntry]


def _wheel(entry: LockEntry) -> dict[str, Any]:
    return {"name": entry["filename"], "url": entry["url"], "hashes": {"sha256": entry["sha256"]}}


def _plain(entry: LockEntry) -> dict[str, str]:
    """An excluded or asset entry under [tool.speclock]: as in the lock, less the machine-local mirror_url."""
    return {
        "name": entry["name"],
        "version": entry["version"],
        "filename": entry["filename"],
        "url": entry["url"],
        "sha256": entry["sha256"],
    }


def pylock_doc(doc: LockDoc) -> dict[str, Any]:
    """The pylock.toml content of a (read) lock, as a dict in the key order PEP 751 lists them."""
    targets: dict[str, TargetView] = {
        key: {
            **t,
            "python": _text(t["python"]),
            "machine": _text(t["machine"]),
            "platforms": [p for p in t["platforms"] if isinstance(p, str)] if isinstance(t["platforms"], list) else [],
        }
        for key, t in lock_targets(doc).items()
    }
    markers = {key: environment_marker(t["python"], t["machine"]) for key, t in targets.items()}
    # (name, version) -> the targets that lock it, and its wheels by file name
    groups: dict[tuple[str, str], _Group] = {}
    for key, target in targets.items():
        for entry in target["packages"]:
            group = groups.setdefault((normalize(entry["name"]), entry["version"]), {"targets": [], "wheels": {}})
            group["targets"].append(key)
            have = group["wheels"].setdefault(entry["filename"], entry)
            if (have["sha256"], have["url"]) != (entry["sha256"], entry["url"]):
                raise BadInput(
                    f"the lock of stack {doc['stack']} names {entry['filename']} twice with another url or "
                    f"sha256 (targets {', '.join(group['targets'])})",
                    hint=f"re-create it with `speclock lock --stack {doc['stack']}`",
                )
    _refuse_ambiguous(doc, targets, markers)
    all_keys = set(targets)
    packages = []
    for (name, version), group in sorted(
        groups.items(), key=lambda kv: (kv[0][0], min(list(targets).index(k) for k in kv[1]["targets"]))
    ):
        package: dict[str, Any] = {"name": name, "version": version}
        if set(group["targets"]) != all_keys:
            own = list(dict.fromkeys(markers[k] for k in group["targets"]))
            package["marker"] = own[0] if len(own) == 1 else " or ".join(f"({m})" for m in own)
        package["wheels"] = [_wheel(group["wheels"][f]) for f in sorted(group["wheels"])]
        packages.append(package)
    pythons = sorted({t["python"] for t in targets.values() if len(_version_key(t["python"])) >= 2}, key=_version_key)
    tool: dict[str, Any] = {
        "schema": PYLOCK_SCHEMA,
        "stack": doc["stack"],
        "stack-sha256": doc["stack_sha256"],
        "lock-sha256": doc["lock_sha256"],
        "base": doc["base"],
    }
    if "kernel_base" in doc:
        tool["kernel-base"] = doc["kernel_base"]
    if "source_date_epoch" in doc:
        tool["source-date-epoch"] = doc["source_date_epoch"]
    tool["targets"] = {
        key: {
            "python": t["python"],
            "machine": t["machine"],
            "marker": markers[key],
            "platforms": list(t["platforms"]),
            "excluded": [_plain(e) for e in t.get("excluded", [])],
            "assets": [_plain(e) for e in t.get("assets", [])],
            # [prune].packages: resolved, never installed (only locks of stacks that prune)
            **({"pruned": [_plain(e) for e in t["pruned"]]} if t.get("pruned") else {}),
        }
        for key, t in targets.items()
    }
    if "prune" in doc:
        tool["prune"] = doc["prune"]
    out: dict[str, Any] = {"lock-version": PYLOCK_VERSION, "environments": list(dict.fromkeys(markers.values()))}
    if pythons:
        top = _version_key(pythons[-1])
        out["requires-python"] = f">={pythons[0]},<{top[0]}.{top[1] + 1}"
    return {**out, "created-by": CREATED_BY, "packages": packages, "tool": {"speclock": tool}}


def _refuse_ambiguous(doc: LockDoc, targets: dict[str, TargetView], markers: dict[str, str]) -> None:
    """BadInput when two targets with one marker lock different package sets (no installer could tell which is meant)."""
    first: dict[str, str] = {}
    for key, target in targets.items():
        marker = markers[key]
        if marker not in first:
            first[marker] = key
            continue
        other = first[marker]
        mine = {normalize(p["name"]): p["version"] for p in target["packages"]}
        theirs = {normalize(p["name"]): p["version"] for p in targets[other]["packages"]}
        for name in sorted(mine.keys() | theirs.keys()):
            if mine.get(name) != theirs.get(name):
                raise BadInput(
                    f"the lock of stack {doc['stack']}: targets {other} and {key} have the same Python and machine "
                    f"({marker}) but lock {name} {theirs.get(name, '(none)')} and {mine.get(name, '(none)')}; "
                    "pylock.toml cannot tell them apart",
                    hint="give the host target another Python or machine than the image's, or drop it from "
                    "python.host_targets (the image's target already covers that environment)",
                )


def render(doc: dict[str, Any]) -> str:
    """The TOML text of a pylock document (spec.toml_text: the standard library has no TOML writer, and a GPU host's
    Python may have none either)."""
    header = (
        "# PEP 751 lock file made by speclock from the lock next to it (same wheels, URLs and sha256); do not edit:\n"
        "# run `speclock lock` to re-create both. speclock's own data is under [tool.speclock].\n"
    )
    return header + dumps_tables(doc)


def write_lock_files(lock_file: str | os.PathLike[str], doc: LockDoc) -> Path:
    """Write the lock and its pylock: both or neither. Returns the pylock's path.

    Both texts are made first (an error there writes nothing), then each goes to a fsynced temp file beside its
    target; the renames come last, the pylock's first. When the lock's rename fails the old pylock is put back.
    A crash between the two renames leaves a new pylock beside the old lock, which `lock --check` reports as drift."""
    lock_file = Path(lock_file)
    target = pylock_path(lock_file)
    text = render(pylock_doc(doc))
    clean_stale_temps(target.parent, older_than_s=600)
    try:
        old = target.read_bytes() if target.is_file() else None
    except OSError as err:
        raise os_error(err, target, "read") from None
    atomic_write_text(target, text)
    try:
        write_lock(lock_file, doc)
    except BaseException:
        try:
            if old is None:
                target.unlink(missing_ok=True)
            else:
                atomic_write_text(target, old.decode("utf-8"))
            fsync_dir(target.parent)
        except OSError:
            pass  # the lock's error is the one to report; lock --check names the pylock that is left
        raise
    return target


def read_pylock(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a pylock file (tomllib). BadInput names the file: missing, not a file, over the 64 MiB cap, or not TOML."""
    path = Path(path)
    hint = "re-create it with `speclock lock --stack NAME --no-resolve`"
    if not path.exists() and not path.is_symlink():
        raise BadInput(f"no pylock file {path}", hint="run `speclock lock --stack NAME --no-resolve` to write it")
    text = read_text(path, what="pylock file", hint=hint)  # a folder, a FIFO, binary or oversized: named as such
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise BadInput(f"{path}: not a readable TOML file ({err or 'nested too deeply'})", hint=hint) from None


def _label(package: Any, i: int) -> str:
    if isinstance(package, dict):
        return f"{package.get('name')} {package.get('version')}"
    return f"packages[{i}]"


def _packages_by_key(packages: Any) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    problems = []
    if not isinstance(packages, list):
        return out, [f"packages is not a list of tables ({type(packages).__name__})"]
    for i, package in enumerate(packages):
        if not isinstance(package, dict) or not isinstance(package.get("name"), str):
            problems.append(f"packages[{i}] is not a package table with a name")
            continue
        out[(normalize(package["name"]), str(package.get("version")))] = package
    return out, problems


def _wheels_by_name(package: dict[str, Any]) -> dict[str, Any]:
    wheels = package.get("wheels")
    if not isinstance(wheels, list):
        return {}
    return {str(w.get("name")): w for w in wheels if isinstance(w, dict)}


def _diff_values(have: Any, want: Any, where: str) -> list[str]:
    if isinstance(have, dict) and isinstance(want, dict):
        out = []
        for key in list(want) + [k for k in have if k not in want]:
            out += _diff_values(have.get(key), want.get(key), f"{where}.{key}")
        return out
    return [] if have == want else [f"{where}: pylock has {have!r}, the lock gives {want!r}"]


def pylock_drift(lock_file: str | os.PathLike[str], doc: LockDoc) -> list[str]:
    """How the pylock next to a lock differs from what the lock gives (empty = in sync): a missing or unreadable file,
    and per package what differs (missing, extra, marker, a wheel's url or sha256), then the other keys."""
    path = pylock_path(lock_file)
    name = Path(lock_file).stem
    if not path.exists() and not path.is_symlink():  # a folder or a FIFO there is not "missing": read_pylock names it
        return [f"{path} is missing; run `speclock lock --stack {name} --no-resolve` to write it from the lock"]
    try:
        have = read_pylock(path)
    except BadInput as err:
        return [f"{err.message}; run `speclock lock --stack {name} --no-resolve` to write it again"]
    want = pylock_doc(doc)
    where = path.name
    have_pkgs, out = _packages_by_key(have.get("packages"))
    want_pkgs, _ = _packages_by_key(want["packages"])
    for pkg_key, package in want_pkgs.items():
        label = f"{where}: package {pkg_key[0]} {pkg_key[1]}"
        if pkg_key not in have_pkgs:
            out.append(f"{label} is in the lock, missing from the pylock")
            continue
        got = have_pkgs[pkg_key]
        if got.get("marker") != package.get("marker"):
            out.append(f"{label}: marker is {got.get('marker')!r}, the lock gives {package.get('marker')!r}")
        got_wheels, want_wheels = _wheels_by_name(got), _wheels_by_name(package)
        for filename, wheel in want_wheels.items():
            other = got_wheels.get(filename)
            if other is None:
                out.append(f"{label}: wheel {filename} is missing from the pylock")
                continue
            if other.get("url") != wheel["url"]:
                out.append(f"{label}: wheel {filename}: url is {other.get('url')!r}, the lock gives {wheel['url']!r}")
            if other.get("hashes") != wheel["hashes"]:
                out.append(
                    f"{label}: wheel {filename}: hashes are {other.get('hashes')!r}, the lock gives sha256 "
                    f"{wheel['hashes']['sha256']!r}"
                )
        for filename in got_wheels.keys() - want_wheels.keys():
            out.append(f"{label}: wheel {filename} is in the pylock, not in the lock")
        extra = {k: v for k, v in got.items() if k not in ("name", "version", "marker", "wheels")}
        if extra:
            out.append(f"{label}: keys the lock does not give: {', '.join(sorted(extra))}")
    for pkg_name, pkg_version in have_pkgs.keys() - want_pkgs.keys():
        out.append(f"{where}: package {pkg_name} {pkg_version} is in the pylock, not in the lock")
    for key in list(want) + [k for k in have if k not in want]:
        if key != "packages":
            out += _diff_values(have.get(key), want.get(key), f"{where}: {key}")
    return out


def offline_pylock(pylock: dict[str, Any], wheel_files: dict[str, str | os.PathLike[str]]) -> dict[str, Any]:
    """The pylock with each wheel's local file as its `path` (absolute), from {sha256: file}: what pip and uv install
    from without a network. A wheel whose sha256 is not in `wheel_files` keeps only its url."""
    out = {**pylock, "packages": []}
    for package in pylock["packages"]:
        wheels = []
        for wheel in package.get("wheels", []):
            local = wheel_files.get(wheel["hashes"]["sha256"])
            wheels.append({**wheel, "path": str(Path(local).resolve())} if local else dict(wheel))
        out["packages"].append({**package, "wheels": wheels})
    return out
