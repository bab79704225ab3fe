"""vLLM counters: from `LLM.get_metrics()` objects and from a server's Prometheus text; deltas."""

from dataclasses import dataclass

from speclock.engines import SpecCounters
from speclock.engines.vllm import counters_from_prometheus, counters_from_snapshot, engine_kwargs
from speclock.engines import EngineConfig
from pathlib import Path

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


def test_snapshot_objects_sum_over_engines():
    snap = [Counter("vllm:spec_decode_num_drafts", {"engine": "0"}, 10), Counter("vllm:spec_decode_num_drafts", {"engine": "1"}, 5),
            Counter("vllm:spec_decode_num_draft_tokens", {"engine": "0"}, 45),
            Counter("vllm:spec_decode_num_accepted_tokens", {"engine": "0"}, 20),
            Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "0"}, [9, 6, 3]),
            Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "1"}, [1, 1, 0]),
            Counter("vllm:num_preemptions", {"engine": "0"}, 3)]
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
