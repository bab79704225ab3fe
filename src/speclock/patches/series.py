"""A stack's patch series: load, check against a release, apply all or nothing, verify, label the image.

The series is read from patches/<engine>/ only (each entry confined there before anything is read).

Lifecycle of a patch against a given engine release (`speclock patches check`):
  applies          every hunk matches exactly (context lines included)
  already-applied  the patch's result is already there verbatim (a patched tree)
  upstream         the hunks no longer match but the static probes already pass: the engine has
                   the change; the patch is skipped and reported as retirable
  conflict         neither; the report names the file, the hunk and the code now there
"""

from __future__ import annotations

import glob
import py_compile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from speclock.core.errors import BadInput, CheckFailed
from speclock.core.files import atomic_write_bytes, atomic_write_json, atomic_write_text, confined, os_error
from speclock.core.heartbeat import Progress
from speclock.core.versions import in_range
from speclock.patches.diff import HunkFailure, Patch, apply_hunks, parse_patch
from speclock.patches.probes import ProbeResult, eagle3_probe, run_static_probes
from speclock.patches.trees import DirTree, Overlay, SourceTree, engine_version_in, installed_version
from speclock.spec.path_keys import lexical_problem, patches_root
from speclock.spec.stack import Stack

RECORD_SCHEMA = "speclock.patches/v1"
# The image label that names the series: build's LABEL_PREFIX ("io.speclock") + ".patches". It is spelled
# here because build imports patches, not the other way round.
LABEL_KEY = "io.speclock.patches"

# ---------------------------------------------------------------- lifecycle


class SeriesEntry(TypedDict):
    """One patch in an apply/verify record."""

    patch: str
    sha256: str
    title: str
    versions: str
    upstream: str
    state: str | None  # applied | already-applied | upstream; None when verify ran alone
    probes: list[ProbeResult]
    ok: bool


class EngineRef(TypedDict):
    name: str
    package: str
    version: str


class SeriesRecord(TypedDict):
    """The apply/verify record (`--record` writes it as JSON; schema RECORD_SCHEMA)."""

    schema: str
    stack: str
    engine: EngineRef
    site_packages: str
    patches: list[SeriesEntry]
    label: str
    ok: bool
    failures: list[str]


@dataclass
class PatchResult:
    patch: Patch
    state: str  # applies | already-applied | upstream | conflict
    in_range: bool
    reason: str
    failures: list[HunkFailure] = field(default_factory=list)
    probes_before: list[ProbeResult] = field(default_factory=list)
    new_texts: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:  # the check report's JSON, which upgrade/ passes on as an open document
        return {
            "patch": self.patch.name,
            "sha256": self.patch.sha256,
            "title": self.patch.title,
            "versions": self.patch.versions,
            "in_range": self.in_range,
            "state": self.state,
            "retirable": self.state == "upstream",
            "reason": self.reason,
            "upstream": self.patch.upstream,
            "conflicts": [
                dict(
                    file=f.file,
                    hunk=f.hunk_index,
                    header=f.header,
                    line=f.expected_line,
                    expected=f.first_mismatch,
                    upstream_code=f.upstream_excerpt,
                )
                for f in self.failures
            ],
            "probes_before": self.probes_before,
        }


def check_patch(patch: Patch, tree: Overlay, version: str) -> PatchResult:
    ok_range = in_range(version, patch.version_clauses)
    probes = run_static_probes(patch, tree)
    forward: dict[str, str] = {}
    failures: list[HunkFailure] = []
    missing = [f.path for f in patch.files if tree.read(f.path) is None]
    if missing:
        if probes and all(p["passed"] for p in probes):
            return PatchResult(
                patch,
                "upstream",
                ok_range,
                f"{missing[0]} is gone, and the change is already present: "
                + "; ".join(p["reason"] for p in probes)
                + " -> skip it; the patch is retirable",
                [],
                probes,
            )
        return PatchResult(patch, "conflict", ok_range, f"file {missing[0]} is not in this release", [], probes)
    reverse_ok = True
    for fd in patch.files:
        text = tree.read(fd.path)
        if text is None:  # not reached: a missing file returned above
            continue
        new, fail = apply_hunks(text, fd)  # (text, None) or (None, failure)
        if fail is not None:
            failures.append(fail)
        elif new is not None:
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
        return PatchResult(
            patch,
            "upstream",
            ok_range,
            "hunks no longer match, and the change is already present: "
            + "; ".join(p["reason"] for p in probes)
            + " -> skip it; the patch is retirable",
            failures,
            probes,
        )
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


