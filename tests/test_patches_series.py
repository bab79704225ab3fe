"""Patch files, the exact-context applier and the lifecycle on a small real package tree.

The engine here is a folder laid out like site-packages (a module and its dist-info), so the
whole path runs for real: header parsing, version ranges, apply with verification, the JSON
record, and nothing written when anything fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from speclock.core.errors import BadInput
from speclock.core.versions import in_range, parse_range
from speclock.patches.diff import apply_hunks, parse_patch
from speclock.patches.series import check_series
from speclock.patches.trees import DirTree, Overlay

SRC = Path(__file__).resolve().parents[1] / "src"

MODULE = textwrap.dedent('''\
    """A tiny engine module."""


    class Inner:
        def forward(self, x):
            return x


    class Outer:
        def forward(self, x):
            return self.inner.forward(x)


    SUPPORTED = ["llama", "qwen"]
    ''')

PATCH_OUTER = textwrap.dedent("""\
    speclock-patch: 1
    Title: Outer declares the feature
    Engine: vllm
    Versions: >=9.0, <10
    Why: the engine checks the outer class
     (continued on a second line)
    Upstream: https://example.invalid/issue/1
    Probe: class-has vllm/tiny.py Outer feature

    --- a/vllm/tiny.py
    +++ b/vllm/tiny.py
    @@ -9,5 +9,8 @@
     class Outer:
         def forward(self, x):
             return self.inner.forward(x)
    +
    +    def feature(self):
    +        return True
     
     
    """)

PATCH_LIST = textwrap.dedent("""\
    speclock-patch: 1
    Title: admit deepseek
    Engine: vllm
    Versions: >=9.0, <10
    Why: whitelist
    Probe: list-admits vllm/tiny.py SUPPORTED deepseek_v3

    --- a/vllm/tiny.py
    +++ b/vllm/tiny.py
    @@ -14,1 +14,1 @@
    -SUPPORTED = ["llama", "qwen"]
    +SUPPORTED = ["llama", "qwen", "deepseek"]
    """)


def make_engine(root: Path, version: str = "9.9.9", text: str = MODULE) -> Path:
    site = root / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "tiny.py").write_text(text)
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return site


def write_tiny_stack(root: Path, series: list[str], *, name: str = "tiny", version: str = "9.9.9") -> Path:
    """A minimal stack of the tiny engine with this patch series (the patch tests share it)."""
    stack = root / f"{name}.toml"
    stack.write_text(
        textwrap.dedent(f'''\
        schema = 1
        name = "{name}"
        [base]
        kind = "debian-rootfs"
        [python]
        version = "3.11"
        [torch]
        version = "2.13.0+cpu"
        [engine]
        name = "vllm"
        package = "vllm"
        version = "{version}"
        [patches]
        series = {json.dumps(series, ensure_ascii=False)}
        [target]
        name = "t"
        path = "t"
        [draft]
        path = "d"
        '''),
        encoding="utf-8",
    )
    return stack


def make_series(root: Path, patches: dict[str, str]) -> tuple[Path, Path]:
    pdir = root / "patches" / "vllm"
    pdir.mkdir(parents=True)
    for name, text in patches.items():
        (pdir / name).write_text(text)
    return root / "patches", write_tiny_stack(root, list(patches))


def speclock(*args: str, patches_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), SPECLOCK_PATCHES_DIR=str(patches_dir))
    return subprocess.run([sys.executable, "-m", "speclock", *args], capture_output=True, text=True, env=env)


# ---------------------------------------------------------------- format


def test_header_fields_are_parsed_with_continuation_lines(tmp_path):
    (tmp_path / "p.patch").write_text(PATCH_OUTER)
    p = parse_patch(tmp_path / "p.patch")
    assert p.title == "Outer declares the feature"
    assert p.why == "the engine checks the outer class (continued on a second line)"
    assert p.version_clauses == [(">=", "9.0"), ("<", "10")]
    assert p.probes == [["class-has", "vllm/tiny.py", "Outer", "feature"]]
    assert [f.path for f in p.files] == ["vllm/tiny.py"] and len(p.files[0].hunks) == 1


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.replace("speclock-patch: 1\n", ""), "first line must be"),
        (lambda t: t.replace("Why: the engine checks the outer class\n (continued on a second line)\n", ""), "'Why:' is missing"),
        (lambda t: t.replace("Probe: class-has vllm/tiny.py Outer feature\n", ""), "'Probe:' is missing"),
        (lambda t: t.replace("Probe: class-has", "Probe: grep-for"), "unknown probe kind"),
        (lambda t: t.replace("Versions: >=9.0, <10", "Versions: 9.0"), "no comparison operator"),
        (lambda t: t.replace("Versions: >=9.0, <10", "Versions: >=nine"), "is not a version"),
        (lambda t: t.replace("Title:", "Titel:"), "malformed patch header line"),
        (lambda t: t.replace("@@ -9,5 +9,8 @@", "@@ -9,5 +9,9 @@"), "lines, header says"),
    ],
)
def test_malformed_patch_is_bad_input_naming_the_file(tmp_path, mutate, message):
    path = tmp_path / "bad.patch"
    path.write_text(mutate(PATCH_OUTER))
    with pytest.raises(BadInput) as err:
        parse_patch(path)
    assert message in str(err.value) and "bad.patch" in str(err.value)


def test_version_ranges_order_releases_like_pep440():
    r = parse_range(">=0.17.0, <0.18.0")
    assert in_range("0.17.0", r) and in_range("0.17.1", r)
    assert not in_range("0.18.0", r) and not in_range("0.16.9", r) and not in_range("0.18.0rc1", parse_range(">=0.18.0"))
    assert in_range("0.17.1+cu129", r)


# ---------------------------------------------------------------- applier


def test_hunk_applies_at_an_offset_but_never_with_changed_context(tmp_path):
    (tmp_path / "p.patch").write_text(PATCH_OUTER)
    diff = parse_patch(tmp_path / "p.patch").files[0]
    shifted = "# one\n# two\n" + MODULE
    new, fail = apply_hunks(shifted, diff)
    assert fail is None and "def feature" in new and new.startswith("# one\n")
    changed = MODULE.replace("return self.inner.forward(x)", "return self.inner(x)")
    new, fail = apply_hunks(changed, diff)
    assert new is None
    assert fail.file == "vllm/tiny.py" and fail.hunk_index == 1
    assert fail.first_mismatch.strip() == "return self.inner.forward(x)"
    assert any("return self.inner(x)" in line for line in fail.upstream_excerpt)


def test_series_states_applies_already_applied_upstream_conflict(tmp_path):
    (tmp_path / "a.patch").write_text(PATCH_OUTER)
    (tmp_path / "b.patch").write_text(PATCH_LIST)
    series = [parse_patch(tmp_path / "a.patch"), parse_patch(tmp_path / "b.patch")]
    fresh = make_engine(tmp_path / "fresh")
    res = check_series(series, DirTree(fresh), "9.9.9")
    assert [r.state for r in res] == ["applies", "applies"]
    # The same series on its own result: already applied, verbatim.
    patched = Overlay(DirTree(fresh))
    for r in res:
        patched.changes.update(r.new_texts)
    assert [r.state for r in check_series(series, patched, "9.9.9")] == ["already-applied", "already-applied"]
    # Upstream rewrote the code but has the change: skipped and retirable.
    upstream = MODULE.replace("class Outer:\n", "class Outer:\n    feature = True\n\n").replace(
        'SUPPORTED = ["llama", "qwen"]', "SUPPORTED_MODELS = None"
    )
    res = check_series(series, DirTree(make_engine(tmp_path / "up", text=upstream)), "10.1")
    assert [r.state for r in res] == ["upstream", "upstream"]
    assert not res[0].in_range and res[0].as_json()["retirable"]
    # Upstream rewrote the code and does not have the change: a conflict naming file, hunk, code.
    other = MODULE.replace("return self.inner.forward(x)", "return self.inner(x)")
    res = check_series(series, DirTree(make_engine(tmp_path / "other", text=other)), "9.9.9")
    assert res[0].state == "conflict" and "vllm/tiny.py hunk 1" in res[0].reason and "return self.inner(x)" in res[0].reason
    assert res[1].state == "applies"


# ---------------------------------------------------------------- apply at build (CLI)


def test_apply_writes_all_verifies_and_records(tmp_path):
    site = make_engine(tmp_path)
    pdir, stack = make_series(tmp_path, {"0001-outer.patch": PATCH_OUTER, "0002-list.patch": PATCH_LIST})
    record = tmp_path / "applied.json"
    proc = speclock(
        "patches", "apply", "--stack", str(stack), "--site-packages", str(site), "--record", str(record), patches_dir=pdir
    )
    assert proc.returncode == 0, proc.stderr
    text = (site / "vllm" / "tiny.py").read_text()
    assert "def feature" in text and '"deepseek"' in text
    rec = json.loads(record.read_text())
    assert rec["ok"] and [p["state"] for p in rec["patches"]] == ["applied", "applied"]
    assert rec["label"].startswith("0001-outer.patch@")
    label = speclock("patches", "label", "--stack", str(stack), patches_dir=pdir)
    # the build can set the label before the layer runs: `label` prints the image's key=value
    assert label.stdout.strip() == f"io.speclock.patches={rec['label']}"
    assert all(pr["passed"] for p in rec["patches"] for pr in p["probes"])
    # verify passes on the patched tree, and check reports it as already applied
    assert speclock("patches", "verify", "--stack", str(stack), "--site-packages", str(site), patches_dir=pdir).returncode == 0
    again = speclock("patches", "check", "--stack", str(stack), "--site-packages", str(site), "--json", patches_dir=pdir)
    assert [p["state"] for p in json.loads(again.stdout)["patches"]] == ["already-applied", "already-applied"]


def test_apply_changes_nothing_when_one_patch_conflicts(tmp_path):
    other = MODULE.replace('SUPPORTED = ["llama", "qwen"]', 'SUPPORTED = ["llama"]')
    site = make_engine(tmp_path, text=other)
    before = (site / "vllm" / "tiny.py").read_bytes()
    pdir, stack = make_series(tmp_path, {"0001-outer.patch": PATCH_OUTER, "0002-list.patch": PATCH_LIST})
    proc = speclock("patches", "apply", "--stack", str(stack), "--site-packages", str(site), patches_dir=pdir)
    assert proc.returncode == 1
    assert "0002-list.patch" in proc.stderr and "nothing was changed" in proc.stderr
    assert (site / "vllm" / "tiny.py").read_bytes() == before  # 0001 applied cleanly but was not written


def test_apply_refuses_a_range_that_excludes_the_pinned_engine(tmp_path):
    site = make_engine(tmp_path)
    pdir, stack = make_series(tmp_path, {"0001-outer.patch": PATCH_OUTER.replace(">=9.0, <10", ">=10.0")})
    proc = speclock("patches", "apply", "--stack", str(stack), "--site-packages", str(site), patches_dir=pdir)
    assert proc.returncode == 2
    assert "excludes the pinned vllm 9.9.9" in proc.stderr
    assert "def feature" not in (site / "vllm" / "tiny.py").read_text()


def test_apply_with_malformed_header_is_exit_2(tmp_path):
    site = make_engine(tmp_path)
    pdir, stack = make_series(tmp_path, {"0001-outer.patch": PATCH_OUTER.replace("Probe:", "Prob:")})
    proc = speclock("patches", "apply", "--stack", str(stack), "--site-packages", str(site), patches_dir=pdir)
    assert proc.returncode == 2 and "malformed patch header line" in proc.stderr


def test_failed_probe_after_apply_fails_the_build(tmp_path):
    site = make_engine(tmp_path)
    # The diff applies but the probe looks for something it does not add.
    pdir, stack = make_series(tmp_path, {"0001-outer.patch": PATCH_OUTER.replace("Outer feature", "Outer missing_thing")})
    record = tmp_path / "applied.json"
    proc = speclock(
        "patches", "apply", "--stack", str(stack), "--site-packages", str(site), "--record", str(record), patches_dir=pdir
    )
    assert proc.returncode == 1 and "probe failed" in proc.stderr and "missing_thing" in proc.stderr
    assert json.loads(record.read_text())["ok"] is False
