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

Run-time JIT (read in sglang 0.5.15): on CUDA, SGLang compiles some kernels at their first call through
tvm_ffi (sglang/jit_kernel/utils.py:load_jit -> tvm_ffi.cpp.load_inline): the fused RoPE
(jit_kernel/rope.py, called by srt/layers/rotary_embedding/base.py:RotaryEmbedding.forward_cuda), SiluAndMul
(jit_kernel/activation.py), decode positions (jit_kernel/clamp_position.py) and the KV-cache store
(jit_kernel/kvcache.py, with a fallback). tvm_ffi runs $CUDA_HOME/bin/nvcc (CUDA_HOME or CUDA_PATH, else
nvcc on PATH) and links with $CXX (default c++) against $CUDA_HOME/lib64/libcudart.so. The lock's CUDA wheels
(nvidia/cu13: nvcc, nvvm, crt, runtime, cccl) hold all of it except that path: `jit_env` gives SGLang a
CUDA_HOME made of links to them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.jsonread import parse_json
from speclock.core.layout import cache_dir
from speclock.drafter.models import config_architecture, config_layer_count, read_model_config
from speclock.engines import EngineConfig, SpecCounters, aux_layer_ids, package_version
from speclock.engines.http import http, map_bounded
from speclock.engines.prometheus import counter_samples
from speclock.spec.eagle3_layers import sglang_after_layers
from speclock.spec.k_schedule import write_sglang_adaptive_config

NAME = "sglang"


def version(package: str = "sglang") -> str:
    return package_version(package)


def wheel_cuda_roots(search: list[Path]) -> list[Path]:
    """The CUDA trees PyPI's CUDA 12/13 wheels install (<site>/nvidia/cu13), in search order, of the release whose
    first tree has nvcc in bin/; [] when none has. Wheels of one release may sit in several site-packages: a host
    environment takes nvidia-cuda-runtime (cuda_runtime.h) from the host's and nvcc from its own (measured on the
    host-env of sglang-0.5.15-torch2.11-cu130: "cuda_runtime.h: No such file or directory" with one tree)."""
    trees = [cand for root in search for cand in sorted(Path(root).glob("nvidia/cu1[0-9]"), reverse=True) if cand.is_dir()]
    with_nvcc = [t for t in trees if (t / "bin" / "nvcc").is_file()]
    if not with_nvcc:
        return []
    release = with_nvcc[0].name
    return [t for t in trees if t.name == release]


def _cudart(roots: list[Path]) -> Path | None:
    for root in roots:
        found = sorted((root / "lib").glob("libcudart.so.[0-9]*"))
        if found:
            return found[0]
    return None


def _link_tree(src: Path, dest: Path) -> None:
    """Folders made, files linked; a file already there (from an earlier tree) wins."""
    dest.mkdir(exist_ok=True)
    for entry in sorted(src.iterdir()):
        target = dest / entry.name
        if entry.is_dir():
            _link_tree(entry, target)
        elif not (target.exists() or target.is_symlink()):
            target.symlink_to(entry.resolve())


def cuda_home_shim(cuda_roots: list[Path], into: Path) -> Path:
    """A CUDA_HOME folder: the wheels' trees merged by links (the first tree's file wins), plus the one path tvm_ffi
    links against that the wheels lack: lib64/libcudart.so (they ship lib/libcudart.so.13 only). Made once (renamed
    into place), keyed by the trees it merges."""
    key = hashlib.sha256("\n".join(str(r.resolve()) for r in cuda_roots).encode()).hexdigest()[:16]
    home = into / f"cuda-home-{key}"
    if (home / "lib64" / "libcudart.so").exists() and (home / "bin" / "nvcc").exists():
        return home
    into.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=into, prefix=".tmp-cuda-home."))
    try:
        for root in cuda_roots:
            _link_tree(root, tmp)
        cudart = _cudart(cuda_roots)
        if cudart is not None:
            (tmp / "lib64").mkdir(exist_ok=True)
            (tmp / "lib64" / "libcudart.so").symlink_to(cudart.resolve())
        try:
            os.replace(tmp, home)
        except OSError:  # made meanwhile by another process
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home


def _default_search() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def jit_env(env: Mapping[str, str], search: list[Path] | None = None, into: Path | None = None) -> dict[str, str]:
    """Variables SGLang's run-time JIT needs on top of `env`: CUDA_HOME at the lock's CUDA wheels, unless env's
    CUDA_HOME / CUDA_PATH already is a toolkit (bin/nvcc and lib64/libcudart.so). {} when no wheel has nvcc."""
    given = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if given and (Path(given) / "bin" / "nvcc").is_file() and (Path(given) / "lib64" / "libcudart.so").exists():
        return {}
    roots = wheel_cuda_roots(search if search is not None else _default_search())
    if not roots:
        return {}
    home = str(cuda_home_shim(roots, into or cache_dir() / "cuda-home"))
    # CUDA_PATH too: cuda-python's pathfinder reads it before CUDA_HOME ("Using CUDA_PATH (highest priority)" with a
    # stale one beside the adapter's CUDA_HOME on the H100 run of 2026-12-06)
    return {"CUDA_HOME": home, "CUDA_PATH": home}


