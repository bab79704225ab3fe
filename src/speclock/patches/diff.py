"""Patch files: read header and unified diff (refusing anything not understood whole), apply hunks exactly.

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
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from speclock.core.errors import BadInput
from speclock.core.files import read_text
from speclock.core.versions import parse_range

# bad(line number, problem, hint): the BadInput that names the patch file and line
_Bad = Callable[[int, str, str], BadInput]

HEADER_MAGIC = "speclock-patch:"
REQUIRED_KEYS = ("title", "engine", "versions", "why", "probe")
KNOWN_KEYS = REQUIRED_KEYS + ("upstream",)
STATIC_PROBES = {"class-has": 3, "list-admits": 3}  # kind -> minimum number of arguments
RUNTIME_PROBES = {"eagle3-supported": 1}


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
_UNSUPPORTED_GIT = (
    "new file mode",
    "deleted file mode",
    "old mode",
    "new mode",
    "similarity index",
    "rename from",
    "rename to",
    "copy from",
    "copy to",
    "Binary files",
    "GIT binary patch",
)


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
        raise bad(
            text.count("\n", 0, text.index("\r")) + 1,
            "carriage return in the patch (CRLF line endings)",
            "convert the patch to LF line endings (dos2unix), or " + _REGEN,
        )
    if not lines[0].startswith(HEADER_MAGIC):
        raise bad(
            1,
            f"malformed patch header: the first line must be '{HEADER_MAGIC} 1'",
            "start the file with the speclock header (see docs/patches.md)",
        )
    if lines[0][len(HEADER_MAGIC) :].strip() != "1":
        raise bad(1, f"unsupported header version {lines[0][len(HEADER_MAGIC) :].strip()!r}", "use 'speclock-patch: 1'")
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
                raise bad(
                    i + 1,
                    f"malformed patch header line {line!r}",
                    f"header lines are 'Key: value' with Key one of {', '.join(k.title() for k in KNOWN_KEYS)}",
                )
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
            raise bad(
                1,
                f"malformed patch header: '{key.title()}:' is missing",
                "every patch needs Title, Engine, Versions, Why and at least one Probe",
            )
    for lineno, probe in probes:
        _check_probe(probe, functools.partial(bad, lineno))
    clauses = parse_range(header["versions"][0], where=f"{path}:{key_line['versions']}: Versions")
    files = _parse_diff(lines, i, bad)
    return Patch(
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        title=header["title"][0],
        engine=header["engine"][0],
        versions=header["versions"][0],
        version_clauses=clauses,
        why=header["why"][0],
        upstream=(header.get("upstream") or [""])[0],
        probes=[p for _, p in probes],
        files=files,
    )


def _check_probe(probe: list[str], bad: Callable[[str, str], BadInput]) -> None:
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
            raise bad(
                f"Probe: {kind} FILE is {why}", "name a file inside the engine package, e.g. vllm/model_executor/models/x.py"
            )
        names = args[1:] if kind == "class-has" else args[1:2]  # list-admits VALUEs are free text
    else:
        names = args
    for name in names:
        if not _IDENT.fullmatch(name):
            raise bad(f"Probe: {kind} argument {name!r} is not a Python name", hint)


def _parse_diff(lines: list[str], i: int, bad: _Bad) -> list[FileDiff]:
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
            raise bad(
                i + 1,
                f"unsupported git diff line {line!r}: patches only edit text files that exist",
                "leave file creation, deletion, renames, mode changes and binary files out of the patch",
            )
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
            raise bad(i + 1, "blank line between hunks (a hunk's line counts are too small, or the patch was edited)", _REGEN)
        if line[0] in " +-":
            raise bad(i + 1, f"hunk line {line!r} outside any hunk: the previous hunk's line counts are too small", _REGEN)
        raise bad(
            i + 1, f"unexpected line {line!r} in the diff (trailing garbage?)", "a patch ends after its last hunk; " + _REGEN
        )
    close_file()
    if not files:
        raise bad(i + 1, "no unified diff after the header", "append the output of `diff -u` (--- a/FILE, +++ b/FILE, @@ hunks)")
    return files


def _parse_hunk(lines: list[str], i: int, n: int, m: re.Match[str], diff: FileDiff, bad: _Bad) -> int:
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
        return (
            f"hunk {hunk.header!r} (line {start + 1}) has {seen_old}/{seen_new} lines, header says {old_len}/{new_len} (old/new)"
        )

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
        return (
            f"{self.file} hunk {self.hunk_index} {self.header} does not match at line {self.expected_line}:\n"
            f"    patch expects: {self.first_mismatch!r}\n    upstream code there now:\n{lines}"
        )


def _find(lines: list[str], block: list[str], expected: int, lower: int) -> int | None:
    """Position of `block` in `lines` nearest to `expected`, at or after `lower` (exact match only)."""
    if not block:
        return max(lower, min(expected, len(lines)))
    n, m = len(lines), len(block)
    for delta in range(0, n + 1):
        for pos in (expected + delta, expected - delta) if delta else (expected,):
            if lower <= pos <= n - m and lines[pos : pos + m] == block:
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
            mismatch = next(
                (want for k, want in enumerate(old) if expected + k >= len(lines) or lines[expected + k] != want),
                old[0] if old else "",
            )
            excerpt = lines[expected : expected + max(len(old), 3) + 2]
            return None, HunkFailure(diff.path, idx, hunk.header, expected + 1, mismatch, excerpt)
        lines[pos : pos + len(old)] = new
        offset = pos - start + len(new) - len(old)
        lower = pos + len(new)
    out = "\n".join(lines)
    return (out + "\n" if ends_nl else out), None