# ---------------------------------------------------------------- the stack's series


def series_paths(stack: Stack, root: Path | None = None) -> list[Path]:
    """The files of the stack's patches.series, each confined to patches/<engine>/ (checked before any is read)."""
    base = (root or patches_root()) / stack.engine["name"]
    where = f"{stack.path}: key 'patches.series'"
    paths, seen = [], set()
    for name in stack.patch_series:
        # A plain file name, or plain names joined by '/' (patches/vllm/faults/... holds the example faults):
        # the stack reader's rule (spec.path_keys), again here for a series staged elsewhere (`root`).
        problem = lexical_problem(name, str(base)) if isinstance(name, str) else "is not a string"
        if problem:
            raise BadInput(
                f"{where}: entry {name!r} {problem}",
                hint=f"list a patch by its file name in {base} (e.g. '0001-fix.patch'), or by folder and file name "
                "below it (e.g. 'faults/0001-x.patch'): no '..', '.', '\\' or empty parts",
            )
        path = confined(base, name, what=f"entry {name!r} of patches.series", source=stack.path)
        if name in seen:
            raise BadInput(f"{where}: entry {name!r} is listed twice", hint="list each patch once")
        seen.add(name)
        paths.append(path)
    return paths


def load_series(stack: Stack, root: Path | None = None) -> list[Patch]:
    base = (root or patches_root()) / stack.engine["name"]
    out = []
    for name, path in zip(stack.patch_series, series_paths(stack, root), strict=True):  # one path per entry
        if not path.is_file():
            raise BadInput(
                f"{stack.path}: key 'patches.series': entry {name!r}: {path} "
                f"{'is not a file' if path.exists() else 'does not exist'}",
                hint=f"patches for {stack.engine['name']} live in {base}",
            )
        patch = parse_patch(path)
        if patch.engine != stack.engine["name"]:
            raise BadInput(
                f"{path}: Engine is {patch.engine!r}, stack {stack.name} uses {stack.engine['name']!r}",
                hint="list only patches for the stack's engine",
            )
        out.append(patch)
    return out


# ---------------------------------------------------------------- apply (image build)


