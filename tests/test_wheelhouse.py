"""Wheelhouse: content-addressed, verified on use; tampered files are refetched, bad downloads refused."""

import json
from pathlib import Path

import pytest

from speclock.core.errors import CheckFailed
from speclock.core.files import file_sha256
from speclock.build.fetch import fetch
from speclock.build.wheelhouse import ensure_entry, entry_path, requirements_text

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
    assert any("downloaded" in l for l in lines)
    lines.clear()
    fetch(lock, store=tmp_path, progress=lines.append)
    assert lines == ["wheelhouse ready: 2 files verified (2 cached) in " + lines[0].split(" in ")[1]]


def test_requirements_text_pins_every_hash():
    text = requirements_text([small_package()])
    pkg = small_package()
    assert text == f"sniffio=={pkg['version']} --hash=sha256:{pkg['sha256']}\n"


def test_https_download_from_the_index(tmp_path):
    pkg = next(p for p in LOCK["packages"] if p["url"].startswith("https://") and "mirror_url" not in p
               and p["name"] in ("astor", "interegular", "lark", "depyf", "cloudpickle"))
    path, outcome = ensure_entry(pkg, tmp_path)
    assert outcome == "downloaded" and file_sha256(path) == pkg["sha256"]


def test_local_mirror_entries_also_name_their_index_url():
    """A wheel taken from a local mirror keeps the URL of the index the stack names for it: PyPI's, or
    torch's own index for torch+cpu (docs/lock.md); never a file:// URL."""
    mirrored = [p for p in LOCK["packages"] if "mirror_url" in p]
    assert mirrored, "the lock should map local-mirror wheels to their index"
    assert all(p["url"].startswith(("https://files.pythonhosted.org/", "https://download.pytorch.org/whl/"))
               for p in mirrored), [p["url"] for p in mirrored]
