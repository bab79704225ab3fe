"""vLLM counters: from `LLM.get_metrics()` objects and from a server's Prometheus text; deltas."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from speclock.core.errors import EnvironmentProblem
from speclock.engines import EngineConfig, SpecCounters
from speclock.engines.vllm import check_not_reset, counters_from_prometheus, counters_from_snapshot, engine_kwargs

# The exposition format of a vLLM 0.32 server (prometheus_client; counters get _total and _created).
METRICS_TEXT = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 504.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="target"} 1.7646768e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 1512.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 700.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 350.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 220.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="2"} 130.0
vllm:generation_tokens_total{engine="0",model_name="target"} 1900.0
"""


@dataclass
class Counter:  # the shape of vllm.v1.metrics.reader.Counter / Vector
    name: str
    labels: dict
    value: int = 0


@dataclass
class Vector:
    name: str
    labels: dict
    values: list


def test_prometheus_text_parses_into_counters():
    c = counters_from_prometheus(METRICS_TEXT)
    assert c == SpecCounters(504, 1512, 700, (350, 220, 130))
    assert c.metrics()["mean_acceptance_length"] == 1 + 700 / 504


# Two engines (data parallel), a histogram and the `_created` samples of a real prometheus_client page.
TWO_ENGINES = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="target"} 5.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="target"} 1.7646768e+09
vllm:spec_decode_num_drafts_created{engine="1",model_name="target"} 1.7646768e+09
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 30.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="target"} 15.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 14.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="target"} 6.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="target",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="target",position="0"} 4.0
# HELP vllm:spec_decode_draft_latency_seconds A histogram with the prefix (not a counter).
# TYPE vllm:spec_decode_draft_latency_seconds histogram
vllm:spec_decode_draft_latency_seconds_bucket{engine="0",le="0.1"} 3.0
vllm:spec_decode_draft_latency_seconds_bucket{engine="0",le="+Inf"} 7.0
vllm:spec_decode_draft_latency_seconds_count{engine="0"} 7.0
vllm:spec_decode_draft_latency_seconds_sum{engine="0"} 0.42
"""


def test_labels_sum_over_engines_and_histograms_and_created_are_skipped():
    assert counters_from_prometheus(TWO_ENGINES) == SpecCounters(15, 45, 20, (13, 7))


def test_a_page_without_type_lines_is_read_by_the_total_suffix():
    bare = "\n".join(line for line in METRICS_TEXT.splitlines() if not line.startswith("#")) + "\n"
    assert (
        counters_from_prometheus(bare) == counters_from_prometheus(METRICS_TEXT) == SpecCounters(504, 1512, 700, (350, 220, 130))
    )
    assert counters_from_prometheus(bare.encode()) == SpecCounters(504, 1512, 700, (350, 220, 130))  # the body as read


@pytest.mark.parametrize(
    "page, says",
    [
        ('vllm:spec_decode_num_drafts_total{engine="0" 504.0\n', "is not Prometheus text"),  # an unclosed label set
        ("vllm:spec_decode_num_drafts_total many\n", "is not Prometheus text"),  # a value that is not a number
        ('vllm:spec_decode_num_drafts_total{engine="0"} NaN\n', "is nan, not a whole count"),
        ('vllm:spec_decode_num_drafts_total{engine="0"} -3\n', "is -3, not a whole count"),
        ('vllm:spec_decode_num_drafts_total{engine="0"} 2.5\n', "is 2.5, not a whole count"),
        ('vllm:spec_decode_num_accepted_tokens_per_pos_total{position="first"} 2\n', "position label 'first'"),
        (b"vllm:spec_decode_num_drafts_total \xff\n", "is not Prometheus text"),  # not UTF-8
    ],
)
def test_a_malformed_page_is_an_environment_problem_naming_the_url_and_sample(page, says):
    with pytest.raises(EnvironmentProblem, match=says) as err:
        counters_from_prometheus(page, url="http://h:8000/metrics")
    assert "vLLM server http://h:8000/metrics" in str(err.value) and err.value.exit_code == 3


def test_a_drafted_run_needs_the_spec_decode_series():
    plain = 'vllm:generation_tokens_total{engine="0"} 1900.0\n'
    assert counters_from_prometheus(plain) == SpecCounters()  # a server without a drafter counts nothing
    with pytest.raises(EnvironmentProblem, match="no vllm:spec_decode_num_drafts counter: it serves without a drafter"):
        counters_from_prometheus(plain, url="http://h/metrics", require=True)
    assert counters_from_prometheus(METRICS_TEXT, require=True).num_drafts == 504


def test_a_counter_that_went_back_is_a_restarted_server():
    before = counters_from_prometheus(METRICS_TEXT)
    check_not_reset(before, before, "u")  # no traffic: nothing went back
    restarted = counters_from_prometheus(METRICS_TEXT.replace("504.0", "3.0"))
    with pytest.raises(EnvironmentProblem, match="num_drafts went back from 504 to 3: the server restarted"):
        check_not_reset(before, restarted, "http://h/metrics")
    pos_only = SpecCounters(504, 1512, 700, (350, 219, 130))
    with pytest.raises(EnvironmentProblem, match="position 1 went back from 220 to 219"):
        check_not_reset(before, pos_only, "http://h/metrics")


def test_snapshot_objects_sum_over_engines():
    snap = [
        Counter("vllm:spec_decode_num_drafts", {"engine": "0"}, 10),
        Counter("vllm:spec_decode_num_drafts", {"engine": "1"}, 5),
        Counter("vllm:spec_decode_num_draft_tokens", {"engine": "0"}, 45),
        Counter("vllm:spec_decode_num_accepted_tokens", {"engine": "0"}, 20),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "0"}, [9, 6, 3]),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "1"}, [1, 1, 0]),
        Counter("vllm:num_preemptions", {"engine": "0"}, 3),
    ]
    assert counters_from_snapshot(snap) == SpecCounters(15, 45, 20, (10, 7, 3))


def test_deltas_around_a_run_remove_earlier_traffic():
    before, after = SpecCounters(100, 300, 150, (80, 50, 20)), SpecCounters(150, 450, 210, (110, 70, 30))
    d = after - before
    assert d == SpecCounters(50, 150, 60, (30, 20, 10))
    assert d.metrics()["acceptance_rate"] == 60 / 150
    assert (after - SpecCounters()).num_drafts == 150  # a fresh engine starts at zero


def test_engine_kwargs_carry_the_stack_settings_and_the_drafter():
    kw = engine_kwargs(EngineConfig(Path("/t"), Path("/d"), 3, {"dtype": "bfloat16", "enforce_eager": True}))
    assert kw["speculative_config"] == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}
    assert kw["dtype"] == "bfloat16" and kw["disable_log_stats"] is False
    assert "speculative_config" not in engine_kwargs(EngineConfig(Path("/t")))


def test_settings_speculative_config_reaches_the_drafted_engine_only():
    # the GPU fault drill forces the drafter eager this way; the stack's drafter and k always win
    settings = {"speculative_config": {"enforce_eager": True, "model": "/elsewhere"}}
    kw = engine_kwargs(EngineConfig(Path("/t"), Path("/d"), 2, settings))
    assert kw["speculative_config"] == {"enforce_eager": True, "method": "eagle3", "model": "/d", "num_speculative_tokens": 2}
    assert "speculative_config" not in engine_kwargs(EngineConfig(Path("/t"), None, 2, settings))
