"""The warm path's remembered answers (#37) never stand in for a changed input: the staged files' digests (kept by
stat, build.digests), the lock check (kept by its key, build.lockcheck), buildah's version (kept by its binary's
stat), and the base image's import (only when a step builds on it). Fast: no builder runs."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from test_build_warm import EDITS, LABELS, record_for, staged

from speclock.build import digests, inputs, lockcheck, reuse, tail
from speclock.build.builders import buildah
from speclock.build.builders.buildah import labelled_containerfile
from speclock.core.errors import BadInput
from speclock.spec.lock import lock_path
from speclock.spec.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]


def same_size_same_mtime(path: Path, text: str) -> None:
    """Rewrite `path` with other bytes of the same length and put its mtime back: only ctime tells."""
    st = path.stat()
    old = path.read_text()
    assert len(text.encode()) == len(old.encode()) and text != old
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def memo(tmp_path, monkeypatch):
    """A build's memo, kept on disk, that remembers files hashed right after they were written (RACY_S 0)."""
    monkeypatch.setattr(digests, "RACY_S", 0.0)
    with digests.remembering(tmp_path / "memo.json") as kept:
        yield kept


@pytest.mark.parametrize("kind", list(EDITS))
def test_an_edit_behind_the_remembered_digest_still_changes_the_inputs_hash(kind, tmp_path, monkeypatch):
    """Each kind of staged input (source, patch, drafter, prompts, stack), rewritten to the same size with its mtime
    put back, between two builds that each load the memo from disk: the inputs hash changes, the record is refused."""
    monkeypatch.setattr(digests, "RACY_S", 0.0)
    ctx = staged(tmp_path / "ctx")
    lock = {"lock_sha256": "a" * 64}
    with digests.remembering(tmp_path / "memo.json"):
        before = record_for(ctx, lock)
    with digests.remembering(tmp_path / "memo.json") as kept:
        assert inputs.inputs_hash(ctx, lock) == before["inputs_sha256"] and kept.hashed == 0  # all remembered
    rel, _ = EDITS[kind]
    text = (ctx / rel).read_text()
    time.sleep(0.05)  # past the coarse clock's tick (RACY_S is off here): the rewrite gets another ctime
    same_size_same_mtime(ctx / rel, text[:-2] + ("x" if text[-2] != "x" else "y") + text[-1])
    with digests.remembering(tmp_path / "memo.json") as kept:
        now = inputs.inputs_hash(ctx, lock)
        assert kept.hashed == 1  # the edited file, and only it
    assert now != before["inputs_sha256"]
    assert reuse.mismatch(before, ref=before["ref"], inputs=now, version="1.39.3", labels=LABELS) == "other inputs"


def test_a_file_written_just_now_is_never_remembered(tmp_path):
    """The racily-clean guard: a stat younger than RACY_S may still take a second write within one clock tick."""
    f = tmp_path / "f"
    f.write_text("one")
    memo = digests.DigestMemo(tmp_path / "memo.json")
    memo.sha256(f)
    assert memo.known == {} and memo.hashed == 1
    memo.sha256(f)
    assert memo.hashed == 2


def test_a_replaced_file_or_a_damaged_memo_is_hashed_again(tmp_path, memo):
    f = tmp_path / "f"
    f.write_text("one")
    first = memo.sha256(f)
    assert memo.sha256(f) == first and memo.hashed == 1
    (tmp_path / "g").write_text("two")
    os.replace(tmp_path / "g", f)  # another inode
    assert memo.sha256(f) != first and memo.hashed == 2
    memo.save()
    (tmp_path / "memo.json").write_text("{not json")
    assert digests.DigestMemo(tmp_path / "memo.json").known == {}


def test_the_saved_memo_keeps_only_what_this_build_looked_up(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "RACY_S", 0.0)
    for name in "ab":
        (tmp_path / name).write_text(name)
    with digests.remembering(tmp_path / "memo.json") as kept:
        kept.sha256(tmp_path / "a")
        kept.sha256(tmp_path / "b")
    with digests.remembering(tmp_path / "memo.json") as kept:
        kept.sha256(tmp_path / "a")
    assert list(json.loads((tmp_path / "memo.json").read_text())) == [str(tmp_path / "a")]


