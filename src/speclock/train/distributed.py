"""Multi-process extraction and training with torchrun, torch.distributed and FSDP2.

`speclock train ... --nproc N` runs the single-process stages (target, generate, export, reference)
in the calling process and launches

    python -m torch.distributed.run --standalone --nproc-per-node N -m speclock.train.launch ...

for `extract` and `fit`. `torchrun ... -m speclock train extract|fit ...` works too: the pipeline
sees RANK/WORLD_SIZE and takes this module's path. The launcher and the rank entry point are in
speclock.train.launch (above the pipeline); this module is what runs inside a rank (below it). Backend: nccl with cuda:LOCAL_RANK per rank when
CUDA is used, gloo on a CPU (what the tests run).

Extraction: the responses are dealt to ranks by a pure function of the response set (longest first,
round robin, so tokens balance); each rank writes its shards under hidden/parts/world<N>-rank<r>/
with its own index, then rank 0 writes hidden/index.json listing every shard (same schema as a
one-process index, so `fit` and later one-process runs read it unchanged). A sequence already in any
shard (from a run with any N) is never extracted again: a rerun with another N only deals out what
is missing.

Training: every rank reads the same global batches (train.batches.batches_for_epoch) and takes the sequences
batch[rank::N]. Each TTT step's loss is normalized by the global count of loss positions
(all-reduced before the division) and FSDP2's gradient average is undone by scaling the loss by N,
so the summed gradient equals the one-process gradient of the same global batch. Checkpoints hold
full (unsharded) state dicts written by rank 0, readable by a one-process export or resume.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import atomic_output
from speclock.train.extract import _write_json_atomic, check_index_matches, extract_hidden_states, load_index

if TYPE_CHECKING:
    from speclock.train.data import ResponseRecord

DIST_STAGES = ("extract", "fit")
# NVLink multicast (NVLS / symmetric-memory multicast) stays off: see the stack's GPU notes.
LAUNCH_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# --- launching ------------------------------------------------------------------------------------
def under_torchrun() -> bool:
    """Launched as one rank of a process group (torchrun's env:// contract), not a plain run that
    happens to see RANK in a job's environment."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def backend_for(device: str, nproc: int) -> tuple[str, str]:
    """(backend, device kind) for `--device` and `--nproc`; raises with what to do if it cannot work."""
    # heavy, optional (torch): imported only where it is used
    import torch

    if not isinstance(nproc, int) or nproc < 1:
        raise BadInput(f"--nproc must be at least 1, got {nproc}")
    if device.startswith("cuda:"):
        raise BadInput(
            f"--device {device} with --nproc: each rank uses cuda:LOCAL_RANK",
            hint="pass --device cuda, and CUDA_VISIBLE_DEVICES to choose the GPUs",
        )
    if device not in ("", "cpu", "cuda"):
        raise BadInput(f"--device {device!r}: expected cpu or cuda with --nproc")
    use_cuda = device == "cuda" or (device == "" and torch.cuda.is_available())
    if not use_cuda:
        return "gloo", "cpu"
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < nproc:
        raise EnvironmentProblem(
            f"--nproc {nproc} on CUDA needs {nproc} GPUs, torch sees {have}",
            hint="lower --nproc, or use --device cpu for a gloo run",
        )
    return "nccl", "cuda"


# --- inside a rank --------------------------------------------------------------------------------
@dataclass
class DistContext:
    rank: int
    world: int
    local_rank: int
    device: str
    backend: str
    mesh: object = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def grad_scale(self) -> float:
        # FSDP2 averages gradients over ranks; the losses are already global-batch sums, so undo it.
        return float(self.world)

    def barrier(self) -> None:
        # heavy, optional (torch): imported only where it is used
        import torch.distributed as tdist

        if self.backend == "nccl":
            tdist.barrier(device_ids=[self.local_rank])
        else:
            tdist.barrier()

    def all_reduce_sum(self, t):
        # heavy, optional (torch): imported only where it is used
        import torch.distributed as tdist

        t = t.clone()
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return t

    def from_rank0(self, value: float) -> float:
        # heavy, optional (torch): imported only where it is used
        import torch
        import torch.distributed as tdist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        tdist.broadcast(t, src=0)
        return float(t.item())

    def close(self) -> None:
        # heavy, optional (torch): imported only where it is used
        import torch.distributed as tdist

        if tdist.is_initialized():
            tdist.destroy_process_group()

    # --- training hooks (fit.train_drafter) ---
    def shard_drafter(self, drafter):
        """FSDP2: the decoder layer and the root are sharding units. The layer runs once per TTT step
        from ttt_forward, not through forward(), hence the registered methods; it stays gathered
        through the unrolled forward (reshard_after_forward=False) instead of gathering once per
        step. Buffers (target embeddings, d2t, t2d) are not sharded: they are frozen and replicated."""
        # heavy, optional (torch): imported only where it is used
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

        fully_shard(drafter.midlayer, mesh=self.mesh, reshard_after_forward=False)
        fully_shard(drafter, mesh=self.mesh)
        register_fsdp_forward_method(drafter.midlayer, "ttt_step")
        register_fsdp_forward_method(drafter, "ttt_forward")
        return drafter

    def collate_local(self, collate, data, batch: list[int], max_len: int, device: str):
        """This rank's part of a global batch; ntok counts the whole global batch (as one process would).
        A rank with no sequence (a global batch smaller than N) runs one with an empty loss mask: every
        rank must take part in FSDP's collectives, and a masked sequence adds nothing."""
        mine = batch[self.rank :: self.world]
        ids, lm, aux, fin, _ = collate(data, mine or batch[:1], max_len, device)
        if not mine:
            lm = lm & False
        ntok = sum(min(data["spans"][i][1], max_len) for i in batch)
        return ids, lm, aux, fin, ntok

    def global_metrics(self, loss, accs: list[float], losses: list[float], steps: int):
        """Loss and per-step accuracy/loss of the global batch (sums of the ranks' global-normalized parts)."""
        # heavy, optional (torch): imported only where it is used
        import torch

        n = len(accs)
        vec = torch.zeros(1 + 3 * steps, dtype=torch.float64, device=self.device)
        vec[0] = float(loss.detach())
        vec[1 : 1 + n] = torch.tensor(accs, dtype=torch.float64)
        vec[1 + steps : 1 + steps + n] = torch.tensor(losses, dtype=torch.float64)
        vec[1 + 2 * steps : 1 + 2 * steps + n] = 1.0
        vec = self.all_reduce_sum(vec).cpu()
        valid = int((vec[1 + 2 * steps :] > 0).sum())
        return vec[0], vec[1 : 1 + valid].tolist(), vec[1 + steps : 1 + steps + valid].tolist()

    def _sd_options(self, **kw):
        # heavy, optional (torch): imported only where it is used
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)

    def save_checkpoint(self, drafter, opt, path: Path, extra: dict[str, Any]) -> None:
        """Gather the full model and optimizer state (a collective), rank 0 writes it atomically; the
        optimizer state is keyed by parameter name, which a one-process resume also reads."""
        # heavy, optional (torch): imported only where it is used
        import torch
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        model_sd = get_model_state_dict(drafter, options=self._sd_options())
        optim_sd = get_optimizer_state_dict(drafter, opt, options=self._sd_options())
        if self.is_main:
            with atomic_output(path, binary=True) as fh:
                torch.save(
                    {"drafter": model_sd, "optimizer": optim_sd, "optimizer_keys": "fqn", "world_size": self.world, **extra}, fh
                )
        self.barrier()

    def load_checkpoint(self, drafter, opt, saved: dict[str, Any]) -> None:
        """Every rank reads the full checkpoint (same host, same file) and keeps its shards."""
        # heavy, optional (torch): imported only where it is used
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        set_model_state_dict(drafter, saved["drafter"], options=self._sd_options(strict=False))
        optim_sd = saved["optimizer"]
        if saved.get("optimizer_keys") != "fqn":
            optim_sd = optimizer_state_by_name(optim_sd, drafter)
        set_optimizer_state_dict(drafter, opt, optim_sd, options=self._sd_options())


