"""Fixed-output derivations of locked wheels: Nix downloads a wheel from PyPI and accepts it only
if its bytes hash to the lock's sha256 (real nix, real PyPI; skipped when PyPI is unreachable)."""

from __future__ import annotations

import hashlib
import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from speclock.build import nixcheck
from speclock.spec.lock import read_lock

ROOT = Path(__file__).resolve().parents[1]
SYS = nixcheck.SYSTEM

pytestmark = pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (apt-get install -y nix-bin)")


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request("https://files.pythonhosted.org/", method="HEAD"), timeout=10)
        return True
    except Exception as err:  # HTTP errors still prove the host answers
        return hasattr(err, "code")


def _smallest_pypi_wheel() -> tuple[str, dict]:
    """(stack, wheel) with the smallest-looking PyPI URL: pure-Python wheels are small and quick."""
    best = None
    for path in sorted((ROOT / "locks").glob("*.lock")):
        lock = read_lock(path)
        for w in lock["packages"] + lock["assets"]:
            if w["url"].startswith("https://files.pythonhosted.org/") and w["filename"].endswith("-py3-none-any.whl"):
                if w["name"] in ("agent-detector", "aiosignal", "annotated-types", "sniffio", "mdurl", "idna", "six"):
                    return path.stem, w
                best = best or (path.stem, w)
    if best is None:
        pytest.skip("no locked wheel has a PyPI URL")
    return best


def _build(flake: Path, *args: str):
    return nixcheck.run_nix(["nix", "build", "--no-link", "--json", *args], cwd=flake, check=False, timeout=240)


@pytest.fixture(scope="module")
def flake(tmp_path_factory) -> Path:
    if not _pypi_reachable():
        pytest.skip("PyPI (files.pythonhosted.org) is not reachable")
    return nixcheck.flake_copy(tmp_path_factory.mktemp("flake") / "repo", ROOT)


def test_locked_wheel_sha256_matches_what_pypi_serves(flake):
    stack, wheel = _smallest_pypi_wheel()
    attr = f'.#legacyPackages.{SYS}.wheels."{stack}"."{wheel["name"]}"'
    # Drop a copy from an earlier run, so this run really downloads and verifies.
    stored = nixcheck.nix_eval_json(flake, f'legacyPackages.{SYS}.wheels."{stack}"."{wheel["name"]}".outPath')
    nixcheck.run_nix(["nix", "store", "delete", stored], cwd=flake, check=False)
    assert not Path(stored).exists()
    proc = _build(flake, attr)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = Path(json.loads(proc.stdout)[0]["outputs"]["out"])
    assert out.name.endswith(wheel["filename"])
    # Independently of Nix: the bytes in the store hash to the lock's sha256.
    assert hashlib.sha256(out.read_bytes()).hexdigest() == wheel["sha256"]


def test_a_wrong_locked_hash_is_refused(tmp_path, flake):
    stack, wheel = _smallest_pypi_wheel()
    scratch = nixcheck.flake_copy(tmp_path / "repo", ROOT)
    path = scratch / "locks" / f"{stack}.lock"
    doc = json.loads(path.read_text())
    wrong = ("0" if wheel["sha256"][0] != "0" else "1") + wheel["sha256"][1:]
    for w in doc["packages"] + doc["assets"]:
        if w["name"] == wheel["name"]:
            w["sha256"] = wrong
    path.write_text(json.dumps(doc, indent=1))
    nixcheck.git_add(scratch)
    proc = _build(scratch, f'.#legacyPackages.{SYS}.wheels."{stack}"."{wheel["name"]}"')
    assert proc.returncode != 0
    assert "hash mismatch in fixed-output derivation" in proc.stderr
    assert wheel["filename"] in proc.stderr  # the derivation is named after the wheel file


def test_a_wheel_already_in_the_store_needs_no_download(tmp_path, flake):
    """`nix store add-file` of a verified wheel gives the very path the fixed-output derivation
    produces: how file:// (local mirror) wheels are provided on a machine without that mirror."""
    stack, wheel = _smallest_pypi_wheel()
    local = tmp_path / wheel["filename"]
    with urllib.request.urlopen(wheel["url"], timeout=60) as resp:
        local.write_bytes(resp.read())
    added = nixcheck.run_nix(["nix", "store", "add-file", str(local)], cwd=flake).stdout.strip()
    out = nixcheck.nix_eval_json(flake, f'legacyPackages.{SYS}.wheels."{stack}"."{wheel["name"]}".outPath')
    assert added == out