# --- the lock check -------------------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path, monkeypatch, memo):
    """A lock and the stacks/ folder beside it, a private cache, and the checker's code in a copy of src/speclock."""
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    (tmp_path / "p" / "locks").mkdir(parents=True)
    shutil.copytree(ROOT / "stacks", tmp_path / "p" / "stacks")
    lock = tmp_path / "p" / "locks" / "cpu-vllm.lock"
    shutil.copy(lock_path(load_stack("cpu-vllm")), lock)
    src = tmp_path / "src" / "speclock"
    shutil.copytree(ROOT / "src" / "speclock", src, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(lockcheck, "SRC_ROOT", src)
    calls = []
    real = lockcheck.read_lock
    monkeypatch.setattr(lockcheck, "read_lock", lambda path: calls.append(path) or real(path))
    return lock, src, calls


def test_the_lock_check_is_remembered_only_while_nothing_it_reads_changed(project):
    lock, src, calls = project
    doc = lockcheck.read_lock_checked(lock)
    assert lockcheck.read_lock_checked(lock) == doc and len(calls) == 1  # the second read: from its last pass
    edits = {
        "the checker's code": lambda: (src / "spec" / "provenance.py").write_text(
            (src / "spec" / "provenance.py").read_text() + "# edited\n"
        ),
        "a module file more (the closure may change)": lambda: (src / "spec" / "new_rule.py").write_text("X = 1\n"),
        "speclock's version": lambda: (src / "__init__.py").write_text(
            (src / "__init__.py").read_text().replace('__version__ = "', '__version__ = "9')
        ),
        "a stack file that allows hosts": lambda: (lock.parent.parent / "stacks" / "cpu-vllm.toml").write_text(
            (lock.parent.parent / "stacks" / "cpu-vllm.toml").read_text() + "\n"
        ),
        "the lock's bytes": lambda: lock.write_text(lock.read_text() + "\n"),
    }
    for what, edit in edits.items():
        edit()
        assert lockcheck.read_lock_checked(lock) == doc, what
        assert len(calls) == 2, f"{what}: not checked again"
        assert lockcheck.read_lock_checked(lock) == doc and len(calls) == 2, f"{what}: the new pass is not remembered"
        calls.clear()
        calls.append(lock)


def test_a_lock_changed_after_a_pass_is_refused_as_read_lock_refuses_it(project):
    lock, _, calls = project
    lockcheck.read_lock_checked(lock)
    data = json.loads(lock.read_text())
    data["packages"][0]["url"] = "https://evil.example/" + data["packages"][0]["filename"]
    lock.write_text(json.dumps(data, indent=1, sort_keys=True))  # lock_sha256 no longer matches
    with pytest.raises(BadInput):
        lockcheck.read_lock_checked(lock)
    with pytest.raises(BadInput):  # a failed check is never remembered
        lockcheck.read_lock_checked(lock)


# --- buildah's version, the base image, the tail ----------------------------------------------------------


def fake_buildah(folder: Path, version: str) -> None:
    folder.mkdir(exist_ok=True)
    script = folder / "buildah"
    tmp = folder / ".buildah.new"  # installed as a package manager does: a new file renamed over the old
    tmp.write_text(f'#!/bin/sh\necho \'{{"version": "{version}"}}\'\necho "$@" >> {folder}/calls\n')
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR)
    os.replace(tmp, script)


def test_buildah_is_asked_its_version_again_when_its_binary_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    fake_buildah(tmp_path / "bin", "1.39.3")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert buildah.BUILDER.check_available() == "1.39.3"
    assert buildah.BUILDER.check_available() == "1.39.3"
    assert (tmp_path / "bin" / "calls").read_text().count("version") == 1  # the second answer: kept by the stat
    fake_buildah(tmp_path / "bin", "1.40.0")  # an upgrade
    assert buildah.BUILDER.check_available() == "1.40.0"
    assert (tmp_path / "bin" / "calls").read_text().count("version") == 2


class Store:
    """A builder whose store holds `present` refs; records what it is asked to build."""

    name = "buildah"

    def __init__(self, present: set[str]):
        self.present, self.built = present, []

    def image_exists(self, ref):
        return ref in self.present

    def build(self, **kw):
        self.built.append(kw)
        return "sha256:" + "1" * 64


@pytest.mark.parametrize("body_in_store", [True, False])
def test_the_base_is_imported_only_when_the_body_is_built(body_in_store, tmp_path):
    key = "k" * 64
    store = Store({f"localhost/speclock-cpu-vllm-body:{key[:16]}"} if body_in_store else set())
    ensured = []
    tail.build_in_two(
        store,
        body="FROM base AS runtime\n",
        key=key,
        stack_name="cpu-vllm",
        context=tmp_path,
        tag="localhost/speclock-cpu-vllm:t",
        build_args={},
        labels=LABELS,
        no_cache=False,
        timestamp=1,
        progress=lambda m: None,
        before_body=lambda: ensured.append(len(store.built)),
    )
    assert ensured == ([] if body_in_store else [0])  # before the body's build, and only for it
    assert len(store.built) == (1 if body_in_store else 2)
    last = store.built[-1]
    assert last["layers"] is False and last["labels"] == LABELS and last["tag"] == "localhost/speclock-cpu-vllm:t"


def test_a_one_commit_build_puts_the_labels_before_the_source_layer():
    """One commit gives its layer to the last history entry: that must stay the COPY, so the LABEL comes first."""
    text = labelled_containerfile(f"FROM a AS x\nRUN true\nFROM localhost/b:k\n{tail.TAIL}\n", LABELS, first=True)
    lines = [line for line in text.splitlines() if line and not line.startswith(("#", " "))]
    assert lines[:3] == ["FROM a AS x", "RUN true", "FROM localhost/b:k"] and lines[-1] == tail.TAIL
    assert lines[3].startswith("LABEL ") and all(f'"{k}"="{v}"' in text for k, v in LABELS.items())
    last = labelled_containerfile(f"FROM b\n{tail.TAIL}\n", LABELS)  # a layered build: the labels last, as before
    assert last.index(tail.TAIL) < last.index("LABEL ")


# --- the wheelhouse's paths -----------------------------------------------------------------------------------


def test_a_wheel_path_through_a_symbolic_link_out_of_its_folder_is_still_refused(tmp_path):
    """entry_path and link_into resolve a path only when a part of it is a link: one that leads out is refused."""
    from speclock.build import wheelhouse

    store, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    sha = "a" * 64
    pkg = {"name": "x", "sha256": sha, "filename": "x-1-py3-none-any.whl"}
    (store / sha).mkdir(parents=True)
    assert wheelhouse.entry_path(pkg, store) == store / sha / pkg["filename"]  # no link: not resolved
    (store / sha).rmdir()
    (store / sha).symlink_to(outside)
    with pytest.raises(BadInput, match="resolves outside"):
        wheelhouse.entry_path(pkg, store)
    (store / sha).unlink()
    (store / sha).mkdir()
    (store / sha / pkg["filename"]).symlink_to(outside / "w.whl")
    with pytest.raises(BadInput, match="resolves outside"):
        wheelhouse.entry_path(pkg, store)
