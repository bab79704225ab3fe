"""build-image's read of the lock (spec.lock.read_lock: shape, hash, provenance), answered from its last pass while
nothing that check reads has changed: the check's own key, as the SBOM has one (build.sbom.cache).

read_lock costs 0.1-0.2 s of a warm rebuild (pydantic's import and the lock model's validator,
docs/benchmarks.md, "Warm rebuild (#37)"). Its verdict is a function of:
  - the lock's bytes,
  - the stack files that allow its download hosts (stacks/*.toml of the project and of the lock's own project),
  - the checker's code: the import closure of speclock.spec.lock (build.closure), file by file, and speclock's
    version (the top __init__.py as the build steps carry it: build.closure.init_stub),
  - the libraries the lock model runs on (pydantic, pydantic_core: their files' stat) and Python's version.
The key hashes all of them (digests through build.digests); a pass is remembered under the lock's path, and a
lock whose key matches is parsed (core.jsonread) without the check. A failed check is never remembered.

The closure is itself remembered with the digests of its files and the list of speclock's module files: it is
a function of exactly those (an import names a module only if its file exists), so when none of them changed
it is the same closure; otherwise it is computed again (0.1 s)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import cast

from speclock.build import digests
from speclock.build.closure import import_closure, init_stub
from speclock.core.errors import SpeclockError
from speclock.core.files import atomic_write_text
from speclock.core.jsonread import loads, parse_json
from speclock.core.layout import REPO_ROOT, cache_dir
from speclock.spec.lock import LockDoc, read_lock

CHECKER = ("speclock.spec.lock",)
SRC_ROOT = Path(__file__).resolve().parents[1]  # src/speclock: the code that runs here, not the project's copy
LIBRARIES = ("pydantic", "pydantic_core")


def _memo_file(path: Path) -> Path:
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / "lockcheck" / f"{name}.json"


def _modules() -> list[str]:
    """speclock's module files (relative), the set the closure's imports resolve against."""
    return sorted(p.relative_to(SRC_ROOT).as_posix() for p in SRC_ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def checker_closure(kept: object) -> dict[str, str]:
    """{rel: sha256} of the checker's import closure: `kept` (the last one) while it still holds, else computed."""
    modules = hashlib.sha256("\n".join(_modules()).encode()).hexdigest()
    if isinstance(kept, dict) and kept.get("modules") == modules and isinstance(kept.get("files"), dict):
        files = kept["files"]
        try:
            if all(isinstance(v, str) and digests.sha256(SRC_ROOT.parent / k) == v for k, v in files.items()):
                return {**{str(k): str(v) for k, v in files.items()}, "": modules}
        except SpeclockError:  # a file of it is gone: compute it again
            pass
    closure = import_closure(SRC_ROOT, CHECKER)  # without speclock/__init__.py: its version is in check_key
    return {**{rel: digests.sha256(path) for rel, path in closure.items()}, "": modules}


def _libraries() -> list[str]:
    out = [sys.version]
    for name in LIBRARIES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        st = os.stat(origin) if origin else None
        out.append(f"{name}:{origin}:{st and digests.stamp(st)}")
    return out


def check_key(path: Path, data: bytes, closure: dict[str, str]) -> str:
    h = hashlib.sha256()
    h.update(b"lock:" + hashlib.sha256(data).hexdigest().encode() + b"\n")
    h.update(f"path:{path.resolve()}\nroot:{REPO_ROOT}\n".encode())
    for folder in (REPO_ROOT / "stacks", path.resolve().parent.parent / "stacks"):
        for stack_file in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
            h.update(f"stack:{stack_file}:{digests.sha256(stack_file)}\n".encode())
    for rel, digest in sorted(closure.items()):
        h.update(f"code:{rel}:{digest}\n".encode())
    h.update(b"version:" + init_stub(SRC_ROOT).encode())  # what the checker reads of speclock/__init__.py
    for lib in _libraries():
        h.update(f"lib:{lib}\n".encode())
    return h.hexdigest()


def read_lock_checked(path: Path) -> LockDoc:
    """read_lock(path), or the lock parsed without the check when its last pass had this very key."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError:
        return read_lock(path)  # it names what is wrong with the file
    try:
        kept = loads(_memo_file(path).read_text())
    except (OSError, ValueError):
        kept = None
    kept = kept if isinstance(kept, dict) else {}
    closure = checker_closure(kept.get("closure"))
    key = check_key(path, data, closure)
    if kept.get("key") == key:
        return cast(LockDoc, parse_json(data, path, what="lock file"))
    doc = read_lock(path)
    if doc == parse_json(data, path, what="lock file"):  # the bytes hashed are the ones checked
        memo = {"key": key, "closure": {"modules": closure[""], "files": {k: v for k, v in closure.items() if k}}}
        try:
            _memo_file(path).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(_memo_file(path), json.dumps(memo, sort_keys=True) + "\n")
        except (OSError, SpeclockError):
            pass
    return doc
