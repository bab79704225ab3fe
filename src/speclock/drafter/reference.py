"""speclock's reference speculative decoder: PyTorch + transformers, greedy chain drafting, batch 1.

The independent judge of a drafter. For each prompt: the target prefills and picks the first
token; then, repeatedly, the EAGLE-3 drafter proposes k tokens (a greedy chain), the target scores
[last token, drafts] in one forward pass, the longest prefix of drafts equal to the target's own
greedy choices is accepted, and the target's next choice is appended (the bonus token). The
output is therefore exactly the target's greedy output (lossless), whatever the drafter does.

Counters follow vLLM's: per verification step num_drafts += 1, num_draft_tokens += k,
num_accepted_tokens += accepted, accepted_per_position[j] += 1 for each accepted position j.
Like vLLM, drafts accepted past max_tokens or past an end-of-sequence token are still counted;
the returned text is cut at either.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from speclock.core.errors import BadInput
from speclock.drafter.counters import SpecCounters
from speclock.drafter.models import read_model_config


def eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), getattr(model.config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return ids


def _aux(hidden_states, layers_after: list[int]):
    # heavy, optional (torch): imported only where it is used
    import torch

    return torch.cat([hidden_states[k] for k in layers_after], dim=-1)


def greedy_generate(target, prompt_ids: list[int], max_tokens: int, stop: set[int]) -> list[int]:
    """Plain greedy decoding of the target, one token per forward pass (the no-drafter baseline)."""
    # heavy, optional (torch, transformers): imported only where it is used
    import torch
    from transformers import DynamicCache

    dev = next(target.parameters()).device
    cache = DynamicCache()
    ids = torch.tensor([prompt_ids], device=dev)
    out: list[int] = []
    with torch.inference_mode():
        while len(out) < max_tokens:
            logits = target(input_ids=ids, past_key_values=cache, use_cache=True).logits
            tok = int(logits[0, -1].argmax())
            out.append(tok)
            if tok in stop:
                break
            ids = torch.tensor([[tok]], device=dev)
    return out


def speculative_generate(
    target,
    drafter,
    aux_layers_after: list[int],
    prompt_ids: list[int],
    k: int,
    max_tokens: int,
    stop: set[int],
    counters: SpecCounters,
) -> list[int]:
    """Greedy speculative decoding of one prompt; updates `counters`; returns the new tokens."""
    # heavy, optional (torch, transformers): imported only where it is used
    import torch
    from transformers import DynamicCache

    from speclock.drafter.eagle3 import DraftCache

    dev = next(target.parameters()).device
    d2t_ids = drafter.draft_to_target_ids()
    tcache, dcache = DynamicCache(), DraftCache()
    with torch.inference_mode():
        o = target(
            input_ids=torch.tensor([prompt_ids], device=dev), past_key_values=tcache, use_cache=True, output_hidden_states=True
        )
        aux = _aux(o.hidden_states, aux_layers_after)
        seq = list(prompt_ids)
        first = int(o.logits[0, -1].argmax())
        seq.append(first)
        out = [first]
        ctx_start = 0  # drafter context entries exist for positions < ctx_start
        while out[-1] not in stop and len(out) < max_tokens:
            n = len(seq) - 1  # position of the newest token, whose target hidden state is not known yet
            # 1. drafter context: positions ctx_start..n-1 from target aux states, token at p+1
            dcache.crop(ctx_start)
            pos = torch.arange(ctx_start, n, device=dev)
            ids = torch.tensor([seq[ctx_start + 1 : n + 1]], device=dev)
            logits, hid = drafter.forward_incremental(ids, aux[:, -(n - ctx_start) :], pos, dcache)
            ctx_start = n
            drafts = [int(d2t_ids[int(logits[0, -1].argmax())])]
            g = hid[:, -1:]
            for j in range(1, k):
                logits, g = drafter.forward_incremental(
                    torch.tensor([[drafts[-1]]], device=dev), g, torch.tensor([n - 1 + j], device=dev), dcache
                )
                drafts.append(int(d2t_ids[int(logits[0, -1].argmax())]))
            # 2. verification: the target scores [newest token, drafts] at positions n..n+k
            o = target(
                input_ids=torch.tensor([[seq[-1]] + drafts], device=dev),
                past_key_values=tcache,
                use_cache=True,
                output_hidden_states=True,
            )
            choice = o.logits[0].argmax(-1).tolist()
            accepted = 0
            while accepted < k and drafts[accepted] == choice[accepted]:
                accepted += 1
            counters.add(accepted)
            new = drafts[:accepted] + [choice[accepted]]
            _crop(tcache, n + 1 + accepted)
            aux = _aux(o.hidden_states, aux_layers_after)[:, : accepted + 1]
            seq.extend(new)
            for tok in new:
                out.append(tok)
                if tok in stop or len(out) >= max_tokens:
                    break
        return out[:max_tokens]


def _crop(cache, keep: int) -> None:
    """Keep the first `keep` positions of a transformers cache (negative crop: portable across versions)."""
    drop = cache.get_seq_length() - keep
    if drop > 0:
        cache.crop(-drop)


@dataclass
class ReferenceRun:
    metrics: dict
    outputs: list[list[int]]
    tokens: int
    seconds: float
    device: str
    dtype: str


def load_target(target_dir: str | Path, device: str = "cpu", dtype: str | None = None):
    """(model, tokenizer) of a Hugging Face target folder; float32 on CPU, bfloat16 on GPU by default."""
    # heavy, optional (torch, transformers): imported only where it is used
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir = Path(target_dir)
    read_model_config(target_dir, what="target")  # a missing, binary or misshapen config.json is BadInput, named
    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=getattr(torch, dtype))
    # transformers types PreTrainedModel.to as functools.wraps(nn.Module.to), which mypy cannot bind as a method
    model = model.to(device).eval()  # type: ignore[arg-type]
    return model, tok


def run_reference(
    target, tokenizer, drafter, aux_layers_after: list[int], prompt_ids: list[list[int]], k: int, max_tokens: int, progress=None
) -> ReferenceRun:
    # heavy, optional (torch): imported only where it is used
    import torch

    if k < 1:
        raise BadInput(f"k must be at least 1 (got {k})")
    stop = eos_ids(target, tokenizer)
    counters = SpecCounters(k=k)
    outputs = []
    t0 = time.perf_counter()
    for i, ids in enumerate(prompt_ids):
        outputs.append(speculative_generate(target, drafter, aux_layers_after, ids, k, max_tokens, stop, counters))
        if progress:
            progress(i + 1, len(prompt_ids), counters.reference_metrics())
    dev = next(target.parameters()).device
    if dev.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    return ReferenceRun(
        counters.reference_metrics(),
        outputs,
        sum(map(len, outputs)),
        secs,
        str(dev),
        str(next(target.parameters()).dtype).replace("torch.", ""),
    )


def run_baseline(target, tokenizer, prompt_ids: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    # heavy, optional (torch): imported only where it is used
    import torch

    stop = eos_ids(target, tokenizer)
    t0 = time.perf_counter()
    outs = [greedy_generate(target, ids, max_tokens, stop) for ids in prompt_ids]
    if next(target.parameters()).device.type == "cuda":
        torch.cuda.synchronize()
    return outs, time.perf_counter() - t0
