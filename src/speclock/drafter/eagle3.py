"""The EAGLE-3 drafter as a plain PyTorch module, with training-time test and incremental decoding.

Architecture (the one vLLM's `LlamaForCausalLMEagle3` and SGLang's `LlamaForCausalLMEagle3` run):
  fc: Linear(3H -> H) over the concatenated aux hidden states of the target;
  midlayer: one Llama decoder layer whose attention input is [input_layernorm(embed(token)),
  hidden_norm(hidden)] (2H wide), with the residual taken from the un-normed hidden;
  norm, lm_head over a reduced draft vocabulary; `d2t[d]` = target id - draft id, `t2d` a mask.
Token embeddings come from the target and are not part of the drafter's checkpoint.

At drafting step s (0-based) for anchor position t, the drafter reads token x[t+1+s] and, for
s = 0, fc(aux[t]); for s > 0, its own pre-norm output of step s-1. It runs at rotary position
t+s and attends to the step-0 keys of positions <= t plus its own chain's keys of steps 1..s.
`ttt_forward` unrolls exactly this over every anchor of a sequence at once (training-time test);
`DraftCache` + `forward_incremental` do the same one step at a time (reference decoder).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DrafterConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    draft_vocab_size: int
    max_position_embeddings: int = 8192
    num_aux: int = 3

    @classmethod
    def from_target(cls, tcfg: Any, draft_vocab_size: int) -> DrafterConfig:
        rope = getattr(tcfg, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        # A rope_theta that is there but null means the default, as a missing one does.
        theta = theta or getattr(tcfg, "rope_theta", None) or 10000.0
        heads = tcfg.num_attention_heads
        return cls(
            hidden_size=tcfg.hidden_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(tcfg, "num_key_value_heads", heads),
            head_dim=getattr(tcfg, "head_dim", None) or tcfg.hidden_size // heads,
            intermediate_size=tcfg.intermediate_size,
            rms_norm_eps=tcfg.rms_norm_eps,
            rope_theta=float(theta),
            vocab_size=tcfg.vocab_size,
            draft_vocab_size=draft_vocab_size,
            max_position_embeddings=getattr(tcfg, "max_position_embeddings", 8192),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, heads, T, d); cos/sin: (B or 1, T, d)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class Attention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        B, T, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, x.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        rep = self.c.num_attention_heads // self.c.num_key_value_heads
        return t if rep == 1 else t.repeat_interleave(rep, dim=1)


class MLP(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def attn_input(self, embeds, hidden):
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, attn_out, residual):
        """attention output + residual -> MLP -> (pre-final-norm residual stream)."""
        residual = residual + attn_out
        return residual + self.mlp(self.post_attention_layernorm(residual))

    def ttt_step(self, embeds, hidden, positions, attend):
        """One unrolled TTT step of the layer: every use of its weights happens here, so FSDP2 can
        gather them around this call (register_fsdp_forward_method). `attend(q, k, v)` (k, v already
        expanded to all heads) does the step's weight-free attention and returns [B,T,heads*d]."""
        attn = self.self_attn
        q, k, v = attn.qkv(self.attn_input(embeds, hidden), positions)
        out = attend(q, attn.expand_kv(k), attn.expand_kv(v))
        return self.finish(attn.o_proj(out), hidden)