def spec_args(config: EngineConfig) -> dict[str, Any]:  # SGLang's Engine(**args), with the stack's free-form settings
    """SGLang server arguments (ServerArgs field names) for the stack's settings and the drafter."""
    args: dict[str, Any] = {"model_path": str(config.target), "enable_metrics": True}
    args.update(config.settings)
    if config.draft is not None:
        k = config.num_speculative_tokens
        args.update(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=str(config.draft),
            speculative_num_steps=k,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=k + 1,
        )
        if config.k_per_batch_size:  # k per load: adaptive slots with one candidate each (speclock.spec.k_schedule)
            if k not in {row[2] for row in config.k_per_batch_size}:  # SGLang starts at one of the slots' steps
                raise BadInput(
                    f"k = {k} is not a k of engine.k_per_batch_size {[list(r) for r in config.k_per_batch_size]}",
                    hint="SGLang starts its adaptive slots at one of their steps: draft one of those k "
                    "(serve.num_speculative_tokens), or add a range that drafts this k",
                )
            path = write_sglang_adaptive_config(config.k_per_batch_size, cache_dir() / "sglang-adaptive")
            args.update(speculative_adaptive=True, speculative_adaptive_config=str(path))
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


def counters_from_meta(metas: list[dict[str, Any]], k: int) -> SpecCounters:  # metas: the server's meta_info JSON
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


def server_info_delta(
    before: dict[str, Any],  # /server_info JSON, the server's own open-ended document
    after: dict[str, Any],
    verify_before: int,
    verify_run: int,
) -> float | None:
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
    samples = [
        s
        for s in counter_samples(body, "sglang:spec_verify_calls", server="SGLang server", url=url)
        if s.name == "sglang:spec_verify_calls"
    ]
    return sum(s.value for s in samples) if samples else None


# Layers SGLang captures for a drafter's aux ids (the rule lives in spec/, where `stack new` applies it too).
captured_layers_for = sglang_after_layers


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
            raise EnvironmentProblem(
                f"SGLang is not importable here: {err}", hint="run inside an SGLang image on a GPU host"
            ) from None
        self._saved_env = {k: os.environ.get(k) for k in ("CUDA_HOME",)}
        os.environ.update(jit_env(os.environ))  # SGLang's JIT kernels compile at the first forward
        self.engine = sglang.Engine(**spec_args(config))

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        params = {"temperature": 0.0, "max_new_tokens": max_tokens}
        return self._take(self.engine.generate(input_ids=prompts, sampling_params=params))

    def stop(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.shutdown()
        for k, v in getattr(self, "_saved_env", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 600) -> bytes:  # body: as engines.http says
    return http(url, body, timeout, server="SGLang server")


def _reply(url: str, body: dict[str, Any] | None = None, *, expect: type | tuple[type, ...] = dict) -> Any:
    """The server's JSON answer; a damaged one is the server's fault (exit 3), naming the URL."""
    data = _http(url, body)
    return parse_json(data, url, what="SGLang server's reply", expect=expect, error=EnvironmentProblem, allow_nan=True)


class ServerSession(_MetaSession):
    """A running SGLang server; counters from its answers, /server_info read around each batch."""

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.base = config.server_url.rstrip("/")
        self.server_info_lengths: list[float | None] = []

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """One /generate request per prompt, up to config.concurrency in flight; results in prompt order."""
        before = _reply(f"{self.base}/server_info")
        url = f"{self.base}/metrics"
        v0 = verify_calls_from_prometheus(_http(url), url)
        params = {"temperature": 0.0, "max_new_tokens": max_tokens}

        def one(p: list[int]) -> dict[str, Any]:
            result = _reply(f"{self.base}/generate", {"input_ids": p, "sampling_params": params}, expect=(dict, list))
            one_result: dict[str, Any] = result[0] if isinstance(result, list) else result  # the server's JSON
            return one_result

        results = map_bounded(one, prompts, self.config.concurrency)
        outputs = self._take(results)
        after = _reply(f"{self.base}/server_info")
        run = counters_from_meta([r.get("meta_info") or {} for r in results], self.config.num_speculative_tokens)
        self.server_info_lengths.append(None if v0 is None else server_info_delta(before, after, v0, run.num_drafts))
        return outputs

    def stop(self) -> None:
        pass


def start(config: EngineConfig) -> ServerSession | OfflineSession:
    return ServerSession(config) if config.server_url else OfflineSession(config)
