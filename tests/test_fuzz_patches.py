"""Property-based fuzz tests of the patch reader and of `speclock patches check`/`apply` (issue #15).

Inputs: random bytes; the committed patches mutated (a line deleted, duplicated or changed, hunk
header numbers changed, a random path in '+++', including ../ and absolute ones); random series
entries. The rule: exit 0, 1 (only for a real conflict) or 2, no traceback, a malformed patch is
never reported as applying, nothing is read outside the series and the engine tree, nothing is
written anywhere (check) or outside the engine tree (apply).

Offline: every engine is a folder laid out like site-packages, synthesized from the patches'
own hunks so that the unmutated patch applies exactly.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from fuzz_support import assert_clean_refusal, assert_nothing_written, run_cli, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_patches_integrity import GOOD, MODULE
from test_patches_series import write_tiny_stack

from speclock.core.errors import BadInput
from speclock.patches import diff as patch_diff
from speclock.patches import trees as patch_trees

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "patches" / "vllm").rglob("*.patch"))
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
_counter = itertools.count()


# ---------------------------------------------------------------- an oracle, independent of the reader

_HDR = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(?: .*)?")


def _bad_path(raw: str) -> bool:
    path = raw.split("\t")[0]
    path = path[2:] if path.startswith(("a/", "b/")) else path
    return path.startswith("/") or ".." in path.split("/") or path == ""


def structurally_malformed(text: str) -> bool:
    """True when the diff part cannot be read whole: what the reader must refuse (it may refuse more)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    starts = [n for n, line in enumerate(lines) if line.startswith(("--- ", "diff "))]
    if not starts:
        return True
    i, files, hunks = starts[0], 0, None
    while i < len(lines):
        line = lines[i]
        if line.startswith(("diff --git ", "index ")):
            if hunks == 0:
                return True
            i += 1
        elif line.startswith("--- "):
            if hunks == 0 or i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                return True
            if _bad_path(lines[i + 1][4:]):
                return True
            files, hunks, i = files + 1, 0, i + 2
        elif _HDR.fullmatch(line) and hunks is not None:
            m = _HDR.fullmatch(line)
            want_old = int(m[2]) if m[2] is not None else 1
            want_new = int(m[4]) if m[4] is not None else 1
            old = new = 0
            i += 1
            while old < want_old or new < want_new:
                if i >= len(lines):
                    return True
                body = lines[i]
                if body.startswith("\\"):
                    i += 1
                    continue
                tag = body[:1] or " "
                if tag not in " +-":
                    return True
                old += tag in " -"
                new += tag in " +"
                i += 1
            if old != want_old or new != want_new:
                return True
            if i < len(lines) and lines[i].startswith("\\"):
                i += 1
            hunks += 1
        elif line == "" and not any(lines[i:]):
            break
        else:
            return True
    return files == 0 or hunks == 0


# ---------------------------------------------------------------- engine trees where a patch applies


def synth_engine(root: Path, patch: patch_diff.Patch, version: str = "0.17.1") -> Path:
    """A site-packages tree whose files hold each hunk's old lines at the hunk's place."""
    site = root / "site-packages"
    for fd in patch.files:
        out: list[str] = []
        for hunk in fd.hunks:
            start = hunk.old_start - 1 if hunk.old else hunk.old_start
            while len(out) < start:
                out.append(f"# filler {len(out) + 1}")
            out.extend(hunk.old)
        out.append("# end")
        path = site / fd.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(out) + "\n")
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return site


def write_stack(root: Path, series: list[str], version: str = "0.17.1") -> Path:
    return write_tiny_stack(root, series, name="fz", version=version)


def fresh(tmp_path: Path) -> Path:
    root = tmp_path / f"ex{next(_counter)}"
    (root / "patches" / "vllm").mkdir(parents=True)
    return root


def speclock_env(root: Path) -> dict:
    return {
        "SPECLOCK_PATCHES_DIR": str(root / "patches"),
        "SPECLOCK_CACHE": str(root / "cache"),
        "SPECLOCK_INDEX_URL": "http://127.0.0.1:9/simple",
    }


# ---------------------------------------------------------------- strategies

PATHS = st.one_of(
    st.sampled_from(
        [
            "b/../../etc/passwd",
            "/etc/passwd",
            "b//etc/x",
            "b/vllm/../../../x.py",
            "../x.py",
            "b/",
            "b/./vllm/x.py",
            "C:/x.py",
            "b/vllm/x y.py",
            "b/vllm\\..\\x.py",
            "/dev/null",
            "b/vllm/ok.py",
        ]
    ),
    st.text(alphabet="ab/.\\-_ \t", max_size=20).map(lambda s: "b/" + s),
    st.text(max_size=20),
)