@dataclass
class DraftCache:
    """Keys/values of the drafter's attention for one sequence (batch 1): context, then speculative."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def crop(self, n: int) -> None:
        if self.k is not None and self.v is not None:  # set together by forward_incremental
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


class Eagle3Drafter(nn.Module):
    # Buffers (register_buffer): declared so that they read as tensors, not as nn.Module.__getattr__'s union.
    d2t: torch.Tensor
    t2d: torch.Tensor
    embed_tokens: torch.Tensor

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.config = c
        self.fc = nn.Linear(c.num_aux * c.hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        # The target's embeddings: used, never trained, never exported.
        self.register_buffer("embed_tokens", torch.zeros(c.vocab_size, c.hidden_size), persistent=False)

    # --- vocabulary -------------------------------------------------------------------------
    def set_vocab(self, draft_to_target: torch.Tensor) -> None:
        """draft id -> target id (sorted ascending), as chosen from token frequencies."""
        d2t_ids = draft_to_target.to(self.d2t.device, torch.long)
        self.d2t.copy_(d2t_ids - torch.arange(len(d2t_ids), device=d2t_ids.device))
        self.t2d.zero_()
        self.t2d[d2t_ids] = True

    def draft_to_target_ids(self) -> torch.Tensor:
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def init_from_target(self, embed: torch.Tensor, lm_head: torch.Tensor, final_norm: torch.Tensor) -> None:
        """Embeddings (frozen), and lm_head/norm started from the target's rows for the draft vocab."""
        with torch.no_grad():
            self.embed_tokens = embed.detach().to(self.fc.weight.dtype).clone()
            self.lm_head.weight.copy_(lm_head[self.draft_to_target_ids()].to(self.lm_head.weight.dtype))
            self.norm.weight.copy_(final_norm.to(self.norm.weight.dtype))

    # --- training: training-time test ---------------------------------------------------------
    def ttt_forward(self, input_ids: torch.Tensor, aux: torch.Tensor, steps: int, normed_only: bool = False):
        """Unroll `steps` drafting steps over every anchor. Returns per step (logits [B,T,Vd]) where
        step s at index i predicts token i+2+s (from target position i+1+s). input_ids: [B,T];
        aux: [B,T,3H]. normed_only: the final-norm outputs [B,T,H] instead of logits (for the
        fused loss, which applies lm_head itself without materialising the logits)."""
        B, T = input_ids.shape
        scale = 1.0 / math.sqrt(self.config.head_dim)
        hidden = self.fc(aux)
        base_pos = torch.arange(T, device=input_ids.device)[None].expand(B, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
        k0 = v0 = None
        chain_k: list[torch.Tensor] = []
        chain_v: list[torch.Tensor] = []
        outputs = []

        def attend(q, k, v):
            nonlocal k0, v0
            if k0 is None:
                k0, v0 = k, v
                scores = (q @ k0.transpose(-1, -2)) * scale
                scores = scores.float().masked_fill(~causal, float("-inf"))
                probs = scores.softmax(-1).to(q.dtype)
                out = probs @ v0
            else:
                chain_k.append(k)
                chain_v.append(v)
                s0 = ((q @ k0.transpose(-1, -2)) * scale).float().masked_fill(~causal, float("-inf"))
                diag = torch.stack([(q * ck).sum(-1) * scale for ck in chain_k], dim=-1).float()
                probs = torch.cat([s0, diag], dim=-1).softmax(-1).to(q.dtype)
                out = probs[..., :T] @ v0
                for r, cv in enumerate(chain_v):
                    out = out + probs[..., T + r, None] * cv
            return out.transpose(1, 2).reshape(B, T, -1)

        for s in range(steps):
            ids = F.pad(input_ids[:, 1 + s :], (0, 1 + s), value=0)
            residual = self.midlayer.ttt_step(self.embed_tokens[ids], hidden, base_pos + s, attend)
            normed = self.norm(residual)
            outputs.append(normed if normed_only else self.lm_head(normed))
            hidden = residual
        return outputs

    # --- inference: one sequence, incremental ------------------------------------------------
    def forward_incremental(
        self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: DraftCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [1,n], hidden [1,n,3H] (target aux, fc applied here) or [1,n,H] (own output),
        positions [n]. Appends n keys to `cache`; returns (draft logits [1,n,Vd], pre-norm [1,n,H])."""
        if hidden.shape[-1] != self.config.hidden_size:
            hidden = self.fc(hidden)
        attn = self.midlayer.self_attn
        x = self.midlayer.attn_input(self.embed_tokens[ids], hidden)
        q, k, v = attn.qkv(x, positions[None])
        past = cache.length
        cache.k = k if cache.k is None else torch.cat([cache.k, k], dim=2)
        cache.v = v if cache.v is None else torch.cat([cache.v, v], dim=2)
        n, total = ids.shape[1], cache.length
        mask = torch.ones(n, total, dtype=torch.bool, device=ids.device)
        mask[:, past:] = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
        out = F.scaled_dot_product_attention(q, attn.expand_kv(cache.k), attn.expand_kv(cache.v), attn_mask=mask)
        out = out.transpose(1, 2).reshape(1, n, -1)
        residual = self.midlayer.finish(attn.o_proj(out), hidden)
        return self.lm_head(self.norm(residual)), residual


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
