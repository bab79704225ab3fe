"""Wheelhouse: content-addressed, verified on use; tampered files are refetched, bad downloads refused."""

import json
from pathlib import Path

import pytest

from speclock.build.fetch import fetch
from speclock.build.wheelhouse import ensure_entry, entry_path, requirements_text
from speclock.core.errors import CheckFailed
from speclock.core.files import file_sha256

ROOT = Path(__file__).resolve().parents[1]
LOCK = json.loads((ROOT / "locks" / "cpu-vllm.lock").read_text())


def small_package(name="sniffio"):
    return next(p for p in LOCK["packages"] if p["name"] == name)


def test_download_verifies_and_stores_by_hash(tmp_path):
    pkg = small_package()
    path, outcome = ensure_entry(pkg, tmp_path)
    assert outcome == "downloaded"
    assert path == tmp_path / pkg["sha256"] / pkg["filename"]
    assert file_sha256(path) == pkg["sha256"]
    assert ensure_entry(pkg, tmp_path)[1] == "cached"


def test_tampered_entry_is_detected_and_refetched(tmp_path):
    pkg = small_package()
    path, _ = ensure_entry(pkg, tmp_path)
    path.write_bytes(path.read_bytes()[:-10] + b"x" * 10)
    path2, outcome = ensure_entry(pkg, tmp_path)
    assert outcome.startswith("refetched")
    assert file_sha256(path2) == pkg["sha256"]
    quarantined = list((tmp_path / ".quarantine").iterdir())
    assert len(quarantined) == 1


def test_download_with_wrong_hash_is_refused_and_leaves_nothing(tmp_path):
    pkg = dict(small_package(), sha256="0" * 64)
    with pytest.raises(CheckFailed, match="refused"):
        ensure_entry(pkg, tmp_path)
    assert not entry_path(pkg, tmp_path).exists()
    assert [p for p in (tmp_path / pkg["sha256"]).iterdir()] == []


def test_fetch_reports_progress_and_reuses(tmp_path):
    lock = {"stack": "t", "packages": [small_package("sniffio"), small_package("idna")], "assets": []}
    lines = []
    fetch(lock, store=tmp_path, progress=lines.append)
    assert any("downloaded" in line for line in lines)
    lines.clear()
    fetch(lock, store=tmp_path, progress=lines.append)
    assert lines == ["wheelhouse ready: 2 files verified (2 cached) in " + lines[0].split(" in ")[1]]


def test_requirements_text_pins_every_hash():
    text = requirements_text([small_package()])
    pkg = small_package()
    assert text == f"sniffio=={pkg['version']} --hash=sha256:{pkg['sha256']}\n"


def test_https_download_from_the_index(tmp_path):
    pkg = next(
        p
        for p in LOCK["packages"]
        if p["url"].startswith("https://")
        and "mirror_url" not in p
        and p["name"] in ("astor", "interegular", "lark", "depyf", "cloudpickle")
    )
    path, outcome = ensure_entry(pkg, tmp_path)
    assert outcome == "downloaded" and file_sha256(path) == pkg["sha256"]


def test_local_mirror_entries_also_name_their_index_url():
    """A wheel taken from a local mirror keeps the URL of the index the stack names for it: PyPI's, or
    torch's own index for torch+cpu (docs/lock.md); never a file:// URL."""
    mirrored = [p for p in LOCK["packages"] if "mirror_url" in p]
    assert mirrored, "the lock should map local-mirror wheels to their index"
    assert all(p["url"].startswith(("https://files.pythonhosted.org/", "https://download.pytorch.org/whl/")) for p in mirrored), [
        p["url"] for p in mirrored
    ]


def _fresh_process_state(monkeypatch):
    """What a new speclock process starts with: no verification in memory (the store's record is read anew)."""
    from speclock.build import wheelhouse

    monkeypatch.setattr(wheelhouse, "_verified", {})
    monkeypatch.setattr(wheelhouse, "_stamps_loaded", set())


def _count_hashes(monkeypatch) -> list:
    from speclock.build import wheelhouse

    calls = []
    real = wheelhouse.file_sha256
    monkeypatch.setattr(wheelhouse, "file_sha256", lambda p: calls.append(Path(p).name) or real(p))
    return calls


def test_an_unchanged_wheelhouse_is_not_hashed_again_by_the_next_run(tmp_path, monkeypatch):
    from speclock.build.wheelhouse import save_stamps

    pkg = small_package()
    ensure_entry(pkg, tmp_path)
    save_stamps(tmp_path)
    _fresh_process_state(monkeypatch)
    calls = _count_hashes(monkeypatch)
    assert ensure_entry(pkg, tmp_path)[1] == "cached"
    assert calls == []


@pytest.mark.parametrize("change", ["rewrite-same-bytes", "touch", "tamper-keep-mtime"])
def test_any_change_to_a_stamped_entry_is_hashed_again(tmp_path, monkeypatch, change):
    import os

    from speclock.build.wheelhouse import save_stamps

    pkg = small_package()
    path, _ = ensure_entry(pkg, tmp_path)
    save_stamps(tmp_path)
    st = path.stat()
    data = path.read_bytes()
    if change == "rewrite-same-bytes":
        path.write_bytes(data)
    elif change == "touch":
        os.utime(path)
    else:  # same size, mtime put back: the ctime still moves
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    _fresh_process_state(monkeypatch)
    calls = _count_hashes(monkeypatch)
    _, outcome = ensure_entry(pkg, tmp_path)
    assert pkg["filename"] in calls
    assert outcome.startswith("refetched") if change == "tamper-keep-mtime" else outcome == "cached"
    assert file_sha256(path) == pkg["sha256"]


def test_a_damaged_stamp_record_means_hashing_again(tmp_path, monkeypatch):
    from speclock.build.wheelhouse import STAMPS, save_stamps

    pkg = small_package()
    ensure_entry(pkg, tmp_path)
    save_stamps(tmp_path)
    (tmp_path / STAMPS).write_text("{not json")
    _fresh_process_state(monkeypatch)
    calls = _count_hashes(monkeypatch)
    assert ensure_entry(pkg, tmp_path)[1] == "cached" and calls == [pkg["filename"]]


def test_linking_into_a_context_again_leaves_the_entries_untouched(tmp_path):
    """A second staging keeps the hard links (a relink would change each entry's ctime, voiding its stamp)."""
    from speclock.build.wheelhouse import link_into

    pkg = small_package()
    store = tmp_path / "store"
    path, _ = ensure_entry(pkg, store)
    lock = {"stack": "t", "packages": [pkg], "assets": []}
    link_into(lock, tmp_path / "ctx", store=store)
    ctime = path.stat().st_ctime_ns
    link_into(lock, tmp_path / "ctx", store=store)
    assert path.stat().st_ctime_ns == ctime
    assert (tmp_path / "ctx" / pkg["filename"]).stat().st_ino == path.stat().st_ino