def apply_series(
    stack: Stack,
    site_packages: Path,
    python: str | None = None,
    record: Path | None = None,
    run_probes: bool = True,
    log: Progress = print,
) -> SeriesRecord:
    """Apply the stack's series to an installed engine, all or nothing; verify; write a JSON record."""
    site_packages = Path(site_packages)
    patches = load_series(stack)
    dist = stack.engine["package"]
    version = engine_version_in(site_packages, dist)
    if version != stack.engine["version"]:
        raise BadInput(
            f"{site_packages} has {dist} {version}, stack {stack.name} pins {stack.engine['version']}",
            hint="install the pinned engine, or fix the stack",
        )
    for p in patches:
        if not in_range(version, p.version_clauses):
            raise BadInput(
                f"{p.path}: Versions '{p.versions}' excludes the pinned {dist} {version}",
                hint="drop the patch from the stack's [patches] series, or widen its range after checking "
                f"`speclock patches check --stack {stack.name}`",
            )
    results = check_series(patches, DirTree(site_packages), version)
    bad = [r for r in results if r.state == "conflict"]
    if bad:
        raise CheckFailed(
            "patch series does not apply; nothing was changed:\n  " + "\n  ".join(f"{r.patch.name}: {r.reason}" for r in bad),
            hint="refresh the patch against this release, or retire it if the change is upstream",
        )
    # Every new file content is computed; write them all, restoring originals if anything fails.
    final: dict[str, str] = {}
    for r in results:
        final.update(r.new_texts)
    # Every target's folder must resolve inside site-packages (no '..', no linked folder leading out) before any
    # write. The file itself may be a symbolic link (a linked copy of an engine tree): the atomic write replaces
    # the link with a new file and never writes through it.
    targets = {
        rel: confined(
            site_packages,
            str(Path(rel).parent),
            what="patch target folder",
            source=", ".join(r.patch.name for r in results if rel in r.new_texts),
        )
        / Path(rel).name
        for rel in final
    }
    for rel, text in final.items():
        try:
            compile(text, rel, "exec") if rel.endswith(".py") else None
        except (SyntaxError, ValueError) as err:
            raise CheckFailed(
                f"patched {rel} is not valid Python (line {getattr(err, 'lineno', '?')}: "
                f"{getattr(err, 'msg', err)}); nothing was changed",
                hint="fix the patch: its result must compile",
            ) from None
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
    rec = verify_series(
        stack,
        site_packages,
        python=python,
        run_probes=run_probes,
        patches=patches,
        version=version,
        states={r.patch.name: r.state for r in results},
    )
    if record:
        atomic_write_json(Path(record), rec, sort_keys=True)
    if not rec["ok"]:
        raise CheckFailed(
            "patches were written but a probe failed:\n  " + "\n  ".join(rec["failures"]),
            hint="fail the image build; the probe says which change did not take effect",
        )
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
        raise CheckFailed(
            f"{source} does not compile after patching: {err.msg.strip().splitlines()[-1]}",
            hint="fix the patch: its result must compile",
        ) from None
    except OSError as err:
        raise os_error(err, cache, "refresh the bytecode of") from None


def verify_series(
    stack: Stack,
    site_packages: Path,
    python: str | None = None,
    run_probes: bool = True,
    patches: list[Patch] | None = None,
    version: str | None = None,
    states: dict[str, str] | None = None,
) -> SeriesRecord:
    """Run every patch's probes against the installed engine; a record of what holds."""
    patches = patches if patches is not None else load_series(stack)
    version = version or installed_version(site_packages, stack.engine["package"]) or "?"
    tree = DirTree(site_packages)
    entries: list[SeriesEntry] = []
    failures: list[str] = []
    runtime_all: list[ProbeResult] = []
    if run_probes:
        archs = sorted({a for p in patches for probe in p.runtime_probes for a in probe[1:]})
        runtime_all = []
        if archs:
            res = eagle3_probe(stack.engine["name"], archs, python=python, site_packages=site_packages)
            runtime_all = [
                ProbeResult(
                    probe=f"eagle3-supported {a}",
                    passed=bool(res[a].get("resolved") and res[a].get("eagle3")),
                    reason=res[a].get("reason", ""),
                )
                for a in archs
            ]
    for p in patches:
        probes = run_static_probes(p, tree)
        wanted = {f"eagle3-supported {a}" for probe in p.runtime_probes for a in probe[1:]}
        probes += [r for r in runtime_all if r["probe"] in wanted]
        for pr in probes:
            if not pr["passed"]:
                failures.append(f"{p.name}: probe '{pr['probe']}' failed: {pr['reason']}")
        state = (states or {}).get(p.name)
        entries.append(
            {
                "patch": p.name,
                "sha256": p.sha256,
                "title": p.title,
                "versions": p.versions,
                "upstream": p.upstream,
                "state": "applied" if state == "applies" else state,
                "probes": probes,
                "ok": all(pr["passed"] for pr in probes),
            }
        )
    _, label = series_label(patches)
    return {
        "schema": RECORD_SCHEMA,
        "stack": stack.name,
        "engine": {"name": stack.engine["name"], "package": stack.engine["package"], "version": version},
        "site_packages": str(site_packages),
        "patches": entries,
        "label": label,
        "ok": not failures,
        "failures": failures,
    }


def series_label(patches: list[Patch]) -> tuple[str, str]:
    """The image label (key, value) for a series: `name@sha12` of each patch file in series order, joined
    by ','; "none" for an empty series. The build and `speclock patches label` both use this one answer."""
    return LABEL_KEY, ",".join(f"{p.name}@{p.sha256[:12]}" for p in patches) or "none"
