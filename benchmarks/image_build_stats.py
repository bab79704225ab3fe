"""The pure parts of benchmarks/image_build.py: medians over rounds, speclock/naive ratios, goal checks,
the stdout table and the JSON file. No builds here (tests/test_benchmark_image_build.py covers it)."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCHEMA = "speclock.bench.image-build/v1"
# Timed builds of the naive peer and of speclock, per round (keys of round["naive"] / round["speclock"][builder]).
NAIVE_BUILDS = ("cold", "warm_edit", "cold2")
SPECLOCK_BUILDS = ("cold", "warm_init", "warm_module", "revert", "cold2")
# The goals (#18), checked against the medians.
GOAL_WARM_BUILD_S = 1.0
GOAL_WARM_WALL_S = 3.0
GOAL_SIZE_RATIO = 0.8


def median(values: Iterable[float | int | None]) -> float | None:
    """Median of the values that were measured (None = not measured); None when none were."""
    got = [v for v in values if v is not None]
    return round(float(statistics.median(got)), 3) if got else None


def ratio(num: float | None, den: float | None) -> float | None:
    """num/den, rounded; None where either side is missing or the denominator is 0."""
    if num is None or not den:
        return None
    return round(num / den, 3)


def all_true(values: Iterable[bool | None]) -> bool | None:
    """True when every measured value is True; None when nothing was measured."""
    got = [v for v in values if v is not None]
    return all(got) if got else None


def _field(rounds: list[dict], path: tuple[str, ...]) -> list[Any]:
    out = []
    for rnd in rounds:
        node: Any = rnd
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        out.append(node)
    return out


def summarize_naive(rounds: list[dict]) -> dict[str, Any] | None:
    if not any(r.get("naive") for r in rounds):
        return None
    return {
        "cold_s": median(_field(rounds, ("naive", "cold", "seconds"))),
        "cold2_s": median(_field(rounds, ("naive", "cold2", "seconds"))),
        "warm_edit_s": median(_field(rounds, ("naive", "warm_edit", "seconds"))),
        "size_bytes": median(_field(rounds, ("naive", "size_bytes"))),
        "venv_bytes": median(_field(rounds, ("naive", "venv_bytes"))),
        "cold_same_id": all_true(_field(rounds, ("naive", "cold_same_id"))),
    }


def summarize_speclock(rounds: list[dict], builder: str) -> dict[str, Any] | None:
    if not any((r.get("speclock") or {}).get(builder) for r in rounds):
        return None
    base = ("speclock", builder)
    out: dict[str, Any] = {}
    for name in SPECLOCK_BUILDS:
        out[f"{name}_build_s"] = median(_field(rounds, (*base, name, "build_s")))
        out[f"{name}_wall_s"] = median(_field(rounds, (*base, name, "wall_s")))
    for key in ("size_bytes", "size_builder_bytes", "assets_bytes", "size_without_assets_bytes", "venv_bytes"):
        out[key] = median(_field(rounds, (*base, key)))
    out["cold_same_id"] = all_true(_field(rounds, (*base, "cold_same_id")))
    out["revert_same_id"] = all_true(_field(rounds, (*base, "revert_same_id")))
    return out


def ratios(naive: dict[str, Any] | None, spec: dict[str, Any] | None) -> dict[str, float | None]:
    """speclock / naive: below 1 means speclock is faster or smaller. The naive's time is its whole
    `docker build` (it has no separate build step); speclock's is given both ways."""
    if not naive or not spec:
        return {}
    return {
        "cold_build": ratio(spec["cold_build_s"], naive["cold_s"]),
        "cold_wall": ratio(spec["cold_wall_s"], naive["cold_s"]),
        "warm_init_build": ratio(spec["warm_init_build_s"], naive["warm_edit_s"]),
        "warm_init_wall": ratio(spec["warm_init_wall_s"], naive["warm_edit_s"]),
        "warm_module_build": ratio(spec["warm_module_build_s"], naive["warm_edit_s"]),
        "warm_module_wall": ratio(spec["warm_module_wall_s"], naive["warm_edit_s"]),
        "size_without_assets": ratio(spec["size_without_assets_bytes"], naive["size_bytes"]),
        "size_total": ratio(spec["size_bytes"], naive["size_bytes"]),
    }


