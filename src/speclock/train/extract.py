"""Hidden-state extraction: one prefill pass of the target over prompt+response, stored in shards.

For each sequence the shard keeps, per token: the token id, a loss mask (1 on response tokens),
the three aux hidden states concatenated ("hidden state after k decoder layers", k in
aux_layers_after; transformers' hidden_states[k]) and the target's final hidden state after its
final norm (hidden_states[N]), from which training recomputes the target's logits with the
target's lm_head instead of storing 49k logits per token.

Three stores (index key "store"):
  bf16:    (3H + H) * 2 + 4 (id, int32) + 1 (mask) = 4613 bytes per token for H = 576.
  fp8:     the three aux states as float8 e4m3 codes with one float32 scale per token and layer
           (speclock.kernels.fp8_pack: the CUDA kernel on a GPU, its bit-exact reference
           elsewhere), the final state in bf16: 3H + 3 * 4 + 2H + 5 = 2897 bytes (63% of bf16).
           The final state stays bf16 because it defines the training labels (the target's
           logits): in fp8 the target's argmax moves on about 2% of tokens.
  fp8-all: the final state in fp8 too: 4H + 4 * 4 + 5 = 2325 bytes, half of bf16 (for targets
           whose hidden states would not fit otherwise).
A scale per token AND layer, because the residual stream grows with depth: one scale for all
three aux layers would crush the early layer.

Layout: <dir>/shard-00000.safetensors ... and <dir>/index.json (written atomically after each
shard). A rerun skips sequences already in a shard; a shard half-written when a run was killed
is never in the index and is overwritten.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speclock.core.errors import BadInput
from speclock.core.files import TEMP_PREFIX, atomic_write_text, clean_stale_temps, confined, publish, read_json
from speclock.kernels import fp8_pack, fp8_unpack

if TYPE_CHECKING:
    from speclock.train.data import ResponseRecord

SCHEMA = "speclock.hidden/v1"


def check_aux_layers(layers: list[int], num_layers: int) -> list[int]:
    if len(layers) != 3:
        raise BadInput(f"EAGLE-3 takes three aux layers, got {layers}")
    for k in layers:
        if not 1 <= k <= num_layers - 1:
            raise BadInput(
                f"aux layer {k} is outside the target (valid: 1..{num_layers - 1}, 'hidden state after k "
                f"decoder layers' of a {num_layers}-layer target; 0 cannot be expressed in SGLang's convention)"
            )
    if sorted(set(layers)) != list(layers):
        raise BadInput(f"aux layers must be distinct and increasing, got {layers}")
    return list(layers)


# Which of the two stored states ("aux" [3H], "final" [H]) each store keeps in fp8.
FP8_PARTS = {"bf16": (), "fp8": ("aux",), "fp8-all": ("aux", "final")}
STORES = tuple(FP8_PARTS)


def bytes_per_token(hidden_size: int, store: str = "bf16") -> int:
    rows = {"aux": 3, "final": 1}  # H-wide rows per token; an fp8 row is H bytes + a float32 scale
    return sum(n * (hidden_size + 4 if part in FP8_PARTS[store] else 2 * hidden_size) for part, n in rows.items()) + 4 + 1


def _store_keys(store: str) -> list[str]:
    return [k for part in ("aux", "final") for k in ((part + "_q", part + "_scale") if part in FP8_PARTS[store] else (part,))]


def check_index_matches(index: dict[str, Any], where: Path, target_sha: str, layers: list[int], store: str) -> None:
    """A rerun must extend a store made for the same target, layers and store kind."""
    if index["target_sha256"] != target_sha or index["aux_layers_after"] != layers:
        raise BadInput(
            f"{where}/index.json was made for another target or other layers "
            f"({index['target_sha256'][:12]}, {index['aux_layers_after']})",
            hint="use a fresh --work folder, or delete the hidden-state folder",
        )
    if index.get("store", "bf16") != store:
        raise BadInput(
            f"{where}/index.json holds a {index.get('store', 'bf16')} store, this run asks for {store}",
            hint="pass the same --hidden-store as the first run, or use a fresh --work folder",
        )


_FP8_BACKEND: dict[str, str] = {}  # device type -> the fp8 backend that works there (chosen once)


def fp8_backend(x, log=print) -> str:
    """'cuda' (speclock's kernel, built for this GPU on first use) when it loads, else 'reference'
    (the same bits in PyTorch): training must not stop because nvcc is missing on a GPU host."""
    kind = x.device.type
    if kind not in _FP8_BACKEND:
        _FP8_BACKEND[kind] = "reference"
        if x.is_cuda:
            # heavy, optional (torch): imported only where it is used
            import torch

            try:
                fp8_pack(torch.ones(1, x.shape[-1], dtype=torch.bfloat16, device=x.device), backend="cuda")
                _FP8_BACKEND[kind] = "cuda"
            except Exception as err:
                log(f"fp8: CUDA kernel unavailable ({str(err).splitlines()[0]}); using the PyTorch reference (same bits)")
        log(f"fp8: packing/unpacking hidden states with the {_FP8_BACKEND[kind]} backend")
    return _FP8_BACKEND[kind]


def _pack_rows(x, log=print):
    """fp8_pack over the last dimension of [..., H]: (q as uint8 [..., H], scale [...])."""
    # heavy, optional (torch): imported only where it is used
    import torch

    rows = x.reshape(-1, x.shape[-1]).contiguous()
    q, scale = fp8_pack(rows, backend=fp8_backend(rows, log))
    return q.view(torch.uint8).reshape(x.shape), scale.reshape(x.shape[:-1])


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def load_index(out_dir: Path) -> dict[str, Any] | None:
    p = out_dir / "index.json"
    if not p.exists():
        return None

    hint = f"delete {out_dir} and run `speclock train extract` again"
    idx = read_json(p, what="hidden-state index", hint=hint)
    if idx.get("schema") != SCHEMA:
        raise BadInput(f"{p}: not a speclock hidden-state index (key 'schema' is {idx.get('schema')!r})", hint=hint)
    if not isinstance(idx.get("shards"), list) or not all(
        isinstance(sh, dict) and isinstance(sh.get("file"), str) and isinstance(sh.get("ids"), list) for sh in idx["shards"]
    ):
        raise BadInput(f"{p}: key 'shards' is not a list of {{file, ids}} objects", hint=hint)
    for sh in idx["shards"]:  # shard names come from data: each must stay inside this folder (N-rank runs use parts/...)
        confined(out_dir, sh["file"], what="shard file", source=p)
    return idx


def extract_hidden_states(
    target,
    responses: list[ResponseRecord],
    out_dir: Path,
    aux_layers_after: list[int],
    target_sha: str,
    max_len: int,
    batch_tokens: int,
    shard_tokens: int,
    log=print,
    store: str = "bf16",
) -> dict[str, Any]:
    """Prefill every (prompt, response) not yet extracted; returns the index."""
    # heavy, optional (torch, safetensors): imported only where it is used
    import torch
    from safetensors.torch import save_file

    if store not in STORES:
        raise BadInput(f"hidden-state store {store!r} is not one of {', '.join(STORES)}")
    cfg = target.config
    check_aux_layers(aux_layers_after, cfg.num_hidden_layers)
    out_dir.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(out_dir)  # shards a killed run was writing
    index = load_index(out_dir)
    if index is None:
        index = {
            "schema": SCHEMA,
            "target_sha256": target_sha,
            "aux_layers_after": aux_layers_after,
            "hidden_size": cfg.hidden_size,
            "store": store,
            "dtype": {
                "bf16": "bfloat16",
                "fp8": "aux: float8_e4m3fn + float32 scale per token and layer; final: bfloat16",
                "fp8-all": "float8_e4m3fn + float32 scale per token and layer",
            }[store],
            "max_len": max_len,
            "bytes_per_token": bytes_per_token(cfg.hidden_size, store),
            "shards": [],
            "tokens": 0,
            "sequences": 0,
        }
    else:
        check_index_matches(index, out_dir, target_sha, aux_layers_after, store)
    keys = _store_keys(store)
    done = {sid for sh in index["shards"] for sid in sh["ids"]}
    todo = [r for r in responses if r["id"] not in done and r["response_ids"]]
    todo.sort(key=lambda r: len(r["prompt_ids"]) + len(r["response_ids"]))
    log(f"extract: {len(done)} sequences already in {len(index['shards'])} shards, {len(todo)} to do")
    dev = next(target.parameters()).device
    t0, new_tokens = time.perf_counter(), 0
    pending: dict[str, list] = {"ids": [], "input_ids": [], "loss_mask": [], **{k: [] for k in keys}}
    pending_tokens = 0

    def flush():
        nonlocal pending, pending_tokens
        if not pending["ids"]:
            return
        n = len(index["shards"])
        name = f"shard-{n:05d}.safetensors"
        lengths = [len(x) for x in pending["input_ids"]]
        offsets = torch.tensor([0] + lengths).cumsum(0)
        tensors = {
            "input_ids": torch.cat(pending["input_ids"]).to(torch.int32).contiguous(),
            "loss_mask": torch.cat(pending["loss_mask"]).to(torch.uint8).contiguous(),
            **{k: torch.cat(pending[k]).contiguous() for k in keys},
            "offsets": offsets.to(torch.int64),
        }
        tmp = out_dir / (TEMP_PREFIX + name)  # named so the next run's clean_stale_temps removes a killed run's
        save_file(tensors, str(tmp))
        publish(tmp, out_dir / name)
        index["shards"].append({"file": name, "ids": pending["ids"], "tokens": int(offsets[-1])})
        index["tokens"] += int(offsets[-1])
        index["sequences"] += len(pending["ids"])
        _write_json_atomic(out_dir / "index.json", index)
        pending = {k: [] for k in pending}
        pending_tokens = 0

    i = 0
    with torch.inference_mode():
        while i < len(todo):
            seqs: list[ResponseRecord] = []
            width = 0
            while i < len(todo):
                r = todo[i]
                ln = min(len(r["prompt_ids"]) + len(r["response_ids"]), max_len)
                if seqs and max(width, ln) * (len(seqs) + 1) > batch_tokens:
                    break
                seqs.append(r)
                width = max(width, ln)
                i += 1
            ids = torch.zeros(len(seqs), width, dtype=torch.long)
            mask = torch.zeros(len(seqs), width, dtype=torch.long)
            lens = []
            for j, r in enumerate(seqs):
                full = (r["prompt_ids"] + r["response_ids"])[:width]
                ids[j, : len(full)] = torch.tensor(full)
                mask[j, : len(full)] = 1
                lens.append(len(full))
            o = target.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), output_hidden_states=True)
            hs = o.hidden_states
            # [B, T, rows, H]: three aux rows and one final row per token; fp8 packs each row.
            parts = {"aux": torch.stack([hs[k] for k in aux_layers_after], 2), "final": hs[-1].unsqueeze(2)}
            states = {}
            for part, x in parts.items():
                x = x.to(torch.bfloat16)
                if part in FP8_PARTS[store]:
                    q, scale = _pack_rows(x, log)
                    states.update({part + "_q": q.flatten(2).cpu(), part + "_scale": scale.cpu()})
                else:
                    states[part] = x.flatten(2).cpu()
            for j, r in enumerate(seqs):
                n = lens[j]
                lm = torch.zeros(n, dtype=torch.uint8)
                lm[len(r["prompt_ids"]) :] = 1
                pending["ids"].append(r["id"])
                pending["input_ids"].append(ids[j, :n])
                pending["loss_mask"].append(lm)
                for k in keys:
                    pending[k].append(states[k][j, :n])
                pending_tokens += n
                new_tokens += n
            if pending_tokens >= shard_tokens:
                flush()
                dt = time.perf_counter() - t0
                log(f"extract: {index['sequences']} sequences, {index['tokens']} tokens, {new_tokens / dt:.0f} tok/s")
        flush()
    dt = time.perf_counter() - t0
    index["last_run"] = {"new_tokens": new_tokens, "seconds": round(dt, 3), "tok_s": round(new_tokens / dt, 1) if dt else None}
    _write_json_atomic(out_dir / "index.json", index)
    log(
        f"extract: done, {index['sequences']} sequences, {index['tokens']} tokens "
        f"({index['bytes_per_token']} bytes/token, {index['tokens'] * index['bytes_per_token'] / 1e9:.2f} GB)"
    )
    return index


def load_shards(out_dir: Path, device: str = "cpu") -> dict[str, Any]:
    """All shards concatenated: input_ids, loss_mask, aux, final, and per-sequence (start, length)."""
    # heavy, optional (torch, safetensors): imported only where it is used
    import torch
    from safetensors.torch import load_file

    index = load_index(out_dir)
    if index is None or not index["shards"]:
        raise BadInput(f"{out_dir} holds no hidden-state shards", hint="run `speclock train extract` first")
    store = index.get("store", "bf16")
    keys = _store_keys(store)
    parts: dict[str, list[torch.Tensor]] = {"input_ids": [], "loss_mask": [], **{k: [] for k in keys}}
    spans: list[tuple[int, int]] = []
    base = 0
    for sh in index["shards"]:
        t = load_file(str(out_dir / sh["file"]), device=device)
        for k in parts:
            parts[k].append(t[k])
        off = t["offsets"].tolist()
        spans += [(base + a, b - a) for a, b in zip(off, off[1:], strict=False)]  # consecutive offsets: one shorter
        base += off[-1]
    # tensors by name, plus "spans" (start, length) per sequence and the "index"
    data: dict[str, Any] = {k: torch.cat(v) for k, v in parts.items()}
    data["spans"] = spans
    data["index"] = index
    return data


def gather_states(data: dict[str, Any], name: str, spans: list[tuple[int, int]]):
    """The bf16 rows [sum n, W] of `name` ("aux" [.., 3H] or "final" [.., H]) for (start, n) spans,
    dequantized from an fp8 store in one pass (one gather, one unpack)."""
    # heavy, optional (torch): imported only where it is used
    import torch

    if name in data:  # stored in bf16
        return torch.cat([data[name][s : s + n] for s, n in spans])

    q = torch.cat([data[name + "_q"][s : s + n] for s, n in spans])
    scale = torch.cat([data[name + "_scale"][s : s + n] for s, n in spans])
    rows_q = q.view(-1, data["index"]["hidden_size"])
    rows = fp8_unpack(rows_q, scale.reshape(-1), torch.bfloat16, backend=fp8_backend(rows_q))
    return rows.view(q.shape[0], -1)


def state_widths(data: dict[str, Any]) -> tuple[int, int]:
    """(aux width 3H, final width H) of a loaded store."""
    H = data["index"]["hidden_size"]
    return 3 * H, H