@st.composite
def mutated_patch(draw) -> tuple[str, str, str]:
    """(name, original text, mutated text) of a committed patch."""
    src = draw(st.sampled_from(COMMITTED))
    original = src.read_text()
    lines = original.split("\n")
    first_diff = next(n for n, line in enumerate(lines) if line.startswith("--- "))
    kind = draw(st.sampled_from(["delete", "duplicate", "change", "hunk-header", "target", "tag"]))
    # Mostly the diff; sometimes the header too.
    idx = draw(st.one_of(st.integers(first_diff, len(lines) - 1), st.integers(0, len(lines) - 1)))
    if kind == "delete":
        del lines[idx]
    elif kind == "duplicate":
        lines.insert(idx, lines[idx])
    elif kind == "change":
        lines[idx] = draw(st.text(max_size=40))
    elif kind == "tag":
        lines[idx] = draw(st.sampled_from([" ", "+", "-", "@", "\\", "x", "", "\t", "#"])) + lines[idx][1:]
    elif kind == "hunk-header":
        headers = [n for n, line in enumerate(lines) if line.startswith("@@")]
        n = draw(st.sampled_from(headers))
        nums = [draw(st.integers(0, 400)) for _ in range(4)]
        fmt = draw(
            st.sampled_from(
                [
                    "@@ -{0},{1} +{2},{3} @@",
                    "@@ -{0} +{2},{3} @@",
                    "@@ -{0},{1} +{2} @@",
                    "@@ -{0},{1} +{2},{3}",
                    "@@ -{0},{1} +{2},{3} @@@",
                    "@@ -{0},{1} {2},{3} @@",
                ]
            )
        )
        lines[n] = fmt.format(*nums)
    else:
        targets = [n for n, line in enumerate(lines) if line.startswith("+++ ")]
        lines[draw(st.sampled_from(targets))] = "+++ " + draw(PATHS)
    return src.name, original, "\n".join(lines)


# ---------------------------------------------------------------- the reader alone

LINE_POOL = [
    " ctx",
    "+add",
    "-del",
    "",
    "@@ -1,1 +1,1 @@",
    "@@ -1,2 +1,2 @@",
    "@@ -1 +1 @@",
    "@@ -1,0 +1,1 @@",
    "--- a/vllm/x.py",
    "+++ b/vllm/x.py",
    "+++ b/../x.py",
    "\\ No newline at end of file",
    "garbage",
    "diff --git a/vllm/x.py b/vllm/x.py",
    "index 123..456 100644",
    "@@ broken @@",
    "+++ /abs.py",
]
HEADER = "speclock-patch: 1\nTitle: t\nEngine: vllm\nVersions: >=0.1\nWhy: w\nProbe: class-has vllm/x.py A b\n\n"


@FUZZ
@given(body=st.lists(st.sampled_from(LINE_POOL), max_size=14), tail=st.sampled_from(["", "\n"]))
def test_the_reader_accepts_only_whole_diffs(tmp_path, body, tail):
    text = HEADER + "\n".join(body) + tail
    path = fresh(tmp_path) / "p.patch"
    path.write_text(text)
    try:
        patch = patch_diff.parse_patch(path)
    except BadInput as err:
        assert str(path) in str(err) and re.search(rf"{re.escape(str(path))}:\d+: ", str(err)), str(err)
        return
    assert not structurally_malformed(text), text
    for fd in patch.files:
        assert fd.hunks and patch_diff.bad_rel_path(fd.path) is None
        for hunk in fd.hunks:  # every hunk holds exactly the lines its header counts
            m = _HDR.fullmatch(hunk.header)
            assert len(hunk.old) == (int(m[2]) if m[2] is not None else 1)
            assert len(hunk.new) == (int(m[4]) if m[4] is not None else 1)


@FUZZ
@given(data=st.binary(max_size=300), with_header=st.booleans())
def test_random_bytes_as_a_patch_are_refused_cleanly(tmp_path, data, with_header):
    root = fresh(tmp_path)
    (root / "patches" / "vllm" / "0001-r.patch").write_bytes((HEADER.encode() if with_header else b"") + data)
    stack = write_stack(root, ["0001-r.patch"])
    site = synth_engine(root, patch_diff.parse_patch(COMMITTED[0]))
    before = snapshot(root)
    code, out, err = run_cli("patches", "check", "--stack", str(stack), "--site-packages", str(site), env=speclock_env(root))
    assert_clean_refusal(code, err, allowed=(0, 1, 2), names="0001-r.patch" if code == 2 else None)
    if code != 2:  # only a patch the reader understood whole may be judged
        patch_diff.parse_patch(root / "patches" / "vllm" / "0001-r.patch")
    assert_nothing_written(before, snapshot(root))


# ---------------------------------------------------------------- check on mutated committed patches


