"""An upgrade's candidate lock keeps the current lock's versions wherever the candidate allows them: a patch-only
candidate moves no package although the index has released newer ones, an engine bump moves what the new engine
needs and nothing else, and the upgrade names what moved. Real pip resolution over tiny real wheels."""

from __future__ import annotations

from pathlib import Path

import pytest
from tinywheels import make_wheel, tiny_lock, tiny_wheels, write_stack

from speclock.core.errors import BadInput
from speclock.spec import resolve
from speclock.spec.lock import finish_lock, write_lock
from speclock.spec.stack import load_stack
from speclock.upgrade import candidate_lock
from speclock.upgrade.candidate import Candidate
from speclock.upgrade.candidate_lock import changes_text, lock_candidate, lock_changes


def quiet(*_):
    pass


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A local wheel folder as pip's only source (tinyengine 1.0 needs tinydep>=1, 1.2 there) and the tiny stack."""
    wheels = tmp_path / "wheels"
    tiny_wheels(wheels)
    for k, v in {"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(resolve, "_pypi_url", lambda entry: None)  # local wheels: no PyPI lookup
    return wheels, load_stack(write_stack(tmp_path, prompts=False))


def lock_of(stack, *, keep_from=None, progress=quiet) -> dict:
    """A lock document of the image target, resolved by pip (at the versions of `keep_from` where they fit)."""
    keep = resolve.kept_versions(stack, keep_from) if keep_from else None
    installed, excluded, assets = resolve._resolve_set(
        stack, python="3.11", platforms=resolve.platform_tags(stack), index=None, progress=progress, keep=keep
    )
    return tiny_lock(stack, python="3.11", packages=installed, excluded=excluded, assets=assets)


def with_engine(stack, version: str, folder: Path):
    """The tiny stack with another engine.version, written in `folder`."""
    path = folder / "stacks" / "tiny.toml"
    path.parent.mkdir(parents=True)
    path.write_text(stack.path.read_text().replace('version = "1.0"', f'version = "{version}"', 1))
    return load_stack(path)


def versions(doc) -> dict[str, str]:
    return {p["name"]: p["version"] for p in doc["packages"]}


def test_a_candidate_keeps_the_current_versions_the_index_has_moved_past(index):
    wheels, stack = index
    current = lock_of(stack)
    assert versions(current)["tinydep"] == "1.2"
    make_wheel(wheels, "tinydep", "1.5")  # released after the current lock
    assert versions(lock_of(stack))["tinydep"] == "1.5"  # a fresh resolve takes it
    kept = lock_of(stack, keep_from=current)
    assert versions(kept) == versions(current)
    assert lock_changes(current, kept) == [] and changes_text([]) == "no package changed against the current lock"


def test_an_engine_bump_moves_what_the_new_engine_needs_and_says_so(index, tmp_path):
    wheels, stack = index
    current = lock_of(stack)
    make_wheel(wheels, "tinydep", "2.0")
    make_wheel(wheels, "tinyengine", "2.0", tag="cp311-cp311-manylinux_2_17_x86_64", requires=("tinydep>=2",))
    bumped = with_engine(stack, "2.0", tmp_path / "bumped")
    said: list[str] = []
    cand = lock_of(bumped, keep_from=current, progress=said.append)
    assert versions(cand)["tinyengine"] == "2.0" and versions(cand)["tinydep"] == "2.0"
    assert any("do not all fit" in m and "resolving without them" in m for m in said), said
    changed = lock_changes(current, cand)
    assert changed == ["tinydep 1.2 -> 2.0", "tinyengine 1.0 -> 2.0"]
    assert changes_text(changed, limit=1) == ("2 package(s) changed against the current lock: tinydep 1.2 -> 2.0 (+1 more)")


def test_the_stacks_own_pins_are_never_constraints(index):
    _, stack = index
    current = lock_of(stack)
    current["pruned"] = [dict(current["packages"][0], name="gone", version="3.0")]
    keep = resolve.kept_versions(stack, current)
    assert keep == ["gone==3.0", "tinydep==1.2"]  # not tinyengine (engine.version) nor torch (torch.version)


def test_an_engine_version_without_a_wheel_fails_once_without_a_second_resolve(index, tmp_path, monkeypatch):
    _, stack = index
    current = lock_of(stack)
    missing = with_engine(stack, "7.0", tmp_path / "none")
    calls = []
    real = resolve._pip_report
    monkeypatch.setattr(resolve, "_pip_report", lambda *a, **kw: calls.append(kw.get("constraints")) or real(*a, **kw))
    with pytest.raises(BadInput, match="no wheel for tinyengine==7.0"):
        lock_of(missing, keep_from=current)
    assert len(calls) == 1 and calls[0] == ["tinydep==1.2"]  # the constraint is not to blame: no retry


def test_a_candidate_lock_is_reused_only_when_it_kept_the_same_current_lock(index, tmp_path, monkeypatch):
    _, stack = index
    current = lock_of(stack)
    current_file = tmp_path / "current.lock"
    resolved: list[str | None] = []

    def fake_resolve(st, *, progress, keep_from):
        resolved.append(keep_from["lock_sha256"] if keep_from else None)
        doc = lock_of(st, keep_from=keep_from)
        doc["resolver"]["kept_from"] = keep_from["lock_sha256"]
        return finish_lock(doc)

    monkeypatch.setattr(candidate_lock, "resolve_lock", fake_resolve)
    monkeypatch.setattr(candidate_lock, "lock_path", lambda st: current_file)
    cand = Candidate(stack, stack, tmp_path / "cand", {})

    def lock():
        return lock_candidate(cand, candidate_lock.current_lock(cand), relock=False, progress=quiet)

    write_lock(current_file, current)
    first = lock()
    assert resolved == [current["lock_sha256"]] and first["resolver"]["kept_from"] == current["lock_sha256"]
    assert lock() == first and len(resolved) == 1  # reused
    other = finish_lock(dict(current, source_date_epoch=1))  # the current lock changed since
    write_lock(current_file, other)
    lock()
    assert resolved == [current["lock_sha256"], other["lock_sha256"]]
