"""No module of src/speclock over 450 lines (#27): a module that grows past it holds more than one concern and is
split by concern (gate.py's speed checks went to verify/speed.py, its outputs to verify/checks.py, for example)."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "speclock"
MAX_LINES = 450


def test_no_module_is_over_450_lines():
    sizes = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}
    assert len(sizes) > 100  # the tree was found
    over = {name: n for name, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"
