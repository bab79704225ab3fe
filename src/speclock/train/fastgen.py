"""Fast batched greedy generation for Llama-family targets: static KV cache, CUDA graph per step.

transformers' `generate` is launch-bound on a small target (a 135M model decodes at ~30 tok/s at
batch 1 on an H200, ~730 tok/s at batch 64). Data generation wants batches of hundreds with one
graph replay per token: this loop runs the target's own weights (taken from the loaded
transformers model, so the distribution is the target's) with one fixed-shape decode step that is
captured once as a CUDA graph and replayed for every step of every batch. On a CPU it runs the
same code eagerly (used by the tests to check it against transformers token for token).

Greedy by default. `temperature` > 0 samples instead (Gumbel-max over logits / temperature, with an
optional min-p cut: tokens below min_p x the top probability are never drawn); the draw happens
inside the captured graph, so sampling costs no extra launches. Used to synthesise prompts
(speclock.train.selfprompt); training responses stay greedy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speclock.core.errors import BadInput


def _rms(x, w, eps):
    dtype = x.dtype
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


class StaticLlamaGenerator:
    name = "static"

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int,
        max_prompt_tokens: int,
        max_new_tokens: int,
        use_cuda_graph: bool | None = None,
        temperature: float = 0.0,
        min_p: float = 0.0,
        stop_ids: list[int] | None = None,
    ):
        cfg = model.config
        if getattr(cfg, "model_type", "") != "llama" or getattr(cfg, "attention_bias", False):
            raise BadInput(
                f"the static generator supports Llama-style targets, not {cfg.model_type!r}",
                hint="use --generator transformers or openai",
            )
        self.cfg, self.tok = cfg, tokenizer
        if temperature < 0 or not 0 <= min_p < 1:
            raise BadInput(f"temperature must be >= 0 and min_p in [0, 1) (got {temperature}, {min_p})")
        self.temperature, self.min_p = float(temperature), float(min_p)
        self.B, self.P, self.N = batch_size, max_prompt_tokens, max_new_tokens
        self.L = max_prompt_tokens + max_new_tokens
        p = dict(model.named_parameters())
        self.dev = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.nl = cfg.num_hidden_layers
        self.h, self.kvh = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.h
        self.eps = cfg.rms_norm_eps
        rope = getattr(cfg, "rope_parameters", None) or {}
        if isinstance(rope, dict) and rope.get("rope_type", "default") not in ("default", None):
            raise BadInput(f"the static generator supports default RoPE only (target has {rope.get('rope_type')})")
        # A rope_theta that is there but null means the default, as a missing one does.
        theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or getattr(cfg, "rope_theta", None) or 10000.0
        self.theta = float(theta)
        self.embed = p["model.embed_tokens.weight"]
        self.lm_head = p.get("lm_head.weight", self.embed)
        self.final_norm = p["model.norm.weight"]
        self.layers = []
        for i in range(self.nl):
            pre = f"model.layers.{i}."
            self.layers.append(
                (
                    p[pre + "input_layernorm.weight"],
                    torch.cat(
                        [
                            p[pre + "self_attn.q_proj.weight"],
                            p[pre + "self_attn.k_proj.weight"],
                            p[pre + "self_attn.v_proj.weight"],
                        ]
                    ),
                    p[pre + "self_attn.o_proj.weight"],
                    p[pre + "post_attention_layernorm.weight"],
                    torch.cat([p[pre + "mlp.gate_proj.weight"], p[pre + "mlp.up_proj.weight"]]),
                    p[pre + "mlp.down_proj.weight"],
                )
            )
        self.stop = sorted(
            {
                int(x)
                for x in _as_list(getattr(model.generation_config, "eos_token_id", None))
                + _as_list(cfg.eos_token_id)
                + _as_list(tokenizer.eos_token_id)
                + list(stop_ids or [])
            }
        )
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop[0]
        inv = 1.0 / (self.theta ** (torch.arange(0, self.d, 2, device=self.dev, dtype=torch.float32) / self.d))
        freqs = torch.arange(self.L, device=self.dev, dtype=torch.float32)[:, None] * inv
        emb = torch.cat([freqs, freqs], -1)
        self.cos_table, self.sin_table = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        shape = (self.nl, self.B, self.kvh, self.L, self.d)
        self.kc = torch.zeros(shape, dtype=self.dtype, device=self.dev)
        self.vc = torch.zeros(shape, dtype=self.dtype, device=self.dev)
        # Static inputs of the decode step (the graph reads them by address).
        self.tok = torch.zeros(self.B, 1, dtype=torch.long, device=self.dev)
        self.pos = torch.zeros(self.B, dtype=torch.long, device=self.dev)
        self.widx = torch.zeros(1, dtype=torch.long, device=self.dev)
        self.pad_len = torch.zeros(self.B, dtype=torch.long, device=self.dev)
        self.keyidx = torch.arange(self.L, device=self.dev)
        self.next_tok = torch.zeros(self.B, dtype=torch.long, device=self.dev)
        self.use_graph = (self.dev.type == "cuda") if use_cuda_graph is None else use_cuda_graph
        self.graph = None
        self.gqa = self.h != self.kvh and _gqa_works(self.dev, self.dtype)

    # one transformer block over x [B,T,H] at positions pos [B,T]; writes K/V at cache slots `slots`
    def _block(self, i, x, cos, sin, mask, write):
        ln1, wqkv, wo, ln2, wgu, wd = self.layers[i]
        B, T, _ = x.shape
        h = _rms(x, ln1, self.eps)
        qkv = h @ wqkv.t()
        q, k, v = qkv.split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q = q.view(B, T, self.h, self.d).transpose(1, 2)
        k = k.view(B, T, self.kvh, self.d).transpose(1, 2)
        v = v.view(B, T, self.kvh, self.d).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        keys, values = write(i, k, v)
        if self.gqa:  # the KV heads serve their query groups without copying the whole cache each step
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        else:
            rep = self.h // self.kvh
            attn = F.scaled_dot_product_attention(
                q, keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1), attn_mask=mask
            )
        x = x + attn.transpose(1, 2).reshape(B, T, -1) @ wo.t()
        gu = _rms(x, ln2, self.eps) @ wgu.t()
        g, u = gu.chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ wd.t()

    def _logits(self, x):
        return _rms(x, self.final_norm, self.eps) @ self.lm_head.t()

    def _pick(self, logits):
        """[B, V] logits -> [B] next tokens: argmax, or a tempered min-p draw (Gumbel-max)."""
        if self.temperature <= 0:
            return logits.argmax(-1)
        z = logits.float() / self.temperature
        if self.min_p > 0:
            p = z.softmax(-1)
            z = z.masked_fill(p < self.min_p * p.amax(-1, keepdim=True), float("-inf"))
        u = torch.rand_like(z).clamp_(min=1e-20)
        return (z - torch.log(-torch.log(u))).argmax(-1)

    def _decode_step(self):
        x = self.embed[self.tok]
        cos, sin = self.cos_table[self.pos][:, None, None], self.sin_table[self.pos][:, None, None]
        valid = (self.keyidx[None] >= self.pad_len[:, None]) & (self.keyidx[None] <= self.widx)
        mask = valid[:, None, None, :]

        def write(i, k, v):
            self.kc[i].index_copy_(2, self.widx, k)
            self.vc[i].index_copy_(2, self.widx, v)
            return self.kc[i], self.vc[i]

        for i in range(self.nl):
            x = self._block(i, x, cos, sin, mask, write)
        self.next_tok.copy_(self._pick(self._logits(x)[:, -1]))

    def _prefill(self, ids, pad_len, P):
        pos = (torch.arange(P, device=self.dev)[None] - pad_len[:, None]).clamp(min=0)
        cos, sin = self.cos_table[pos][:, None], self.sin_table[pos][:, None]
        kidx = torch.arange(P, device=self.dev)
        mask = ((kidx[None, None] <= kidx[None, :, None]) & (kidx[None, None] >= pad_len[:, None, None]))[:, None]
        # rows that are all padding would give NaN: let them see themselves
        mask = mask | torch.eye(P, dtype=torch.bool, device=self.dev)[None, None]

        def write(i, k, v):
            self.kc[i, :, :, :P] = k
            self.vc[i, :, :, :P] = v
            return k, v

        x = self.embed[ids]
        for i in range(self.nl):
            x = self._block(i, x, cos, sin, mask, write)
        return self._pick(self._logits(x[:, -1:])[:, -1])

    @torch.inference_mode()
    def generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        out: list[list[int]] = []
        for s in range(0, len(prompt_ids), self.B):
            out.extend(self._generate_batch(prompt_ids[s : s + self.B]))
        return out

    def _generate_batch(self, prompts: list[list[int]]) -> list[list[int]]:
        n = len(prompts)
        if max(map(len, prompts)) > self.P:
            raise BadInput(f"a prompt is longer than max_prompt_tokens={self.P}")
        rows = prompts + [prompts[0]] * (self.B - n)  # fixed batch shape for the graph
        P = max(map(len, rows))
        ids = torch.full((self.B, P), self.pad, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, P - len(r) :] = torch.tensor(r)
        ids = ids.to(self.dev)
        pad_len = torch.tensor([P - len(r) for r in rows], device=self.dev)
        self.kc.zero_()
        self.vc.zero_()
        self.pad_len.copy_(pad_len)
        first = self._prefill(ids, pad_len, P)
        stop = torch.tensor(self.stop, device=self.dev)
        toks = [first]
        done = torch.isin(first, stop)
        self.tok[:, 0] = first
        for t in range(self.N - 1):
            self.pos.copy_(P + t - pad_len)
            self.widx.fill_(P + t)
            if self.use_graph and self.graph is None and t >= 2:
                self._capture()
            if self.graph is not None:
                self.graph.replay()
            else:
                self._decode_step()
            nxt = self.next_tok.clone()
            toks.append(nxt)
            done |= torch.isin(nxt, stop)
            self.tok[:, 0] = nxt
            if t % 16 == 15 and bool(done[:n].all()):
                break
        seqs = torch.stack(toks, 1).tolist()
        result = []
        for row in seqs[:n]:
            for j, tk in enumerate(row):
                if tk in self.stop:
                    row = row[: j + 1]
                    break
            result.append(row)
        return result

    def _capture(self):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self._decode_step()  # warm-up (recomputes the current step; same inputs, same result)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self._decode_step()
        self.graph = g


def _gqa_works(dev, dtype) -> bool:
    try:
        q = torch.zeros(1, 4, 2, 8, device=dev, dtype=dtype)
        kv = torch.zeros(1, 2, 3, 8, device=dev, dtype=dtype)
        m = torch.ones(1, 1, 2, 3, dtype=torch.bool, device=dev)
        F.scaled_dot_product_attention(q, kv, kv, attn_mask=m, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _as_list(v):
    if v is None:
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]
