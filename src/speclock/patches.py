"""Engine patch series (`patches/<engine>/NNNN-what.patch`): parse, check against any release,
apply at image build (all or nothing), and prove each took effect.

A patch file is a header, then a unified diff against the engine's installed package (paths
relative to site-packages, `a/` and `b/` prefixes allowed):

    speclock-patch: 1
    Title: DeepSeek-V2/V3: implement vLLM's EAGLE-3 interface
    Engine: vllm
    Versions: >=0.15.0, <0.18.0
    Why: one or more lines; continuation lines start with a space
    Upstream: https://github.com/vllm-project/vllm/pull/...
    Probe: class-has vllm/model_executor/models/deepseek_v2.py DeepseekV2ForCausalLM SupportsEagle3
    Probe: eagle3-supported DeepseekV3ForCausalLM

    --- a/vllm/model_executor/models/deepseek_v2.py
    +++ b/vllm/model_executor/models/deepseek_v2.py
    @@ ...

Probes come in two kinds. Static probes read source files (so they also run against a wheel that
is only downloaded, never installed): `class-has FILE CLASS NAME...` (each NAME is a base class
or is defined in the class body) and `list-admits FILE VARIABLE VALUE...` (a model-type gate such
as vLLM's `aux_hidden_states_supported` admits each VALUE by substring, or no longer exists).
Runtime probes import the engine: `eagle3-supported ARCH` (the engine's registry resolves ARCH and
the engine's own EAGLE-3 check passes on that class, the outer one the engine checks).

Lifecycle of a patch against a given engine release (`speclock patches check`):
  applies          every hunk matches exactly (context lines included)
  already-applied  the patch's result is already there verbatim (a patched tree)
  upstream         the hunks no longer match but the static probes already pass: the engine has
                   the change; the patch is skipped and reported as retirable
  conflict         neither; the report names the file, the hunk and the code now there
"""

from __future__ import annotations

import argparse
import ast
import glob
import hashlib
import html
import http.client
import json
import os
import py_compile
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from speclock.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.files import (atomic_output, atomic_write_bytes, atomic_write_json, atomic_write_text, clean_stale_temps, confined,
                            file_sha256, os_error, plain_name, read_text)
from speclock.layout import IMAGE, cache_dir, in_image
from speclock.stack import REPO_ROOT, Stack, load_stack
from speclock.versions import in_range, parse_range, version_key

HEADER_MAGIC = "speclock-patch:"
REQUIRED_KEYS = ("title", "engine", "versions", "why", "probe")
KNOWN_KEYS = REQUIRED_KEYS + ("upstream",)
STATIC_PROBES = {"class-has": 3, "list-admits": 3}  # kind -> minimum number of arguments
RUNTIME_PROBES = {"eagle3-supported": 1}
RECORD_SCHEMA = "speclock.patches/v1"
# The numbers are bounded so int() never sees thousands of digits; git adds " section heading" after @@.
_HUNK = re.compile(r"@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@(?: .*)?")


# ---------------------------------------------------------------- parsing

@dataclass
class Hunk:
    old_start: int
    new_start: int
    lines: list[tuple[str, str]]  # (" " | "-" | "+", text without newline)
    header: str

    @property
    def old(self) -> list[str]:
        return [t for tag, t in self.lines if tag in " -"]

    @property
    def new(self) -> list[str]:
        return [t for tag, t in self.lines if tag in " +"]


@dataclass
class FileDiff:
    path: str  # relative to site-packages
    hunks: list[Hunk]
    line: int = 0  # line of its '+++' header in the patch


@dataclass
class Patch:
    path: Path
    sha256: str
    title: str
    engine: str
    versions: str
    version_clauses: list[tuple[str, str]]
    why: str
    upstream: str
    probes: list[list[str]]
    files: list[FileDiff]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def static_probes(self) -> list[list[str]]:
        return [p for p in self.probes if p[0] in STATIC_PROBES]

    @property
    def runtime_probes(self) -> list[list[str]]:
        return [p for p in self.probes if p[0] in RUNTIME_PROBES]


_REGEN = "regenerate the patch with `git diff`/`diff -u` (do not edit hunks by hand)"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A path inside the engine package: relative, '/'-separated, no '.'/'..' parts, no spaces or odd characters.
_REL_PATH = re.compile(r"[A-Za-z0-9_+@=,~-][A-Za-z0-9_.+@=,~-]*(?:/[A-Za-z0-9_.+@=,~-]+)*")
# Lines a `git diff` may put between files; anything else between files is refused.
_GIT_LINES = ("diff --git ", "index ")
_UNSUPPORTED_GIT = ("new file mode", "deleted file mode", "old mode", "new mode", "similarity index", "rename from",
                    "rename to", "copy from", "copy to", "Binary files", "GIT binary patch")


def _strip_prefix(path: str) -> str:
    path = path.split("\t")[0].rstrip(" ")
    return path[2:] if path.startswith(("a/", "b/")) else path


def bad_rel_path(rel: str) -> str | None:
    """Why `rel` is not a safe path inside the engine package (None when it is one)."""
    if not rel:
        return "an empty path"
    if rel.startswith("/") or re.match(r"[A-Za-z]:", rel):
        return f"an absolute path {rel!r}"
    parts = rel.split("/")
    if ".." in parts:
        return f"a path {rel!r} that leaves the engine's source tree ('..')"
    if "." in parts or "" in parts:
        return f"a path {rel!r} with an empty or '.' component"
    if not _REL_PATH.fullmatch(rel):
        return f"a path {rel!r} with characters a package path does not have (spaces, '\\', control characters)"
    return None


