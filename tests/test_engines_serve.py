"""`speclock serve`: the server command a stack gets (engine flags, drafter, the serving k, arch overrides),
its refusals, and the serving k's place in the stack file. The real server path runs in
tests/test_engines_vllm_server.py, whose servers are started with `server_command` itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fuzz_support import run_cli

from speclock.engines.serve import server_command, serving_k
from speclock.spec.stack import load_stack

REPO = Path(__file__).resolve().parents[1]
DRAFT = REPO / "models" / "smollm2-135m-eagle3"


def _model_dir(tmp_path: Path) -> Path:
    """A folder that passes the config check (serve never loads weights before the engine does)."""
    target = tmp_path / "target"
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576})
    )
    return target


def _stack_copy(tmp_path: Path, name: str, extra: str) -> Path:
    folder = tmp_path / "stacks"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text((REPO / "stacks" / f"{name}.toml").read_text() + extra)
    return path


def test_vllm_command_carries_settings_drafter_and_smoke_k_by_default(tmp_path):
    stack = load_stack("cpu-vllm")
    cmd = server_command(stack, target=tmp_path, draft=DRAFT, k=serving_k(stack), host="0.0.0.0", port=8123)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == str(tmp_path) and cmd[cmd.index("--port") + 1] == "8123"
    assert "--enforce-eager" in cmd and cmd[cmd.index("--dtype") + 1] == "bfloat16"
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(DRAFT), "num_speculative_tokens": stack.smoke["num_speculative_tokens"]}


def test_the_measured_serving_k_is_used_and_the_gate_keeps_k3():
    stack = load_stack("vllm-0.26.0-torch2.11-cu130")
    assert stack.smoke["num_speculative_tokens"] == 3
    assert serving_k(stack) == 2  # fastest at batch 1 on the H200, docs/gpu-runs/README.md


def test_blackwell_gets_its_attention_backend_and_no_draft_means_no_spec_config(tmp_path):
    stack = load_stack("vllm-0.26.0-torch2.11-cu130")
    cmd = server_command(stack, target=tmp_path, draft=None, k=2, host="127.0.0.1", port=1, arch="sm_100a")
    assert cmd[cmd.index("--attention-backend") + 1] == "TRITON_ATTN"
    assert "--speculative-config" not in cmd
    hopper = server_command(stack, target=tmp_path, draft=None, k=2, host="127.0.0.1", port=1, arch="sm_90a")
    assert "--attention-backend" not in hopper


def test_sglang_command_drafts_k_tokens_with_one_branch(tmp_path):
    stack = load_stack("sglang-cu130")
    cmd = server_command(stack, target=tmp_path, draft=DRAFT, k=4, host="0.0.0.0", port=30001)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert cmd[cmd.index("--speculative-num-steps") + 1] == "4"
    assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "5"
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == "30001"


def test_print_command_json_and_k_override(tmp_path):
    target = _model_dir(tmp_path)
    code, out, err = run_cli("serve", "--stack", "cpu-vllm", "--target", str(target), "--print-command", "--json", "-k", "5")
    assert code == 0, err
    data = json.loads(out)
    assert data["k"] == 5 and data["arch"] is None
    assert json.loads(data["argv"][data["argv"].index("--speculative-config") + 1])["num_speculative_tokens"] == 5
    code, out, _ = run_cli("serve", "--stack", "cpu-vllm", "--target", str(target), "--print-command", "--no-draft")
    assert code == 0 and "--speculative-config" not in out and "--model" in out


def test_refusals_name_what_to_change(tmp_path):
    code, _, err = run_cli("serve", "--stack", "cpu-vllm", "--target", str(tmp_path / "missing"), "--print-command")
    assert code == 2 and "--target" in err
    code, _, err = run_cli("serve", "--stack", "cpu-vllm", "--target", str(_model_dir(tmp_path)), "-k", "0")
    assert code == 2 and ("-k" in err or "--num-speculative-tokens" in err)
    bad = _stack_copy(tmp_path, "cpu-vllm", "\n[serve]\nnum_speculative_tokens = -2\n")
    code, _, err = run_cli("serve", "--stack", str(bad), "--print-command")
    assert code == 2 and "serve.num_speculative_tokens" in err and str(bad) in err
    # The engine is not installed on this host: exit 3 with what to do, nothing started.
    if shutil.which("sglang") is None:
        try:
            import sglang  # noqa: F401
        except ImportError:
            code, _, err = run_cli("serve", "--stack", "sglang-cu130", "--target", str(_model_dir(tmp_path)))
            assert code == 3 and "not installed" in err and "docker run" in err


@pytest.mark.parametrize(
    "name", ["cpu-vllm", "vllm-cu130", "sglang-cu130", "vllm-0.26.0-torch2.11-cu130", "sglang-0.5.15-torch2.11-cu130"]
)
def test_every_stack_has_a_serving_k_of_at_least_one(name):
    assert serving_k(load_stack(name)) >= 1
