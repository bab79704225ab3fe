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
import hashlib
import json
import os
import py_compile
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from speclock.errors import BadInput, CheckFailed, EnvironmentProblem
from speclock.layout import IMAGE, cache_dir, in_image
from speclock.stack import REPO_ROOT, Stack, load_stack
from speclock.versions import in_range, parse_range, version_key

HEADER_MAGIC = "speclock-patch:"
REQUIRED_KEYS = ("title", "engine", "versions", "why", "probe")
KNOWN_KEYS = REQUIRED_KEYS + ("upstream",)
STATIC_PROBES = {"class-has": 3, "list-admits": 3}  # kind -> minimum number of arguments
RUNTIME_PROBES = {"eagle3-supported": 1}
RECORD_SCHEMA = "speclock.patches/v1"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


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


def _strip_prefix(path: str) -> str:
    path = path.split("\t")[0].strip()
    return path[2:] if path.startswith(("a/", "b/")) else path


def parse_patch(path: Path) -> Patch:
    """Read a patch file: header keys, then a unified diff. Raises BadInput naming file and line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BadInput(f"cannot read patch {path}: {err.strerror}", hint="check the [patches] series of the stack") from None
    text = data.decode("utf-8")
    lines = text.split("\n")

    def bad(lineno: int, problem: str, hint: str) -> BadInput:
        return BadInput(f"{path}:{lineno}: {problem}", hint=hint)

    if not lines or not lines[0].startswith(HEADER_MAGIC):
        raise bad(1, f"malformed patch header: the first line must be '{HEADER_MAGIC} 1'",
                  "start the file with the speclock header (see docs/patches.md)")
    if lines[0][len(HEADER_MAGIC):].strip() != "1":
        raise bad(1, f"unsupported header version {lines[0][len(HEADER_MAGIC):].strip()!r}", "use 'speclock-patch: 1'")
    header: dict[str, list[str]] = {}
    probes: list[tuple[int, list[str]]] = []
    i, last = 1, None
    while i < len(lines) and not lines[i].startswith(("--- ", "diff ")):
        line = lines[i]
        if not line.strip():
            last = None
        elif line[0] in " \t" and last:
            header[last][-1] += " " + line.strip()
        else:
            key, sep, value = line.partition(":")
            key = key.strip().lower()
            if not sep or key not in KNOWN_KEYS:
                raise bad(i + 1, f"malformed patch header line {line!r}",
                          f"header lines are 'Key: value' with Key one of {', '.join(k.title() for k in KNOWN_KEYS)}")
            header.setdefault(key, []).append(value.strip())
            if key == "probe":
                probes.append((i + 1, value.split()))
            last = key
        i += 1
    for key in REQUIRED_KEYS:
        if not header.get(key) or not header[key][0]:
            raise bad(1, f"malformed patch header: '{key.title()}:' is missing",
                      "every patch needs Title, Engine, Versions, Why and at least one Probe")
    for lineno, probe in probes:
        kind = probe[0] if probe else ""
        need = STATIC_PROBES.get(kind) or RUNTIME_PROBES.get(kind)
        if need is None:
            raise bad(lineno, f"unknown probe kind {kind!r}",
                      f"probes: {', '.join(list(STATIC_PROBES) + list(RUNTIME_PROBES))}")
        if len(probe) - 1 < need:
            raise bad(lineno, f"probe {kind} needs at least {need} arguments, got {len(probe) - 1}", "see docs/patches.md")
    clauses = parse_range(header["versions"][0], where=f"{path}: Versions")
    files = _parse_diff(lines, i, path)
    if not files:
        raise bad(i + 1, "no unified diff after the header", "append the output of `diff -u` (--- a/FILE, +++ b/FILE, @@ hunks)")
    return Patch(path=path, sha256=hashlib.sha256(data).hexdigest(), title=header["title"][0],
                 engine=header["engine"][0], versions=header["versions"][0], version_clauses=clauses,
                 why=header["why"][0], upstream=(header.get("upstream") or [""])[0],
                 probes=[p for _, p in probes], files=files)


def _parse_diff(lines: list[str], i: int, path: Path) -> list[FileDiff]:
    files: list[FileDiff] = []
    n = len(lines)
    while i < n:
        line = lines[i]
        if line.startswith("--- "):
            if i + 1 >= n or not lines[i + 1].startswith("+++ "):
                raise BadInput(f"{path}:{i + 1}: '---' line not followed by '+++'", hint="regenerate the diff with diff -u")
            target = _strip_prefix(lines[i + 1][4:])
            if target == "/dev/null" or ".." in Path(target).parts or target.startswith("/"):
                raise BadInput(f"{path}:{i + 2}: unsupported target {target!r}", hint="patches edit existing files inside site-packages")
            files.append(FileDiff(target, []))
            i += 2
            continue
        m = _HUNK.match(line)
        if m:
            if not files:
                raise BadInput(f"{path}:{i + 1}: hunk before any '---'/'+++' file header", hint="regenerate the diff with diff -u")
            old_len = int(m[2]) if m[2] is not None else 1
            new_len = int(m[4]) if m[4] is not None else 1
            hunk = Hunk(int(m[1]), int(m[3]), [], line)
            i += 1
            seen_old = seen_new = 0
            while i < n and (seen_old < old_len or seen_new < new_len):
                body = lines[i]
                if body.startswith("\\"):
                    i += 1
                    continue
                tag = body[:1] or " "  # an empty line in a diff is an empty context line
                if tag not in " -+":
                    raise BadInput(f"{path}:{i + 1}: hunk {hunk.header!r} ends early (expected {old_len} old / {new_len} new lines)",
                                   hint="the hunk line counts do not match its body; regenerate the diff")
                hunk.lines.append((tag, body[1:]))
                seen_old += tag in " -"
                seen_new += tag in " +"
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise BadInput(f"{path}: hunk {hunk.header!r} has {seen_old}/{seen_new} lines, header says {old_len}/{new_len}",
                               hint="regenerate the diff")
            files[-1].hunks.append(hunk)
            continue
        i += 1
    return files


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
        p = self.root / rel
        return p.read_text(encoding="utf-8") if p.is_file() else None


class WheelTree(SourceTree):
    def __init__(self, wheel: Path):
        self.zip = zipfile.ZipFile(wheel)
        self.names = set(self.zip.namelist())
        self.label = str(wheel)

    def read(self, rel: str) -> str | None:
        return self.zip.read(rel).decode("utf-8") if rel in self.names else None


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

def _class_node(source: str, cls: str) -> ast.ClassDef | None:
    for node in ast.walk(ast.parse(source)):
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
    if kind == "class-has":
        cls, wanted = args[1], args[2:]
        node = _class_node(source, cls)
        if node is None:
            return False, f"{rel} defines no class {cls}"
        missing = [w for w in wanted if w not in _names_of_class(node)]
        if missing:
            return False, f"{cls} in {rel} lacks {', '.join(missing)}"
        return True, f"{cls} in {rel} has {', '.join(wanted)}"
    if kind == "list-admits":
        var, values = args[1], args[2:]
        found = None
        for node in ast.walk(ast.parse(source)):
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
    return last_json(proc, f"importing {engine} in {python or sys.executable}")


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


def load_series(stack: Stack, root: Path | None = None) -> list[Patch]:
    base = (root or patches_root()) / stack.engine["name"]
    out = []
    for name in stack.patch_series:
        path = base / name
        if not path.is_file():
            raise BadInput(f"stack {stack.name}: [patches] series names {name}, but {path} does not exist",
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


def fetch_wheel(package: str, version: str, log=print) -> Path:
    """Download (once) the engine's wheel into the cache with pip, without its dependencies."""
    dest = cache_dir() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[-_.]+", "_", package).lower()
    for w in sorted(dest.glob("*.whl")):
        parts = w.name.split("-")
        if re.sub(r"[-_.]+", "_", parts[0]).lower() == stem and parts[1] == version:
            return w
    log(f"downloading {package}=={version} (no dependencies) into {dest}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"{package}=={version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        if "No matching distribution" in proc.stderr or "Could not find a version" in proc.stderr:
            raise BadInput(f"{package}=={version} is not a released version with a wheel: {tail}",
                           hint=f"list releases with: pip index versions {package}")
        raise EnvironmentProblem(f"pip download {package}=={version} failed: {tail}", hint="check network access to PyPI")
    return fetch_wheel(package, version, log)


def default_site_packages(python: str | None = None) -> Path:
    py = python or sys.executable
    out = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


# ---------------------------------------------------------------- apply (image build)

def apply_series(stack: Stack, site_packages: Path, python: str | None = None, record: Path | None = None,
                 run_probes: bool = True, log=print) -> dict:
    """Apply the stack's series to an installed engine, all or nothing; verify; write a JSON record."""
    site_packages = Path(site_packages)
    patches = load_series(stack)
    dist = stack.engine["package"]
    version = installed_version(site_packages, dist)
    if version is None:
        raise EnvironmentProblem(f"{dist} is not installed in {site_packages}", hint="apply patches after installing the engine")
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
    originals: dict[Path, bytes] = {}
    try:
        for rel, text in final.items():
            target = site_packages / rel
            originals[target] = target.read_bytes()
            tmp = target.with_name(target.name + ".speclock-tmp")
            tmp.write_text(text, encoding="utf-8")
            os.chmod(tmp, target.stat().st_mode & 0o7777)
            os.replace(tmp, target)
            _refresh_bytecode(target)
    except Exception:
        for target, data in originals.items():
            target.write_bytes(data)
            _refresh_bytecode(target)
        raise
    for r in results:
        log(f"  {r.patch.name}: {'applied' if r.state == 'applies' else r.state}")
    rec = verify_series(stack, site_packages, python=python, run_probes=run_probes, patches=patches, version=version,
                        states={r.patch.name: r.state for r in results})
    if record:
        write_json_atomic(Path(record), rec)
    if not rec["ok"]:
        raise CheckFailed("patches were written but a probe failed:\n  " + "\n  ".join(rec["failures"]),
                          hint="fail the image build; the probe says which change did not take effect")
    return rec


def _refresh_bytecode(source: Path) -> None:
    # Stale .pyc next to a rewritten module could be used instead of it (unchecked-hash pycs).
    cache = source.parent / "__pycache__"
    for pyc in cache.glob(source.stem + ".*.pyc") if cache.is_dir() else []:
        pyc.unlink()
    if source.suffix == ".py":
        py_compile.compile(str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)


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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


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
        version = installed_version(Path(args.site_packages), stack.engine["package"])
        if version is None:
            raise EnvironmentProblem(f"{stack.engine['package']} is not installed in {args.site_packages}")
    else:
        version = args.engine_version or stack.engine["version"]
        try:
            version_key(version)
        except ValueError:
            raise BadInput(f"--engine-version {version!r} is not a version", hint="e.g. 0.33.0") from None
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
    c.add_argument("--engine-version", help="release to check against (default: the stack's pin)")
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