def parse_patch(path: Path) -> Patch:
    """Read a patch file: header keys, then a unified diff. Raises BadInput naming file and line.

    The reader refuses anything it does not understand (a malformed hunk header, hunk counts that
    disagree with the body, stray lines, a file header without hunks, paths out of the tree), so a
    patch is either understood whole or not used at all: no hunk is ever dropped silently.
    """
    path = Path(path)
    text = read_text(path, what="patch", hint=_REGEN)
    data = text.encode("utf-8")  # the exact bytes: UTF-8 decoding round-trips
    lines = text.split("\n")

    def bad(lineno: int, problem: str, hint: str) -> BadInput:
        return BadInput(f"{path}:{lineno}: {problem}", hint=hint)

    if "\r" in text:
        raise bad(text.count("\n", 0, text.index("\r")) + 1, "carriage return in the patch (CRLF line endings)",
                  "convert the patch to LF line endings (dos2unix), or " + _REGEN)
    if not lines[0].startswith(HEADER_MAGIC):
        raise bad(1, f"malformed patch header: the first line must be '{HEADER_MAGIC} 1'",
                  "start the file with the speclock header (see docs/patches.md)")
    if lines[0][len(HEADER_MAGIC):].strip() != "1":
        raise bad(1, f"unsupported header version {lines[0][len(HEADER_MAGIC):].strip()!r}", "use 'speclock-patch: 1'")
    header: dict[str, list[str]] = {}
    key_line: dict[str, int] = {}
    probes: list[tuple[int, list[str]]] = []
    i, last = 1, None
    while i < len(lines) and not lines[i].startswith(("--- ", "diff ")):
        line = lines[i]
        if not line.strip():
            last = None
        elif line[0] in " \t" and last:
            header[last][-1] += " " + line.strip()
            if last == "probe":
                raise bad(i + 1, "a Probe: line cannot continue on the next line", "write each probe on one line")
        else:
            key, sep, value = line.partition(":")
            key = key.strip().lower()
            if not sep or key not in KNOWN_KEYS:
                raise bad(i + 1, f"malformed patch header line {line!r}",
                          f"header lines are 'Key: value' with Key one of {', '.join(k.title() for k in KNOWN_KEYS)}")
            if key != "probe" and key in header:
                raise bad(i + 1, f"'{key.title()}:' is given twice", f"keep one '{key.title()}:' line")
            header.setdefault(key, []).append(value.strip())
            key_line.setdefault(key, i + 1)
            if key == "probe":
                probes.append((i + 1, value.split()))
            last = key
        i += 1
    for key in REQUIRED_KEYS:
        if not header.get(key) or not header[key][0]:
            raise bad(1, f"malformed patch header: '{key.title()}:' is missing",
                      "every patch needs Title, Engine, Versions, Why and at least one Probe")
    for lineno, probe in probes:
        _check_probe(probe, lambda problem, hint, n=lineno: bad(n, problem, hint))
    clauses = parse_range(header["versions"][0], where=f"{path}:{key_line['versions']}: Versions")
    files = _parse_diff(lines, i, bad)
    return Patch(path=path, sha256=hashlib.sha256(data).hexdigest(), title=header["title"][0],
                 engine=header["engine"][0], versions=header["versions"][0], version_clauses=clauses,
                 why=header["why"][0], upstream=(header.get("upstream") or [""])[0],
                 probes=[p for _, p in probes], files=files)


def _check_probe(probe: list[str], bad) -> None:
    """A Probe: line's shape: a known kind, enough arguments, each argument of its kind."""
    kind = probe[0] if probe else ""
    need = STATIC_PROBES.get(kind) or RUNTIME_PROBES.get(kind)
    hint = "see docs/patches.md for the probe kinds and their arguments"
    if need is None:
        raise bad(f"Probe: unknown probe kind {kind!r}", f"probes: {', '.join(list(STATIC_PROBES) + list(RUNTIME_PROBES))}")
    args = probe[1:]
    if len(args) < need:
        raise bad(f"Probe: {kind} needs at least {need} arguments, got {len(args)}", hint)
    if kind in STATIC_PROBES:
        why = bad_rel_path(args[0])
        if why:
            raise bad(f"Probe: {kind} FILE is {why}", "name a file inside the engine package, e.g. vllm/model_executor/models/x.py")
        names = args[1:] if kind == "class-has" else args[1:2]  # list-admits VALUEs are free text
    else:
        names = args
    for name in names:
        if not _IDENT.fullmatch(name):
            raise bad(f"Probe: {kind} argument {name!r} is not a Python name", hint)


def _parse_diff(lines: list[str], i: int, bad) -> list[FileDiff]:
    files: list[FileDiff] = []
    # split("\n") leaves one empty string after the final newline: not a line of the patch.
    n = len(lines) - 1 if lines[-1] == "" else len(lines)

    def close_file() -> None:
        if files and not files[-1].hunks:
            raise bad(files[-1].line, f"file header for {files[-1].path!r} has no hunks", _REGEN)

    while i < n:
        line = lines[i]
        if line.startswith(_GIT_LINES):
            close_file()
            i += 1
            continue
        if line.startswith(_UNSUPPORTED_GIT):
            raise bad(i + 1, f"unsupported git diff line {line!r}: patches only edit text files that exist",
                      "leave file creation, deletion, renames, mode changes and binary files out of the patch")
        if line.startswith("--- "):
            close_file()
            if i + 1 >= n or not lines[i + 1].startswith("+++ "):
                raise bad(i + 1, "'---' line not followed by '+++'", _REGEN)
            old, target = _strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])
            if old == "/dev/null" or target == "/dev/null":
                raise bad(i + 1, "the patch creates or deletes a file", "patches edit existing files inside site-packages")
            why = bad_rel_path(target)
            if why:
                raise bad(i + 2, f"target file is {why}", "patches edit files inside the engine's package (b/vllm/...)")
            if any(f.path == target for f in files):
                raise bad(i + 2, f"{target!r} has a second file header in the same patch", "merge its hunks: " + _REGEN)
            files.append(FileDiff(target, [], line=i + 2))
            i += 2
            continue
        if line.startswith("@@"):
            m = _HUNK.fullmatch(line)
            if not m:
                raise bad(i + 1, f"malformed hunk header {line!r}", _REGEN)
            if not files:
                raise bad(i + 1, "hunk before any '---'/'+++' file header", _REGEN)
            i = _parse_hunk(lines, i, n, m, files[-1], bad)
            continue
        if not line:
            if not any(lines[i:n]):
                break  # blank lines at the very end
            raise bad(i + 1, "blank line between hunks (a hunk's line counts are too small, or the patch was edited)",
                      _REGEN)
        if line[0] in " +-":
            raise bad(i + 1, f"hunk line {line!r} outside any hunk: the previous hunk's line counts are too small",
                      _REGEN)
        raise bad(i + 1, f"unexpected line {line!r} in the diff (trailing garbage?)",
                  "a patch ends after its last hunk; " + _REGEN)
    close_file()
    if not files:
        raise bad(i + 1, "no unified diff after the header", "append the output of `diff -u` (--- a/FILE, +++ b/FILE, @@ hunks)")
    return files


