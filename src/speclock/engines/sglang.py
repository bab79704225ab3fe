"""SGLang: the offline `sglang.Engine`, or a running server (`python -m sglang.launch_server`).

Verified against sglang 0.5.23's source; it runs only on GPU hosts (this path is not exercised on
a CPU machine). EAGLE-3 is `--speculative-algorithm EAGLE3` with num_steps = k, topk = 1 (a
chain, like vLLM's) and num_draft_tokens = k + 1.

Counters: each finished request's `meta_info` carries `spec_verify_ct` (verify steps = drafts),
`spec_num_correct_drafts` (accepted draft tokens) and `spec_correct_drafts_histogram` (steps
that accepted n drafts), so a session sums them into exact per-run counters. A server's
`/server_info` `internal_states[i].avg_spec_accept_length` is an average since server start
(flushed every decode-log interval), so it only yields a per-run figure as a delta weighted by
verify counts: `server_info_delta`.
"""

from __future__ import annotations

import json
from typing import Any

from speclock.core.errors import EnvironmentProblem
from speclock.drafter.models import config_architecture, config_layer_count, read_model_config
from speclock.engines import aux_layer_ids, EngineConfig, package_version, SpecCounters
from speclock.engines.http import http, map_bounded
from speclock.engines.prometheus import counter_samples

NAME = "sglang"


def version(package: str = "sglang") -> str:
    return package_version(package)


def spec_args(config: EngineConfig) -> dict[str, Any]:
    """SGLang server arguments (ServerArgs field names) for the stack's settings and the drafter."""
    args: dict[str, Any] = {"model_path": str(config.target), "enable_metrics": True}
    args.update(config.settings)
    if config.draft is not None:
        k = config.num_speculative_tokens
        args.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(config.draft),
                    speculative_num_steps=k, speculative_eagle_topk=1, speculative_num_draft_tokens=k + 1)
    return args


def launch_command(config: EngineConfig, port: int = 30000, python: str = "python") -> list[str]:
    """`python -m sglang.launch_server ...` for the same arguments (ServerArgs field -> --kebab-case flag)."""
    cmd = [python, "-m", "sglang.launch_server"]
    for key, value in spec_args(config).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value is False or value is None:
            continue
        else:
            cmd += [flag, str(value)]
    return cmd + ["--port", str(port)]


def counters_from_meta(metas: list[dict[str, Any]], k: int) -> SpecCounters:
    """Sum finished requests' meta_info into vLLM-style counters (drafts = verify steps)."""
    drafts = accepted = 0
    per_pos = [0] * k
    for meta in metas:
        verify = int(meta.get("spec_verify_ct") or 0)
        drafts += verify
        accepted += int(meta.get("spec_num_correct_drafts") or 0)
        hist = meta.get("spec_correct_drafts_histogram") or []
        for n_acc, steps in enumerate(hist):  # a step that accepted n drafts accepted positions 1..n
            for pos in range(min(n_acc, k)):
                per_pos[pos] += int(steps)
    return SpecCounters(drafts, drafts * k, accepted, tuple(per_pos))


def server_info_delta(before: dict[str, Any], after: dict[str, Any], verify_before: int, verify_run: int) -> float | None:
    """Mean acceptance length of one run from two `/server_info` answers.

    avg_spec_accept_length = accepted tokens (incl. bonus) / verify steps, since start. With the
    server's verify count before the run (`sglang:spec_verify_calls_total`) and the run's own:
    run length = (avg_after * (V0 + Vr) - avg_before * V0) / Vr. None when the server reports none.
    """
    a0, a1 = _avg_accept_length(before), _avg_accept_length(after)
    if a1 is None or verify_run <= 0:
        return None
    return (a1 * (verify_before + verify_run) - (a0 or 0.0) * verify_before) / verify_run