@FUZZ
@given(case=mutated_patch())
def test_check_never_says_a_malformed_patch_applies(tmp_path, case):
    name, original, text = case
    root = fresh(tmp_path)
    path = root / "patches" / "vllm" / name
    path.write_text(text, encoding="utf-8")
    stack = write_stack(root, [name])
    site = synth_engine(
        root,
        patch_diff.parse_patch(ROOT / "patches" / "vllm" / name)
        if (ROOT / "patches" / "vllm" / name).exists()
        else patch_diff.parse_patch(next(p for p in COMMITTED if p.name == name)),
    )
    before = snapshot(root)
    code, out, err = run_cli(
        "patches", "check", "--stack", str(stack), "--site-packages", str(site), "--json", env=speclock_env(root)
    )
    assert_clean_refusal(code, err, allowed=(0, 1, 2), names=name if code == 2 else None)
    if structurally_malformed(text):
        assert code == 2, f"a malformed patch was judged (exit {code}):\n{text}\n{out}"
    if code == 2:
        assert "APPLIES" not in out and not out.strip()
    else:
        patch_diff.parse_patch(path)  # judged only when read whole
        states = [p["state"] for p in json.loads(out)["patches"]]
        assert (code == 1) == ("conflict" in states), (code, states)
    if text == original:
        assert code == 0
    assert_nothing_written(before, snapshot(root))


# ---------------------------------------------------------------- apply on a mutated small patch


@st.composite
def mutated_small(draw) -> str:
    lines = GOOD.split("\n")
    first_diff = lines.index("--- a/vllm/tiny.py")
    kind = draw(st.sampled_from(["delete", "duplicate", "change", "target", "none"]))
    idx = draw(st.integers(first_diff, len(lines) - 1))
    if kind == "delete":
        del lines[idx]
    elif kind == "duplicate":
        lines.insert(idx, lines[idx])
    elif kind == "change":
        lines[idx] = draw(st.text(max_size=30))
    elif kind == "target":
        lines[first_diff + 1] = "+++ " + draw(PATHS)
    return "\n".join(lines)


@FUZZ
@given(text=mutated_small())
def test_apply_writes_only_inside_the_engine_tree_and_nothing_when_refused(tmp_path, text):
    root = fresh(tmp_path)
    (root / "patches" / "vllm" / "0001-outer.patch").write_text(text, encoding="utf-8")
    stack = write_stack(root, ["0001-outer.patch"], version="9.9.9")
    site = root / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "tiny.py").write_text(MODULE)
    (site / "vllm-9.9.9.dist-info").mkdir()
    (site / "vllm-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    before = snapshot(root)
    code, out, err = run_cli(
        "patches", "apply", "--stack", str(stack), "--site-packages", str(site), "--no-runtime-probes", env=speclock_env(root)
    )
    assert_clean_refusal(code, err, allowed=(0, 1, 2), names="0001-outer.patch" if code == 2 else None)
    if structurally_malformed(text):
        assert code == 2
    if code == 0:
        assert_nothing_written(before, snapshot(root), except_under=(site / "vllm",))
    else:  # refused, a conflict, or a result that does not compile: every file as it was
        after = snapshot(root)
        assert {k: v for k, v in after.items() if "__pycache__" not in k} == before or code == 1 and "probe" in err
        assert (site / "vllm" / "tiny.py").read_text() == MODULE or code == 1 and "probe" in err


# ---------------------------------------------------------------- random series entries

ENTRIES = st.one_of(
    st.sampled_from(
        [
            "0001-outer.patch",
            "../0001-outer.patch",
            "../../fz.toml",
            "/etc/passwd",
            "faults/../0001-outer.patch",
            ".",
            "..",
            "",
            "./0001-outer.patch",
            "0001-outer.patch/",
            "vllm/0001-outer.patch",
            "faults/x.patch",
            "link.patch",
            "0001-outer.patch\x00",
            "a\\b",
        ]
    ),
    st.text(max_size=25),
    st.lists(st.sampled_from(["..", ".", "faults", "0001-outer.patch", "", "/"]), max_size=4).map("/".join),
)


@FUZZ
@given(entry=ENTRIES)
def test_random_series_entries_never_leave_the_series_folder(tmp_path, monkeypatch, entry):
    root = fresh(tmp_path)
    series = root / "patches" / "vllm"
    (series / "0001-outer.patch").write_text(GOOD)
    (series / "faults").mkdir()
    (root / "patches" / "0001-outer.patch").write_text(GOOD)  # one level up: must never be read
    (series / "link.patch").symlink_to(root / "patches" / "0001-outer.patch")
    stack = write_stack(root, [entry], version="9.9.9")
    site = root / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "tiny.py").write_text(MODULE)
    (site / "vllm-9.9.9.dist-info").mkdir()
    (site / "vllm-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    read: list[Path] = []
    real = patch_diff.read_text
    for module in (patch_diff, patch_trees):  # the package's file readers: patch files and engine sources
        monkeypatch.setattr(module, "read_text", lambda path, **kw: (read.append(Path(path)), real(path, **kw))[1])
    before = snapshot(root)
    code, out, err = run_cli("patches", "check", "--stack", str(stack), "--site-packages", str(site), env=speclock_env(root))
    assert_clean_refusal(code, err, allowed=(0, 2))
    for path in read:
        real_path = path.resolve()
        assert series.resolve() in real_path.parents or site.resolve() in real_path.parents, f"read {path}"
    if code == 0:
        assert entry == "0001-outer.patch"
    elif "patches.series" not in err:  # refused by the stack reader (e.g. a NUL in TOML) or as a missing file
        assert "fz.toml" in err or "patches/vllm" in err, err
    assert_nothing_written(before, snapshot(root))