def _parse_hunk(lines: list[str], i: int, n: int, m: re.Match, diff: FileDiff, bad) -> int:
    """Read one hunk starting at its @@ line; its body must hold exactly the counted lines."""
    old_len = int(m[2]) if m[2] is not None else 1
    new_len = int(m[4]) if m[4] is not None else 1
    hunk = Hunk(int(m[1]), int(m[3]), [], lines[i])
    if old_len == 0 and new_len == 0:
        raise bad(i + 1, f"empty hunk {hunk.header!r}", _REGEN)
    start = i
    i += 1
    seen_old = seen_new = 0

    def counts() -> str:
        return (f"hunk {hunk.header!r} (line {start + 1}) has {seen_old}/{seen_new} lines, header says "
                f"{old_len}/{new_len} (old/new)")

    while seen_old < old_len or seen_new < new_len:
        if i >= n:
            raise bad(i, f"{counts()} when the patch ends", _REGEN)
        body = lines[i]
        if body.startswith("\\") and i > start + 1:
            i += 1  # "\ No newline at end of file" after a body line
            continue
        tag = body[:1] or " "  # an empty line in a diff is an empty context line
        if tag not in " -+":
            raise bad(i + 1, f"{body!r} is not a hunk line (' ', '+', '-' or '\\ No newline'): {counts()}", _REGEN)
        if (tag in " -" and seen_old == old_len) or (tag in " +" and seen_new == new_len):
            kind = {" ": "context", "-": "removed", "+": "added"}[tag]
            raise bad(i + 1, f"{counts()} before this {kind} line, one more than counted", _REGEN)
        hunk.lines.append((tag, body[1:]))
        seen_old += tag in " -"
        seen_new += tag in " +"
        i += 1
    if i < n and lines[i].startswith("\\"):
        i += 1
    diff.hunks.append(hunk)
    return i


# ---------------------------------------------------------------- source trees

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
            raise EnvironmentProblem(f"{wheel} is not a readable wheel (zip): {err}",
                                     hint=f"delete {wheel} and run the command again to download it afresh") from None
        except OSError as err:
            raise os_error(err, wheel, "read the wheel") from None

    def read(self, rel: str) -> str | None:
        if rel not in self.names:
            return None
        try:
            data = self.zip.read(rel)
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as err:
            raise EnvironmentProblem(f"{self.label}: member {rel} cannot be read: {err}",
                                     hint=f"delete {self.label} and run the command again to download it afresh") from None
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


# ---------------------------------------------------------------- applying hunks

@dataclass
class HunkFailure:
    file: str
    hunk_index: int  # 1-based within the file
    header: str
    expected_line: int  # 1-based line where the hunk was expected
    first_mismatch: str  # the patch's line that the file does not have
    upstream_excerpt: list[str]  # the file's lines now at that place

    def describe(self) -> str:
        lines = "\n".join(f"      {line}" for line in self.upstream_excerpt) or "      (file ends before this line)"
        return (f"{self.file} hunk {self.hunk_index} {self.header} does not match at line {self.expected_line}:\n"
                f"    patch expects: {self.first_mismatch!r}\n    upstream code there now:\n{lines}")


def _find(lines: list[str], block: list[str], expected: int, lower: int) -> int | None:
    """Position of `block` in `lines` nearest to `expected`, at or after `lower` (exact match only)."""
    if not block:
        return max(lower, min(expected, len(lines)))
    n, m = len(lines), len(block)
    for delta in range(0, n + 1):
        for pos in ((expected + delta, expected - delta) if delta else (expected,)):
            if lower <= pos <= n - m and lines[pos:pos + m] == block:
                return pos
        if expected - delta < lower and expected + delta > n - m:
            break
    return None


def apply_hunks(text: str, diff: FileDiff, reverse: bool = False) -> tuple[str | None, HunkFailure | None]:
    """Apply (or un-apply) every hunk of `diff` to `text` with exact context; (new_text, None) or (None, failure)."""
    ends_nl = text.endswith("\n")
    lines = text.split("\n")
    if ends_nl:
        lines.pop()
    offset, lower = 0, 0
    for idx, hunk in enumerate(diff.hunks, 1):
        old, new = (hunk.new, hunk.old) if reverse else (hunk.old, hunk.new)
        start = (hunk.new_start if reverse else hunk.old_start) - (1 if old else 0)
        expected = max(0, start + offset)
        pos = _find(lines, old, expected, lower)
        if pos is None:
            mismatch = next((want for k, want in enumerate(old)
                             if expected + k >= len(lines) or lines[expected + k] != want), old[0] if old else "")
            excerpt = lines[expected:expected + max(len(old), 3) + 2]
            return None, HunkFailure(diff.path, idx, hunk.header, expected + 1, mismatch, excerpt)
        lines[pos:pos + len(old)] = new
        offset = pos - start + len(new) - len(old)
        lower = pos + len(new)
    out = "\n".join(lines)
    return (out + "\n" if ends_nl else out), None


# ---------------------------------------------------------------- static probes

def _class_node(tree: ast.AST, cls: str) -> ast.ClassDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return node
    return None


def _names_of_class(node: ast.ClassDef) -> set[str]:
    names = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.add(base.id)
        elif isinstance(base, ast.Attribute):
            names.add(base.attr)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    return names