def _avg_accept_length(info: dict[str, Any]) -> float | None:
    states = info.get("internal_states") or []
    values = [s["avg_spec_accept_length"] for s in states if isinstance(s, dict) and s.get("avg_spec_accept_length") is not None]
    return sum(values) / len(values) if values else None


def verify_calls_from_prometheus(body: bytes | str, url: str = "/metrics") -> int | None:
    """`sglang:spec_verify_calls_total` summed over label sets; None when the server has no such counter
    (started without --enable-metrics, or without a drafter). Parsed by prometheus_client."""
    samples = [s for s in counter_samples(body, "sglang:spec_verify_calls", server="SGLang server", url=url)
               if s.name == "sglang:spec_verify_calls"]
    return sum(s.value for s in samples) if samples else None


def captured_layers_for(aux_ids: list[int], target_arch: str) -> list[int]:
    """Layers SGLang captures for a drafter's aux ids: +1 for Llama/Qwen-style targets; for
    DeepseekV2/V3 only when ids[0] == 1 (sglang 0.5.23 model code)."""
    if target_arch.startswith(("DeepseekV2", "DeepseekV3")):
        return [i + 1 for i in aux_ids] if aux_ids and aux_ids[0] == 1 else list(aux_ids)
    return [i + 1 for i in aux_ids]


class _MetaSession:
    """Shared: a session whose counters are the sum of its requests' meta_info."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.metas: list[dict[str, Any]] = []

    def counters(self) -> SpecCounters:
        return counters_from_meta(self.metas, self.config.num_speculative_tokens)

    def captured_layers(self) -> list[int] | None:
        if self.config.draft is None:
            return None

        tcfg = read_model_config(self.config.target, what="target")
        ids, _ = aux_layer_ids(self.config.draft, config_layer_count(tcfg))
        return captured_layers_for(ids, config_architecture(tcfg) or "")

    def _take(self, results: list[dict[str, Any]]) -> list[list[int]]:
        self.metas += [r.get("meta_info") or {} for r in results]
        return [list(r["output_ids"]) for r in results]


class OfflineSession(_MetaSession):
    def __init__(self, config: EngineConfig):
        super().__init__(config)
        try:
            # heavy, optional (sglang): imported only where it is used
            import sglang
        except ImportError as err:
            raise EnvironmentProblem(f"SGLang is not importable here: {err}", hint="run inside an SGLang image on a GPU host") from None
        self.engine = sglang.Engine(**spec_args(config))

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        params = {"temperature": 0.0, "max_new_tokens": max_tokens}
        return self._take(self.engine.generate(input_ids=prompts, sampling_params=params))

    def stop(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.shutdown()


def _http(url: str, body: dict | None = None, timeout: float = 600) -> bytes:
    return http(url, body, timeout, server="SGLang server")


class ServerSession(_MetaSession):
    """A running SGLang server; counters from its answers, /server_info read around each batch."""

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.base = config.server_url.rstrip("/")
        self.server_info_lengths: list[float | None] = []

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """One /generate request per prompt, up to config.concurrency in flight; results in prompt order."""
        before = json.loads(_http(f"{self.base}/server_info"))
        url = f"{self.base}/metrics"
        v0 = verify_calls_from_prometheus(_http(url), url)
        params = {"temperature": 0.0, "max_new_tokens": max_tokens}

        def one(p: list[int]) -> dict[str, Any]:
            result = json.loads(_http(f"{self.base}/generate", {"input_ids": p, "sampling_params": params}))
            return result[0] if isinstance(result, list) else result

        results = map_bounded(one, prompts, self.config.concurrency)
        outputs = self._take(results)
        after = json.loads(_http(f"{self.base}/server_info"))
        run = counters_from_meta([r.get("meta_info") or {} for r in results], self.config.num_speculative_tokens)
        self.server_info_lengths.append(None if v0 is None else server_info_delta(before, after, v0, run.num_drafts))
        return outputs

    def stop(self) -> None:
        pass


def start(config: EngineConfig):
    return ServerSession(config) if config.server_url else OfflineSession(config)
