"""Issue #27 (mypy and ruff clean, typed records) for core/, spec/, engines/, patches/ and build/: the real bugs the
checkers showed, each held fixed here, and the typed helpers that replaced dict[str, Any] code keeping their output."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from speclock.core.files import atomic_output
from speclock.engines import SpecCounters
from speclock.engines.vllm import counters_from_snapshot
from speclock.spec.lock import finish_lock, read_lock, target_lock
from speclock.spec.stack import canonical_sha256

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Vector:  # the shape of vllm.v1.metrics.reader.Vector
    name: str
    labels: dict
    values: list[int] = field(default_factory=list)


def test_snapshot_keeps_positions_only_some_engines_report():
    """ruff B905 (zip without strict=) in engines/vllm.py counters_from_snapshot: the per-position sum padded only the
    running total, so an engine reporting FEWER positions than the ones before it cut the total short (position 2's
    accepted tokens vanished). Both sides are padded now."""
    snap = [
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "0"}, [9, 6, 3]),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "1"}, [1]),
    ]
    assert counters_from_snapshot(snap) == SpecCounters(0, 0, 0, (10, 6, 3))
    # and the other way round (more positions later) as before
    assert counters_from_snapshot(list(reversed(snap))) == SpecCounters(0, 0, 0, (10, 6, 3))


def test_finish_lock_rehashes_a_copy_in_key_order():
    """finish_lock (typed LockDoc now, a copy instead of a comprehension): same keys in the same order, lock_sha256
    last, the hash of everything else; the caller's document untouched."""
    doc = read_lock(ROOT / "locks" / "cpu-vllm.lock")
    before = json.dumps(doc)
    out = finish_lock(doc)
    assert json.dumps(doc) == before
    assert list(out)[-1] == "lock_sha256"
    assert [k for k in out if k != "lock_sha256"] == [k for k in doc if k != "lock_sha256"]
    assert out["lock_sha256"] == canonical_sha256({k: v for k, v in doc.items() if k != "lock_sha256"}) == doc["lock_sha256"]


def test_target_lock_of_the_image_target_is_the_old_view():
    """target_lock (copy and pop instead of a comprehension): the view the old code gave, key for key."""
    doc = read_lock(ROOT / "locks" / "cpu-vllm.lock")
    old = {k: v for k, v in doc.items() if k not in ("targets", "lock_sha256")}
    old.update(
        {
            "python": {"version": doc["python"]["version"], "platforms": doc["python"]["platforms"]},
            "packages": doc["packages"],
            "excluded": doc.get("excluded", []),
            "assets": doc["assets"],
            "target": "image",
            "lock_from": doc["lock_sha256"],
        }
    )
    if "pruned" in doc:
        old["pruned"] = doc["pruned"]
    old["lock_sha256"] = canonical_sha256(old)
    assert json.dumps(target_lock(doc, "image")) == json.dumps(old)


def test_atomic_output_writes_text_and_bytes(tmp_path):
    """atomic_output is typed by mode now (overloads); both modes still write what they are given."""
    with atomic_output(tmp_path / "t.txt") as text:
        text.write("héllo\n")
    with atomic_output(tmp_path / "b.bin", binary=True) as raw:
        raw.write(b"\x00\x01")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