def optimizer_state_by_name(optim_sd: dict[str, Any], drafter) -> dict[str, Any]:
    """A plain optimizer.state_dict() (parameters by position) keyed by parameter name instead."""
    names = [n for n, p in drafter.named_parameters() if p.requires_grad]
    groups = [dict(g, params=[names[i] for i in g["params"]]) for g in optim_sd["param_groups"]]
    return {"state": {names[i]: v for i, v in optim_sd["state"].items()}, "param_groups": groups}


def optimizer_state_by_position(optim_sd: dict[str, Any], drafter) -> dict[str, Any]:
    """Inverse of optimizer_state_by_name: what optimizer.load_state_dict() of one process takes."""
    pos = {n: i for i, n in enumerate(n for n, p in drafter.named_parameters() if p.requires_grad)}
    groups = [dict(g, params=[pos[n] for n in g["params"]]) for g in optim_sd["param_groups"]]
    return {"state": {pos[n]: v for n, v in optim_sd["state"].items()}, "param_groups": groups}


def setup(requested_device: str) -> DistContext | None:
    """Join the torchrun process group (None when not launched by torchrun)."""
    if not under_torchrun():
        return None
    # heavy, optional (torch): imported only where it is used
    import torch
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(LAUNCH_ENV)  # also when torchrun was started by hand: NCCL reads these at communicator init
    world, rank, local = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    backend, kind = backend_for(requested_device, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if kind == "cuda":
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
        tdist.init_process_group("nccl", device_id=torch.device(device))
    else:
        device = "cpu"
        tdist.init_process_group("gloo")
    mesh = init_device_mesh(kind, (world,))
    return DistContext(rank=rank, world=world, local_rank=local, device=device, backend=backend, mesh=mesh)


def check_stages(stages: list[str]) -> None:
    other = [x for x in stages if x not in DIST_STAGES and x != "target"]
    if other:
        raise BadInput(
            f"under torchrun only extract and fit run, not {','.join(other)}",
            hint="use `speclock train all --nproc N`: it runs the other stages in one process",
        )


# --- extraction -----------------------------------------------------------------------------------
def part_dir(hidden: Path, world: int, rank: int) -> Path:
    return hidden / "parts" / f"world{world}-rank{rank:03d}"


def ranks_share(responses: list[ResponseRecord], rank: int, world: int) -> list[ResponseRecord]:
    """This rank's sequences: longest first, dealt round robin (a pure function of the response set)."""
    order = sorted(responses, key=lambda r: (-(len(r["prompt_ids"]) + len(r["response_ids"])), r["id"]))
    return order[rank::world]


_RUN_KEYS = ("shards", "tokens", "sequences", "last_run", "parts", "world_size")


def _meta(index: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in index.items() if k not in _RUN_KEYS}


def _part_indexes(hidden: Path) -> dict[str, dict[str, Any]]:
    """Own indexes of every rank folder under hidden/parts, by their path relative to hidden."""
    out = {}
    for d in sorted((hidden / "parts").glob("world*-rank*")):
        idx = load_index(d)
        if idx is not None:
            out[d.relative_to(hidden).as_posix()] = idx
    return out


def extract_sharded(
    ctx: DistContext,
    model,
    responses: list[ResponseRecord],
    hidden: Path,
    layers: list[int],
    target_sha: str,
    max_len: int,
    batch_tokens: int,
    shard_tokens: int,
    log=print,
    store: str = "bf16",
) -> dict[str, Any]:
    """This rank's share of the extraction, then (rank 0) the merged index; returns the merged index."""
    hidden.mkdir(parents=True, exist_ok=True)
    mine = part_dir(hidden, ctx.world, ctx.rank)
    prefix = mine.relative_to(hidden).as_posix() + "/"
    merged = load_index(hidden)
    if merged is not None:
        check_index_matches(merged, hidden, target_sha, layers, store)
    base_done = (
        set() if merged is None else {i for sh in merged["shards"] if not sh["file"].startswith(prefix) for i in sh["ids"]}
    )
    other_done = {
        i for name, idx in _part_indexes(hidden).items() if name + "/" != prefix for sh in idx["shards"] for i in sh["ids"]
    }
    share = [r for r in ranks_share(responses, ctx.rank, ctx.world) if r["id"] not in base_done | other_done]
    extract_hidden_states(
        model,
        share,
        mine,
        layers,
        target_sha,
        max_len,
        batch_tokens,
        shard_tokens,
        log=lambda m: log(f"[rank {ctx.rank}] {m}"),
        store=store,
    )
    ctx.barrier()
    if ctx.is_main:
        merge_indexes(hidden, ctx.world)
    ctx.barrier()
    index = load_index(hidden)
    if index is None:  # rank 0 wrote it before the barrier: gone only if the folder was removed meanwhile
        raise BadInput(f"{hidden}/index.json is missing after the merge", hint="run `speclock train extract` again")
    return index


def merge_indexes(hidden: Path, world: int | None = None) -> dict[str, Any]:
    """hidden/index.json = the one-process shards already listed there + every rank folder's shards.
    `world`: the run that just finished (its ranks' times make last_run); None keeps the old last_run."""
    old = load_index(hidden)
    parts = _part_indexes(hidden)
    if not parts and old is None:
        raise BadInput(f"{hidden} holds no hidden-state shards")
    first = old if old is not None else next(iter(parts.values()))
    for name, idx in parts.items():
        if _meta(idx) != _meta(first):
            diff = sorted(k for k in set(_meta(idx)) | set(_meta(first)) if _meta(idx).get(k) != _meta(first).get(k))
            raise BadInput(
                f"{hidden}/{name} was extracted with other settings ({', '.join(diff)}) than {hidden}/index.json",
                hint="use a fresh --work folder, or delete the hidden-state folder",
            )
    shards = [sh for sh in (old or {}).get("shards", []) if not sh["file"].startswith("parts/")]
    for name, idx in parts.items():
        shards += [dict(sh, file=f"{name}/{sh['file']}") for sh in idx["shards"]]
    seen: set[str] = set()
    for sh in shards:
        dup = seen.intersection(sh["ids"])
        if dup:
            raise BadInput(
                f"{hidden}: sequence {sorted(dup)[0]} is in two shards (the folder was edited by hand?)",
                hint="delete the hidden-state folder and extract again",
            )
        seen.update(sh["ids"])
    index = dict(_meta(first), shards=shards, tokens=sum(sh["tokens"] for sh in shards), sequences=len(seen))
    if world is None:
        index.update({k: old[k] for k in ("last_run", "world_size") if old and k in old})
    else:
        runs = [idx.get("last_run") or {} for name, idx in parts.items() if name.startswith(f"parts/world{world}-")]
        new_tokens = sum(r.get("new_tokens", 0) for r in runs)
        secs = max([r.get("seconds", 0.0) for r in runs] or [0.0])  # ranks run at once: the slowest one's time
        index.update(
            world_size=world,
            last_run={
                "new_tokens": new_tokens,
                "seconds": round(secs, 3),
                "tok_s": round(new_tokens / secs, 1) if secs else None,
                "ranks": world,
            },
        )
    _write_json_atomic(hidden / "index.json", index)
    return index