def goals(naive: dict[str, Any] | None, spec: dict[str, Any] | None) -> dict[str, bool | None]:
    """The issue's goals, from the medians: None where a side was not measured."""
    if not spec:
        return {}

    def at_most(value, limit):
        return None if value is None or limit is None else value <= limit

    warm_builds = [spec["warm_init_build_s"], spec["warm_module_build_s"]]
    warm_walls = [spec["warm_init_wall_s"], spec["warm_module_wall_s"]]
    return {
        "cold_build_not_slower_than_naive": at_most(spec["cold_build_s"], (naive or {}).get("cold_s")),
        "warm_build_at_most_1s": all_true(at_most(v, GOAL_WARM_BUILD_S) for v in warm_builds),
        "warm_wall_at_most_3s": all_true(at_most(v, GOAL_WARM_WALL_S) for v in warm_walls),
        "size_20pct_smaller_without_assets": at_most(
            spec["size_without_assets_bytes"],
            None if not naive or naive.get("size_bytes") is None else naive["size_bytes"] * GOAL_SIZE_RATIO,
        ),
        "same_id_two_cold_builds": spec["cold_same_id"],
        "same_id_after_revert": spec["revert_same_id"],
    }


def load_summary(rounds: list[dict]) -> dict[str, float | None]:
    """Mean and max of every 1-minute load average sampled before and after each build."""
    samples: list[float] = []
    for rnd in rounds:
        sides = [rnd.get("naive") or {}] + list((rnd.get("speclock") or {}).values())
        for side in sides:
            for value in side.values():
                if isinstance(value, dict):
                    samples += [v for v in (value.get("load_before"), value.get("load_after")) if v is not None]
    if not samples:
        return {"mean": None, "max": None, "samples": 0}
    return {"mean": round(statistics.fmean(samples), 2), "max": round(max(samples), 2), "samples": len(samples)}


def summarize(rounds: list[dict], builders: list[str]) -> dict[str, Any]:
    naive = summarize_naive(rounds)
    out: dict[str, Any] = {"naive": naive, "speclock": {}, "ratios": {}, "goals": {}, "load_1min": load_summary(rounds)}
    for builder in builders:
        spec = summarize_speclock(rounds, builder)
        out["speclock"][builder] = spec
        out["ratios"][builder] = ratios(naive, spec)
        out["goals"][builder] = goals(naive, spec)
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _gb(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e9:.2f} GB"


def _r(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _b(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def table(result: dict[str, Any]) -> str:
    """The medians as a plain-text table, one column per side (naive, speclock per builder)."""
    summary = result["summary"]
    naive = summary.get("naive") or {}
    cols = [("naive", None)] + [(f"speclock/{b}", b) for b in summary["speclock"]]
    rows: list[tuple[str, list[str]]] = []

    def spec(builder, key):
        return (summary["speclock"].get(builder) or {}).get(key)

    def row(label, naive_value, key, fmt):
        rows.append((label, [fmt(naive_value)] + [fmt(spec(b, key)) for _, b in cols[1:]]))

    row("cold build step", naive.get("cold_s"), "cold_build_s", _s)
    row("cold end to end", naive.get("cold_s"), "cold_wall_s", _s)
    row("warm: __init__.py edit, build", naive.get("warm_edit_s"), "warm_init_build_s", _s)
    row("warm: __init__.py edit, e2e", naive.get("warm_edit_s"), "warm_init_wall_s", _s)
    row("warm: core/files.py edit, build", None, "warm_module_build_s", _s)
    row("warm: core/files.py edit, e2e", None, "warm_module_wall_s", _s)
    row("rebuild after revert, build", None, "revert_build_s", _s)
    row("image size (docker Size)", naive.get("size_bytes"), "size_bytes", _gb)
    row("model assets in the image", None, "assets_bytes", _gb)
    row("size without model assets", naive.get("size_bytes"), "size_without_assets_bytes", _gb)
    row("/opt/venv", naive.get("venv_bytes"), "venv_bytes", _gb)
    row("same id, two cold builds", naive.get("cold_same_id"), "cold_same_id", _b)
    row("same id after revert", None, "revert_same_id", _b)
    for builder in summary["ratios"]:
        for key, value in summary["ratios"][builder].items():
            rows.append((f"ratio {key} ({builder})", ["", _r(value)]))
    width = max(len(label) for label, _ in rows)
    head = " " * width + " | " + " | ".join(f"{name:>16}" for name, _ in cols)
    lines = [
        f"medians over {result['runs']} round(s); load 1-min mean {summary['load_1min']['mean']} "
        f"max {summary['load_1min']['max']}",
        head,
        "-" * len(head),
    ]
    for label, values in rows:
        lines.append(f"{label:<{width}} | " + " | ".join(f"{v:>16}" for v in values))
    for builder, checks in summary["goals"].items():
        lines.append(f"goals ({builder}): " + ", ".join(f"{k} {_b(v)}" for k, v in checks.items()))
    return "\n".join(lines)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write whole or not at all: a temp file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