def run_static_probe(probe: list[str], tree: SourceTree) -> tuple[bool, str]:
    """Evaluate a static probe on source files; (passed, one-line reason)."""
    kind, args = probe[0], probe[1:]
    rel = args[0]
    source = tree.read(rel)
    if source is None:
        return False, f"{rel} does not exist"
    try:
        module = ast.parse(source)
    except SyntaxError as err:  # the engine's file (or an earlier patch's result) is not Python: the probe fails
        return False, f"{rel} does not parse as Python (line {err.lineno}: {err.msg})"
    except (ValueError, RecursionError) as err:
        return False, f"{rel} does not parse as Python ({err})"
    if kind == "class-has":
        cls, wanted = args[1], args[2:]
        node = _class_node(module, cls)
        if node is None:
            return False, f"{rel} defines no class {cls}"
        missing = [w for w in wanted if w not in _names_of_class(node)]
        if missing:
            return False, f"{cls} in {rel} lacks {', '.join(missing)}"
        return True, f"{cls} in {rel} has {', '.join(wanted)}"
    if kind == "list-admits":
        var, values = args[1], args[2:]
        found = None
        for node in ast.walk(module):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == var for t in node.targets):
                found = node.value
        if found is None:
            return True, f"{rel} has no {var} gate any more (nothing to admit)"
        if not isinstance(found, (ast.List, ast.Tuple, ast.Set)):
            return False, f"{var} in {rel} is not a literal list"
        items = [e.value for e in found.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        # vLLM admits a model type when a listed name is a substring of it.
        missing = [v for v in values if not any(item in v for item in items)]
        if missing:
            return False, f"{var} in {rel} does not admit {', '.join(missing)}"
        return True, f"{var} in {rel} admits {', '.join(values)}"
    raise BadInput(f"unknown static probe {kind!r}")


def run_static_probes(patch: Patch, tree: SourceTree) -> list[dict]:
    return [dict(probe=" ".join(p), passed=ok, reason=why)
            for p in patch.static_probes for ok, why in [run_static_probe(p, tree)]]


# ---------------------------------------------------------------- runtime probes

def run_runtime_probes(patch: Patch, engine: str, python: str | None = None, site_packages: Path | None = None) -> list[dict]:
    """Run the patch's runtime probes in the engine's Python (a subprocess, so imports are fresh)."""
    out = []
    for probe in patch.runtime_probes:
        if probe[0] == "eagle3-supported":
            res = eagle3_probe(engine, probe[1:], python=python, site_packages=site_packages)
            for arch in probe[1:]:
                r = res[arch]
                out.append(dict(probe=f"eagle3-supported {arch}", passed=bool(r.get("resolved") and r.get("eagle3")),
                                reason=r.get("reason", "")))
    return out


def engine_subprocess(args: list[str], python: str | None = None, site_packages: Path | None = None,
                      timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python -m speclock.engine_probe ARGS` in the engine's Python; `site_packages` first on its path."""
    py = python or sys.executable
    env = dict(os.environ)
    paths = [str(Path(__file__).resolve().parents[1])] + ([str(site_packages)] if site_packages else [])
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        return subprocess.run([py, "-m", "speclock.engine_probe", *args], env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise EnvironmentProblem(f"engine python {py} does not exist",
                                 hint="install the engine env (python -m speclock.engine_envs ensure NAME==VERSION)") from None
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"engine probe {' '.join(args[:2])} in {py} took over {timeout} s") from None


def last_json(proc: subprocess.CompletedProcess, what: str):
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    try:
        return json.loads(last)
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"{what} failed: {tail}", hint="run `speclock doctor` for the engine-import check") from None


def eagle3_probe(engine: str, archs: list[str], python: str | None = None, site_packages: Path | None = None,
                 timeout: int = 300) -> dict:
    """{arch: {resolved, class, module, eagle3, reason}} from the engine's own registry and EAGLE-3 check."""
    proc = engine_subprocess(["eagle3", engine, *archs], python, site_packages, timeout)
    what = f"importing {engine} in {python or sys.executable}"
    res = last_json(proc, what)
    # The answer comes from another process: check its shape before any field is used.
    hint = "run `speclock doctor` for the engine-import check; rerun with SPECLOCK_DEBUG=1 to see the engine's output"
    if not isinstance(res, dict):
        raise EnvironmentProblem(f"{what}: the eagle3 probe answered a JSON {type(res).__name__}, not an object", hint=hint)
    for arch in archs:
        entry = res.get(arch)
        if not isinstance(entry, dict):
            raise EnvironmentProblem(f"{what}: the eagle3 probe's answer has no object for {arch!r}", hint=hint)
        for key, kind in (("resolved", bool), ("eagle3", (bool, type(None))), ("reason", str)):
            if key in entry and not isinstance(entry[key], kind):
                raise EnvironmentProblem(f"{what}: the eagle3 probe's '{arch}.{key}' is {type(entry[key]).__name__}", hint=hint)
    return res


# ---------------------------------------------------------------- lifecycle

@dataclass
class PatchResult:
    patch: Patch
    state: str  # applies | already-applied | upstream | conflict
    in_range: bool
    reason: str
    failures: list[HunkFailure] = field(default_factory=list)
    probes_before: list[dict] = field(default_factory=list)
    new_texts: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"patch": self.patch.name, "sha256": self.patch.sha256, "title": self.patch.title,
                "versions": self.patch.versions, "in_range": self.in_range, "state": self.state,
                "retirable": self.state == "upstream", "reason": self.reason,
                "upstream": self.patch.upstream,
                "conflicts": [dict(file=f.file, hunk=f.hunk_index, header=f.header, line=f.expected_line,
                                   expected=f.first_mismatch, upstream_code=f.upstream_excerpt) for f in self.failures],
                "probes_before": self.probes_before}


def check_patch(patch: Patch, tree: Overlay, version: str) -> PatchResult:
    ok_range = in_range(version, patch.version_clauses)
    probes = run_static_probes(patch, tree)
    forward: dict[str, str] = {}
    failures: list[HunkFailure] = []
    missing = [f.path for f in patch.files if tree.read(f.path) is None]
    if missing:
        if probes and all(p["passed"] for p in probes):
            return PatchResult(patch, "upstream", ok_range, f"{missing[0]} is gone, and the change is already present: "
                               + "; ".join(p["reason"] for p in probes) + " -> skip it; the patch is retirable", [], probes)
        return PatchResult(patch, "conflict", ok_range, f"file {missing[0]} is not in this release", [], probes)
    reverse_ok = True
    for fd in patch.files:
        text = tree.read(fd.path)
        new, fail = apply_hunks(text, fd)
        if fail:
            failures.append(fail)
        else:
            forward[fd.path] = new
        if reverse_ok and apply_hunks(text, fd, reverse=True)[1] is not None:
            reverse_ok = False
    probes_pass = bool(probes) and all(p["passed"] for p in probes)
    if reverse_ok and failures:
        return PatchResult(patch, "already-applied", ok_range, "the patched code is already there verbatim", [], probes)
    if not failures:
        note = " (note: its probes already pass without it, so they cannot prove it)" if probes_pass else ""
        return PatchResult(patch, "applies", ok_range, "every hunk applies with exact context" + note, [], probes, forward)
    if probes_pass:
        return PatchResult(patch, "upstream", ok_range,
                           "hunks no longer match, and the change is already present: "
                           + "; ".join(p["reason"] for p in probes) + " -> skip it; the patch is retirable", failures, probes)
    return PatchResult(patch, "conflict", ok_range, failures[0].describe(), failures, probes)


def check_series(patches: list[Patch], tree: SourceTree, version: str) -> list[PatchResult]:
    """Check a series in order; each applying patch's edits are visible to the next ones."""
    overlay = tree if isinstance(tree, Overlay) else Overlay(tree)
    results = []
    for patch in patches:
        res = check_patch(patch, overlay, version)
        overlay.changes.update(res.new_texts)
        results.append(res)
    return results


# ---------------------------------------------------------------- stack and engine plumbing

def patches_root() -> Path:
    if os.environ.get("SPECLOCK_PATCHES_DIR"):  # tests and out-of-tree series
        return Path(os.environ["SPECLOCK_PATCHES_DIR"])
    if in_image() and IMAGE.patches_dir.is_dir():
        return IMAGE.patches_dir
    return REPO_ROOT / "patches"


def series_paths(stack: Stack, root: Path | None = None) -> list[Path]:
    """The files of the stack's patches.series, each confined to patches/<engine>/ (checked before any is read)."""
    base = (root or patches_root()) / stack.engine["name"]
    where = f"{stack.path}: key 'patches.series'"
    paths, seen = [], set()
    for name in stack.patch_series:
        # A plain file name, or plain names joined by '/' (patches/vllm/faults/... holds the example faults).
        if not isinstance(name, str) or not name or name.startswith("/"):
            raise BadInput(f"{where}: entry {name!r} is not a patch file name under {base}",
                           hint=f"list file names of {base}, e.g. '0001-fix.patch'")
        for part in name.split("/"):
            plain_name(part, what=f"entry {name!r}: part", source=where)
        path = confined(base, name, what=f"entry {name!r} of patches.series", source=stack.path)
        if name in seen:
            raise BadInput(f"{where}: entry {name!r} is listed twice", hint="list each patch once")
        seen.add(name)
        paths.append(path)
    return paths


def load_series(stack: Stack, root: Path | None = None) -> list[Patch]:
    base = (root or patches_root()) / stack.engine["name"]
    out = []
    for name, path in zip(stack.patch_series, series_paths(stack, root)):
        if not path.is_file():
            raise BadInput(f"{stack.path}: key 'patches.series': entry {name!r}: {path} "
                           f"{'is not a file' if path.exists() else 'does not exist'}",
                           hint=f"patches for {stack.engine['name']} live in {base}")
        patch = parse_patch(path)
        if patch.engine != stack.engine["name"]:
            raise BadInput(f"{path}: Engine is {patch.engine!r}, stack {stack.name} uses {stack.engine['name']!r}",
                           hint="list only patches for the stack's engine")
        out.append(patch)
    return out


def installed_version(site_packages: Path, dist: str) -> str | None:
    import importlib.metadata as md

    norm = re.sub(r"[-_.]+", "-", dist).lower()
    for d in md.distributions(path=[str(site_packages)]):
        if re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() == norm:
            return d.version
    return None


# Engine wheels downloaded to check a series against another release live in <cache>/wheels, each
# with a sidecar <wheel>.sha256 (JSON: sha256, url, source) saying which hash its bytes must have
# and where that hash came from (a lock, or the index at download time). Every use re-hashes the
# wheel; a wheel that does not match (truncated, corrupted, tampered) is deleted and downloaded again.
WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+!-]*\.whl")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_STALE_TEMP_S = 60.0  # a temp untouched this long is a killed run's leftover (a live download writes constantly)
_TRIES = 3
_RETRY_PAUSE_S = 1.0


@dataclass
class WheelSource:
    filename: str
    url: str
    sha256: str  # "" when the index gave no hash
    source: str  # where the hash came from, for messages


class _Transient(Exception):
    """A network failure worth one more try (not an OSError, so atomic_output does not remap it)."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _same_version(a: str, b: str) -> bool:
    try:
        return version_key(a) == version_key(b) and a.partition("+")[2].lower() == b.partition("+")[2].lower()
    except ValueError:
        return False


def wheel_matches(filename: str, package: str, version: str) -> bool:
    """Is `filename` a wheel of package==version (any platform), with a safe plain name?"""
    if not WHEEL_NAME.fullmatch(filename) or filename.startswith(".."):
        return False
    parts = filename[:-4].split("-")
    return len(parts) in (5, 6) and _norm(parts[0]) == _norm(package) and _same_version(parts[1], version)


def index_url() -> str:
    """The package index (PEP 503/691 simple API): SPECLOCK_INDEX_URL, PIP_INDEX_URL, or PyPI."""
    return (os.environ.get("SPECLOCK_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")


def _ssl_context() -> ssl.SSLContext:
    """Honour the user's CA bundle (intercepting proxies): PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE."""
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return ssl.create_default_context(cafile=os.environ[var])
    return ssl.create_default_context()


def _open(url: str, what: str, accept: str = "*/*"):
    """urlopen with the errors sorted: 404/410 -> BadInput (never retried), other 4xx -> EnvironmentProblem,
    5xx and connection errors -> _Transient."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("https", "http", "file"):
        raise BadInput(f"{what}: unsupported URL {url!r}", hint="use an https:// (or file://) index")
    if parsed.scheme == "file" and url.endswith("/"):
        url += "index.html"  # a simple index laid out on disk
    req = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "speclock"})
    try:
        return urllib.request.urlopen(req, timeout=60, context=_ssl_context() if parsed.scheme == "https" else None)
    except urllib.error.HTTPError as err:
        if err.code in (404, 410):
            raise BadInput(f"{what}: not found at {url} (HTTP {err.code})",
                           hint="check the package name and version (pip index versions NAME) and the index URL") from None
        if err.code < 500:
            raise EnvironmentProblem(f"{what}: {url} answered HTTP {err.code} {err.reason}",
                                     hint="check access to the index (credentials, proxy)") from None
        raise _Transient(f"{url} answered HTTP {err.code}") from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, (FileNotFoundError, NotADirectoryError)):
            raise BadInput(f"{what}: not found at {url}", hint="check the index URL") from None
        raise _Transient(f"{url}: {err.reason}") from None
    except (OSError, http.client.HTTPException) as err:
        raise _Transient(f"{url}: {err}") from None


def _retrying(fn, what: str):
    last = None
    for attempt in range(_TRIES):
        try:
            return fn()
        except _Transient as err:
            last = err
            if attempt + 1 < _TRIES:
                time.sleep(_RETRY_PAUSE_S * (attempt + 1))
    raise EnvironmentProblem(f"{what}: {last} (tried {_TRIES} times)",
                             hint="check network access to the index (and PIP_CERT/SSL_CERT_FILE behind a proxy)")


def locked_wheels(package: str, version: str, locks: Path | None = None) -> list[WheelSource]:
    """Wheels of package==version that a committed lock pins (url and sha256 known in advance)."""
    out = []
    for lock in sorted((locks or REPO_ROOT / "locks").glob("*.lock")):
        try:
            data = json.loads(lock.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # not this command's input: the lock's own reader reports a broken lock
        pkgs = data.get("packages") if isinstance(data, dict) else None
        for pkg in pkgs if isinstance(pkgs, list) else []:
            if (isinstance(pkg, dict) and all(isinstance(pkg.get(k), str) for k in ("filename", "url", "sha256"))
                    and wheel_matches(pkg["filename"], package, version) and _SHA256.fullmatch(pkg["sha256"])
                    and pkg["url"].startswith("https://")):
                out.append(WheelSource(pkg["filename"], pkg["url"], pkg["sha256"], f"lock {lock.name}"))
    return out


def index_wheels(package: str, version: str) -> list[WheelSource]:
    """Wheels of package==version on the index, with the sha256 it publishes (JSON API or #sha256= links)."""
    page = f"{index_url()}/{_norm(package)}/"
    what = f"looking up {package}=={version}"

    def get() -> tuple[bytes, str]:
        with _open(page, what, accept="application/vnd.pypi.simple.v1+json, text/html;q=0.1") as resp:
            try:
                return resp.read(), resp.headers.get("Content-Type", "")
            except (OSError, http.client.HTTPException) as err:
                raise _Transient(f"{page}: {err}") from None

    body, ctype = _retrying(get, what)
    entries: list[tuple[str, str, str]] = []  # filename, url, sha256
    if "json" in ctype:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, list):
            raise EnvironmentProblem(f"{what}: {page} answered JSON without a 'files' list", hint="check the index URL")
        for f in files:
            if isinstance(f, dict) and isinstance(f.get("filename"), str) and isinstance(f.get("url"), str):
                hashes = f.get("hashes") if isinstance(f.get("hashes"), dict) else {}
                sha = hashes.get("sha256") if isinstance(hashes.get("sha256"), str) else ""
                entries.append((f["filename"], urllib.parse.urljoin(page, f["url"]), sha))
    else:
        text = body.decode("utf-8", "replace")
        for href, label in re.findall(r"<a\s[^>]*?href=\"([^\"]*)\"[^>]*>([^<]*)</a>", text, re.I):
            entries.append((html.unescape(label).strip(), urllib.parse.urljoin(page, html.unescape(href)), ""))
    out = []
    for filename, url, sha in entries:
        base, _, fragment = url.partition("#")
        frag = urllib.parse.parse_qs(fragment).get("sha256", [""])[0]
        sha = (sha or frag).lower()
        if wheel_matches(filename, package, version):
            out.append(WheelSource(filename, base, sha if _SHA256.fullmatch(sha) else "",
                                   f"index {page}" if sha else "computed at download (the index gave no hash)"))
    if not out:
        raise BadInput(f"{package}=={version} is not a released version with a wheel at {page}",
                       hint=f"list releases with: pip index versions {package}")
    return out


def _rank(sources: list[WheelSource]) -> list[WheelSource]:
    """This interpreter's own wheel first (pip's choice), any other platform's after (its sources are the same)."""
    try:
        from packaging.tags import sys_tags
        from packaging.utils import parse_wheel_filename
        order = {str(t): n for n, t in enumerate(sys_tags())}

        def key(s: WheelSource) -> tuple:
            try:
                return (min((order.get(str(t), 1 << 30) for t in parse_wheel_filename(s.filename)[3]), default=1 << 30),
                        s.filename)
            except Exception:
                return (1 << 30, s.filename)
    except ImportError:
        def key(s: WheelSource) -> tuple:
            return (0 if "x86_64" in s.filename or "none-any" in s.filename else 1, s.filename)
    return sorted(sources, key=key)


def _sidecar(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + ".sha256")


def _read_sidecar(wheel: Path) -> tuple[str, str] | None:
    try:
        doc = json.loads(_sidecar(wheel).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # missing or damaged: the hash is looked up again
    if isinstance(doc, dict) and isinstance(doc.get("sha256"), str) and _SHA256.fullmatch(doc["sha256"]):
        return doc["sha256"], str(doc.get("source") or "sidecar")
    return None


def _discard(path: Path) -> None:
    for p in (path, _sidecar(path)):
        try:
            p.unlink(missing_ok=True)
        except OSError as err:
            raise os_error(err, p, "remove the corrupt cached wheel") from None


def _write_block(fh, block: bytes) -> None:
    fh.write(block)  # one place for writes, so a test can make the disk full


def _download(src: WheelSource, dest: Path, log) -> Path:
    target = dest / plain_name(src.filename, what="wheel file name", source=src.url)
    what = f"downloading {src.filename}"

    def once() -> str:
        h = hashlib.sha256()
        with _open(src.url, what) as resp, atomic_output(target, binary=True) as fh:
            while True:
                try:
                    block = resp.read(1 << 20)
                except (OSError, http.client.HTTPException) as err:
                    raise _Transient(f"{src.url}: transfer broke: {err}") from None
                if not block:
                    break
                h.update(block)
                _write_block(fh, block)
            digest = h.hexdigest()
            if src.sha256 and digest != src.sha256:  # a short or altered transfer: the temp file is dropped
                raise _Transient(f"the bytes from {src.url} have sha256 {digest}, the {src.source} says {src.sha256}")
        return digest

    log(f"downloading {src.filename} from {src.url} into {dest}")
    digest = _retrying(once, what)
    atomic_write_json(_sidecar(target), {"sha256": digest, "url": src.url, "source": src.source})
    return target


def fetch_wheel(package: str, version: str, log=print) -> Path:
    """The engine's wheel (no dependencies) from the cache, verified by sha256 on every use; downloaded if
    absent or corrupt. The expected hash comes from a committed lock, else from the index at download time."""
    dest = cache_dir() / "wheels"
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, dest, "create the wheel cache") from None
    clean_stale_temps(dest, older_than_s=_STALE_TEMP_S)
    locked = locked_wheels(package, version)
    known = {s.filename: s for s in locked}
    looked_up: list[WheelSource] | None = None
    for wheel in sorted(w for w in dest.glob("*.whl") if wheel_matches(w.name, package, version)):
        if wheel.name in known:
            want, source = known[wheel.name].sha256, known[wheel.name].source
        else:
            side = _read_sidecar(wheel)
            if side is None:  # no record of its hash (an older cache): ask the index
                looked_up = looked_up if looked_up is not None else index_wheels(package, version)
                match = next((s for s in looked_up if s.filename == wheel.name and s.sha256), None)
                side = (match.sha256, match.source) if match else None
            want, source = side if side else ("", "nothing")
        if want and file_sha256(wheel) == want:
            if not _read_sidecar(wheel):
                atomic_write_json(_sidecar(wheel), {"sha256": want, "url": "", "source": source})
            return wheel
        log(f"cached {wheel} does not match its sha256 (from {source}): deleting it and downloading it again")
        _discard(wheel)
    sources = _rank(locked or (looked_up if looked_up is not None else index_wheels(package, version)))
    return _download(sources[0], dest, log)


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
        raise EnvironmentProblem(f"{dist} in {site_packages} has version {version!r}, which is not a release version",
                                 hint="reinstall the engine") from None
    return version


def version_arg(text: str) -> str:
    """argparse type: a release version (versions.py syntax), refused at parse time otherwise."""
    try:
        version_key(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version (e.g. 0.17.1)") from None
    return text.strip()


def default_site_packages(python: str | None = None) -> Path:
    py = python or sys.executable
    try:
        proc = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, timeout=120)
    except OSError as err:
        raise BadInput(f"--python {py} cannot be run: {err.strerror or err}", hint="give the engine's python") from None
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"--python {py} did not answer within 120 s") from None
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"{py} could not tell its site-packages: {tail}", hint="give --site-packages")
    return Path(proc.stdout.strip())


def _check_output_path(path: Path, option: str) -> None:
    """Refuse an output path that cannot be written, before anything else is written."""
    if path.is_dir():
        raise BadInput(f"{option} {path} is a directory, where a file belongs", hint="give a file path")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise BadInput(f"{option} {path}: {parent} is a file, where a directory belongs",
                               hint="choose another path")
            break


# ---------------------------------------------------------------- apply (image build)

def apply_series(stack: Stack, site_packages: Path, python: str | None = None, record: Path | None = None,
                 run_probes: bool = True, log=print) -> dict:
    """Apply the stack's series to an installed engine, all or nothing; verify; write a JSON record."""
    site_packages = Path(site_packages)
    patches = load_series(stack)
    dist = stack.engine["package"]
    version = engine_version_in(site_packages, dist)
    if version != stack.engine["version"]:
        raise BadInput(f"{site_packages} has {dist} {version}, stack {stack.name} pins {stack.engine['version']}",
                       hint="install the pinned engine, or fix the stack")
    for p in patches:
        if not in_range(version, p.version_clauses):
            raise BadInput(f"{p.path}: Versions '{p.versions}' excludes the pinned {dist} {version}",
                           hint="drop the patch from the stack's [patches] series, or widen its range after checking "
                                f"`speclock patches check --stack {stack.name}`")
    results = check_series(patches, DirTree(site_packages), version)
    bad = [r for r in results if r.state == "conflict"]
    if bad:
        raise CheckFailed("patch series does not apply; nothing was changed:\n  "
                          + "\n  ".join(f"{r.patch.name}: {r.reason}" for r in bad),
                          hint="refresh the patch against this release, or retire it if the change is upstream")
    # Every new file content is computed; write them all, restoring originals if anything fails.
    final: dict[str, str] = {}
    for r in results:
        final.update(r.new_texts)
    # Every target's folder must resolve inside site-packages (no '..', no linked folder leading out) before any
    # write. The file itself may be a symbolic link (a linked copy of an engine tree): the atomic write replaces
    # the link with a new file and never writes through it.
    targets = {rel: confined(site_packages, str(Path(rel).parent), what="patch target folder", source=", ".join(
        r.patch.name for r in results if rel in r.new_texts)) / Path(rel).name for rel in final}
    for rel, text in final.items():
        try:
            compile(text, rel, "exec") if rel.endswith(".py") else None
        except (SyntaxError, ValueError) as err:
            raise CheckFailed(f"patched {rel} is not valid Python (line {getattr(err, 'lineno', '?')}: "
                              f"{getattr(err, 'msg', err)}); nothing was changed",
                              hint="fix the patch: its result must compile") from None
    originals: dict[Path, tuple[bytes, int]] = {}
    try:
        for rel, text in final.items():
            target = targets[rel]
            try:
                originals[target] = (target.read_bytes(), target.stat().st_mode & 0o7777)
            except OSError as err:
                raise os_error(err, target, "read the engine file") from None
            atomic_write_text(target, text, mode=originals[target][1])
            _refresh_bytecode(target)
    except BaseException:  # Ctrl-C included: put every file back as it was
        for target, (data, mode) in originals.items():
            atomic_write_bytes(target, data, mode=mode)
            _refresh_bytecode(target)
        raise
    for r in results:
        log(f"  {r.patch.name}: {'applied' if r.state == 'applies' else r.state}")
    rec = verify_series(stack, site_packages, python=python, run_probes=run_probes, patches=patches, version=version,
                        states={r.patch.name: r.state for r in results})
    if record:
        atomic_write_json(Path(record), rec, sort_keys=True)
    if not rec["ok"]:
        raise CheckFailed("patches were written but a probe failed:\n  " + "\n  ".join(rec["failures"]),
                          hint="fail the image build; the probe says which change did not take effect")
    return rec


def _refresh_bytecode(source: Path) -> None:
    # Stale .pyc next to a rewritten module could be used instead of it (unchecked-hash pycs).
    cache = source.parent / "__pycache__"
    try:
        for pyc in cache.glob(glob.escape(source.stem) + ".*.pyc") if cache.is_dir() else []:
            pyc.unlink()
        if source.suffix == ".py":
            py_compile.compile(str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    except py_compile.PyCompileError as err:
        raise CheckFailed(f"{source} does not compile after patching: {err.msg.strip().splitlines()[-1]}",
                          hint="fix the patch: its result must compile") from None
    except OSError as err:
        raise os_error(err, cache, "refresh the bytecode of") from None


def verify_series(stack: Stack, site_packages: Path, python: str | None = None, run_probes: bool = True,
                  patches: list[Patch] | None = None, version: str | None = None, states: dict | None = None) -> dict:
    """Run every patch's probes against the installed engine; a record of what holds."""
    patches = patches if patches is not None else load_series(stack)
    version = version or installed_version(site_packages, stack.engine["package"]) or "?"
    tree = DirTree(site_packages)
    entries, failures = [], []
    runtime_all: list[dict] = []
    if run_probes:
        archs = sorted({a for p in patches for probe in p.runtime_probes for a in probe[1:]})
        runtime_all = []
        if archs:
            res = eagle3_probe(stack.engine["name"], archs, python=python, site_packages=site_packages)
            runtime_all = [dict(probe=f"eagle3-supported {a}", passed=bool(res[a].get("resolved") and res[a].get("eagle3")),
                                reason=res[a].get("reason", "")) for a in archs]
    for p in patches:
        probes = run_static_probes(p, tree)
        wanted = {f"eagle3-supported {a}" for probe in p.runtime_probes for a in probe[1:]}
        probes += [r for r in runtime_all if r["probe"] in wanted]
        for pr in probes:
            if not pr["passed"]:
                failures.append(f"{p.name}: probe '{pr['probe']}' failed: {pr['reason']}")
        state = (states or {}).get(p.name)
        entries.append({"patch": p.name, "sha256": p.sha256, "title": p.title, "versions": p.versions,
                        "upstream": p.upstream, "state": {"applies": "applied"}.get(state, state),
                        "probes": probes, "ok": all(pr["passed"] for pr in probes)})
    label = series_label(patches)
    return {"schema": RECORD_SCHEMA, "stack": stack.name, "engine": {"name": stack.engine["name"],
            "package": stack.engine["package"], "version": version}, "site_packages": str(site_packages),
            "patches": entries, "label": label, "ok": not failures, "failures": failures}


def series_label(patches: list[Patch]) -> str:
    """Value of the image label org.speclock.patches: each patch file and its sha256 prefix, in order."""
    return ",".join(f"{p.name}@{p.sha256[:12]}" for p in patches) or "none"


def write_json_atomic(path: Path, data: dict) -> None:
    """Kept for callers of the old name: speclock.files.atomic_write_json (fsynced, temp removed on failure)."""
    atomic_write_json(Path(path), data, sort_keys=True)


# ---------------------------------------------------------------- CLI

def _print_check(results: list[PatchResult], version: str, where: str) -> None:
    print(f"patch series against {where} ({version}):")
    for r in results:
        rng = "" if r.in_range else f"  [Versions '{r.patch.versions}' excludes {version}]"
        print(f"  {r.patch.name:52} {r.state.upper():16}{rng}")
        print("      " + r.reason.replace("\n", "\n      "))
        if r.state == "upstream":
            print(f"      retirable: remove it from the series for {version} and later")


def _cmd_check(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    patches = load_series(stack)
    if not patches:
        print(f"stack {stack.name} has no patches")
        return 0
    if args.site_packages:
        tree: SourceTree = DirTree(Path(args.site_packages))
        version = engine_version_in(Path(args.site_packages), stack.engine["package"])
    else:
        version = args.engine_version or stack.engine["version"]
        try:
            version_key(version)
        except ValueError:
            raise BadInput(f"{stack.path}: key 'engine.version': {version!r} is not a version", hint="e.g. 0.33.0") from None
        tree = WheelTree(fetch_wheel(stack.engine["package"], version, log=lambda m: print(m, file=sys.stderr)))
    results = check_series(patches, tree, version)
    if args.json:
        print(json.dumps({"stack": stack.name, "engine_version": version, "source": tree.label,
                          "patches": [r.as_json() for r in results]}, indent=2))
    else:
        _print_check(results, version, tree.label)
    return 1 if any(r.state == "conflict" for r in results) else 0


def _cmd_apply(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    if args.record:
        _check_output_path(Path(args.record), "--record")
    site = Path(args.site_packages) if args.site_packages else default_site_packages(args.python)
    print(f"applying {len(stack.patch_series)} patch(es) of stack {stack.name} to {site}")
    rec = apply_series(stack, site, python=args.python, record=Path(args.record) if args.record else None,
                       run_probes=not args.no_runtime_probes)
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        for e in rec["patches"]:
            for pr in e["probes"]:
                print(f"  {e['patch']}: probe {pr['probe']}: {'pass' if pr['passed'] else 'FAIL'} ({pr['reason']})")
        print(f"label org.speclock.patches={rec['label']}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    stack = load_stack(args.stack)
    site = Path(args.site_packages) if args.site_packages else default_site_packages(args.python)
    if not site.is_dir():
        raise BadInput(f"--site-packages {site} is not a directory", hint="give the engine's site-packages folder")
    rec = verify_series(stack, site, python=args.python, run_probes=not args.no_runtime_probes)
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        for e in rec["patches"]:
            for pr in e["probes"]:
                print(f"{'PASS' if pr['passed'] else 'FAIL'}  {e['patch']}: {pr['probe']}: {pr['reason']}")
    if not rec["ok"]:
        raise CheckFailed(f"{len(rec['failures'])} patch probe(s) failed", hint="rebuild the image; a patch did not take effect")
    return 0


def _cmd_label(args: argparse.Namespace) -> int:
    print(series_label(load_series(load_stack(args.stack))))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("patches", help="check, apply and verify engine patch series",
                       description="Engine patch series: lifecycle check against any release, "
                                   "all-or-nothing apply at image build, probes that prove the effect.")
    ps = p.add_subparsers(dest="patches_command", metavar="ACTION", required=True)
    c = ps.add_parser("check", help="for each patch: applies / already-applied / upstream (retirable) / conflict",
                      description="Check the stack's series against an engine release: its wheel is downloaded "
                                  "into the cache (no install) unless --site-packages names an installed engine. "
                                  "Exit 1 when a patch conflicts.")
    c.add_argument("--stack", default="cpu-vllm")
    c.add_argument("--engine-version", type=version_arg, help="release to check against (default: the stack's pin)")
    c.add_argument("--site-packages", help="check an installed engine instead of a downloaded wheel")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_check)
    a = ps.add_parser("apply", help="apply the series to an installed engine (all or nothing) and verify it",
                      description="Apply at image build: checks versions and every hunk first, writes nothing "
                                  "unless all apply, then runs every probe. Exit 1 on conflict or failed probe, "
                                  "2 when a patch's Versions excludes the pinned engine.")
    a.add_argument("--stack", required=True)
    a.add_argument("--site-packages", help="engine site-packages (default: that of --python)")
    a.add_argument("--python", help="the engine's python, for runtime probes (default: this one)")
    a.add_argument("--record", help="write the JSON record of what was applied here")
    a.add_argument("--no-runtime-probes", action="store_true", help="only static probes (no engine import)")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=_cmd_apply)
    v = ps.add_parser("verify", help="run every patch's probes against an installed engine")
    v.add_argument("--stack", required=True)
    v.add_argument("--site-packages")
    v.add_argument("--python")
    v.add_argument("--no-runtime-probes", action="store_true")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=_cmd_verify)
    lb = ps.add_parser("label", help="print the org.speclock.patches image label value for a stack's series")
    lb.add_argument("--stack", required=True)
    lb.set_defaults(func=_cmd_label)


if __name__ == "__main__":  # image builds run `python -m speclock.patches patches apply ...` with few modules
    from speclock.cli import main

    raise SystemExit(main(modules=["speclock.patches"]))
