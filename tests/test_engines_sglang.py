"""SGLang adapter, without a GPU: arguments, counters from real response shapes, server_info deltas.

Shapes are those of sglang 0.5.23: meta_info keys from srt/managers/tokenizer_manager.py
(_calculate_spec_decoding_metrics), /server_info from srt/entrypoints/http_server.py and
scheduler_components/internal_state.py, flags from srt/arg_groups/fields/{spec,observability}.py.
The live engine path needs a GPU and is verified only on GPU hosts.
"""

from pathlib import Path

import pytest

from speclock.engines import EngineConfig, get_engine
from speclock.engines.sglang import (
    captured_layers_for,
    counters_from_meta,
    launch_command,
    server_info_delta,
    spec_args,
    verify_calls_from_prometheus,
)

# One finished request of /generate with EAGLE3, k=3: 4 verify steps accepting 1, 1, 2, 2 drafts.
GENERATE_RESPONSE = [
    {
        "text": " The capital of France is Paris.",
        "output_ids": [578, 6333, 282, 4649, 314, 7042, 30, 2, 11, 12],
        "meta_info": {
            "id": "5e1c0b7f2f8e4f7a9a2b",
            "finish_reason": {"type": "length", "length": 10},
            "prompt_tokens": 31,
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": 10,
            "cached_tokens": 0,
            "e2e_latency": 0.21,
            "spec_accept_rate": 0.5,
            "spec_accept_length": 2.5,
            "spec_num_correct_drafts": 6,
            "spec_num_proposed_drafts": 12,
            "spec_verify_ct": 4,
            "spec_correct_drafts_histogram": [0, 2, 2],
        },
    }
]

SERVER_INFO = {
    "model_path": "/opt/speclock/target",
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "startup_time": 1764676800.0,
    "internal_states": [
        {
            "world_size": 1,
            "last_gen_throughput": 812.4,
            "avg_spec_accept_length": 2.0,
            "effective_max_running_requests_per_dp": 48,
        }
    ],
    "version": "0.5.23",
    "frontend": "python",
}

PROMETHEUS = """# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="/opt/speclock/target"} 100.0
# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="/opt/speclock/target"} 2.1
"""


def cfg(draft="/d"):
    return EngineConfig(Path("/t"), Path(draft) if draft else None, 3, {"dtype": "bfloat16", "mem_fraction_static": 0.8})


def test_eagle3_arguments_use_sglang_field_names():
    args = spec_args(cfg())
    assert args["speculative_algorithm"] == "EAGLE3"
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert args["speculative_draft_model_path"] == "/d" and args["mem_fraction_static"] == 0.8
    assert "speculative_algorithm" not in spec_args(cfg(draft=None))


def test_launch_command_uses_the_servers_flags():
    cmd = launch_command(cfg(), port=31000)
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    for flag, value in [
        ("--model-path", "/t"),
        ("--speculative-algorithm", "EAGLE3"),
        ("--speculative-draft-model-path", "/d"),
        ("--speculative-num-steps", "3"),
        ("--speculative-eagle-topk", "1"),
        ("--speculative-num-draft-tokens", "4"),
        ("--port", "31000"),
    ]:
        assert cmd[cmd.index(flag) + 1] == value
    assert "--enable-metrics" in cmd


def test_counters_from_meta_info_agree_with_sglangs_own_figures():
    c = counters_from_meta([r["meta_info"] for r in GENERATE_RESPONSE], k=3)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (4, 12, 6)
    assert c.accepted_per_position == (4, 2, 0)
    m = c.metrics()
    meta = GENERATE_RESPONSE[0]["meta_info"]
    assert m["acceptance_rate"] == meta["spec_accept_rate"]
    assert m["mean_acceptance_length"] == meta["spec_accept_length"]  # completion_tokens / verify_ct


def test_requests_without_speculation_count_nothing():
    assert counters_from_meta([{"completion_tokens": 10, "prompt_tokens": 5}], k=3).num_drafts == 0


def test_server_info_average_since_start_becomes_a_per_run_delta():
    # 100 verify steps before at 2.0; this run: 50 steps at 3.0 -> cumulative (200 + 150) / 150.
    after = dict(SERVER_INFO, internal_states=[dict(SERVER_INFO["internal_states"][0], avg_spec_accept_length=350 / 150)])
    assert server_info_delta(SERVER_INFO, after, verify_before=100, verify_run=50) == pytest.approx(3.0)
    fresh = dict(SERVER_INFO, internal_states=[{"world_size": 1}])
    assert server_info_delta(fresh, after, 0, 50) == pytest.approx(350 / 150)
    assert server_info_delta(SERVER_INFO, fresh, 100, 50) is None


def test_verify_calls_from_metrics_text():
    assert verify_calls_from_prometheus(PROMETHEUS) == 100
    two = PROMETHEUS + 'sglang:spec_verify_calls_total{model_name="/opt/speclock/target",dp_rank="1"} 20.0\n'
    assert verify_calls_from_prometheus(two.encode()) == 120  # summed over label sets, read from the body's bytes


def test_verify_calls_missing_or_malformed():
    gauge_only = "\n".join(PROMETHEUS.splitlines()[3:]) + "\n"  # the acceptance gauge, no verify counter
    assert verify_calls_from_prometheus(gauge_only) is None  # no --enable-metrics: no per-run server_info figure
    from speclock.core.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="SGLang server http://h/metrics is not Prometheus text"):
        verify_calls_from_prometheus('sglang:spec_verify_calls_total{model_name="t" 1\n', "http://h/metrics")
    with pytest.raises(EnvironmentProblem, match="is inf, not a whole count"):
        verify_calls_from_prometheus("sglang:spec_verify_calls_total +Inf\n", "http://h/metrics")


def test_captured_layers_follow_sglangs_shift_rules():
    assert captured_layers_for([2, 15, 27], "LlamaForCausalLM") == [3, 16, 28]
    assert captured_layers_for([1, 30, 58], "DeepseekV3ForCausalLM") == [2, 31, 59]
    assert captured_layers_for([2, 30, 58], "DeepseekV3ForCausalLM") == [2, 30, 58]


def test_starting_sglang_without_it_installed_is_an_environment_problem():
    pytest.importorskip("speclock")
    try:
        import sglang  # noqa: F401

        pytest.skip("sglang is installed here; this checks the message on machines without it")
    except ImportError:
        pass
    from speclock.core.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="SGLang is not importable"):
        get_engine("sglang").start(cfg())
