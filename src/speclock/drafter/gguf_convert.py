"""GGUF -> plain Hugging Face folder: the target conversion the image build runs.

Self-contained on purpose (the standard library, torch, transformers and gguf; no other speclock module):
the build step that converts the target is keyed by the files it runs (build/closure.py), so editing
any other part of speclock never converts the 270 MB target again. speclock's own callers use
`speclock.drafter.models.convert_gguf_to_hf`, which maps ConvertError onto speclock's exit codes and
adds the weights hash to the provenance record.

    python -m speclock.drafter.gguf_convert --gguf X.gguf --out DIR [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DTYPES = ("bfloat16", "float16", "float32")
SOURCE_RECORD = "speclock-source.json"
# Config keys that would make a plain folder claim to be GGUF-quantized or point at the build host.
_DROP_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path")


class ConvertError(Exception):
    """A conversion that cannot be done: exit_code 2 (bad input) or 3 (environment), with what to do."""

    def __init__(self, message: str, *, hint: str = "", exit_code: int = 2):
        super().__init__(message)
        self.hint = hint
        self.exit_code = exit_code


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _check_input(gguf_path: Path, out_dir: Path, dtype: str) -> None:
    if dtype not in DTYPES:
        raise ConvertError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if not gguf_path.is_file():
        raise ConvertError(f"GGUF file not found: {gguf_path}", hint="pass the path of a .gguf file")
    with open(gguf_path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ConvertError(f"{gguf_path} is not a GGUF file (its first bytes are not 'GGUF')")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConvertError(f"output folder {out_dir} exists and is not empty", hint="remove it or choose another --out")


@contextlib.contextmanager
def _gguf_parsed_once(gguf_module: Any) -> Iterator[None]:
    """transformers reads the GGUF three times for one conversion (tokenizer, config, weights), each time
    parsing the whole header and vocabulary with gguf.GGUFReader (~2.4 s each on a 2-core build host), and
    builds gguf's tensor-name map again for every module it maps (~400 times, ~4 s in all). Both are
    functions of their arguments only: while this is active, one reader per file and one map per
    (architecture, layers). A gguf without these names (another version) is left as it is: slower, same result."""
    reader_cls = getattr(gguf_module, "GGUFReader", None)
    name_map = getattr(gguf_module, "get_tensor_name_map", None)
    if reader_cls is None or name_map is None:
        yield
        return
    readers: dict[tuple[str, str], object] = {}

    def shared_reader(path: str | os.PathLike, mode: str = "r") -> object:
        key = (os.path.realpath(path), mode)
        if key not in readers:  # memmapped read-only ("r"): sharing one reader cannot change what is read
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf_module.GGUFReader = shared_reader
    gguf_module.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf_module.GGUFReader = reader_cls
        gguf_module.get_tensor_name_map = name_map


def _write_folder(gguf_path: Path, tmp: Path, dtype: str) -> None:
    """The converted model, tokenizer and provenance record in `tmp`. transformers reads the GGUF for the tokenizer
    and for the weights with their config (parsed once: _gguf_parsed_once); every further from_pretrained would
    dequantize it again."""
    try:
        import gguf  # transformers needs it to read GGUF; fail here with a clear message
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise ConvertError(
            f"converting a GGUF needs torch, transformers and gguf: {err}",
            exit_code=3,
            hint="run inside the engine venv, or pip install transformers gguf torch safetensors",
        ) from err
    with _gguf_parsed_once(gguf):
        src_dir, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
        if not getattr(tokenizer, "chat_template", None):
            print(
                f"warning: {gguf_path} carries no chat template; the converted target cannot be used for chat prompts",
                file=sys.stderr,
            )
        # Dequantized to float32 first, then cast: the same rounding to `dtype` for every tensor. The quantized
        # model cannot be saved (transformers refuses a GGUF-quantized model), so its weights go into a plain one.
        quantized = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    state = quantized.state_dict()
    config = quantized.config
    for attr in _DROP_KEYS:
        if hasattr(config, attr):
            try:
                delattr(config, attr)
            except AttributeError:
                pass
    config.dtype = dtype
    target_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=target_dtype)
    del quantized
    missing, unexpected = model.load_state_dict({k: v.to(target_dtype) for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ConvertError(
            f"{gguf_path}: weights do not match the architecture (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in _DROP_KEYS:
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    record = {"converted_from": gguf_path.name, "gguf_sha256": _sha256(gguf_path), "dtype": dtype}
    (tmp / SOURCE_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def convert(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "bfloat16") -> Path:
    """Dequantize a GGUF model into a plain Hugging Face folder at `out_dir`, written in a temporary folder beside
    it and renamed at the end (nothing half-written). Raises ConvertError; OSError passes through."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    _check_input(gguf_path, out_dir, dtype)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_folder(gguf_path, tmp, dtype)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m speclock.drafter.gguf_convert",
        description="Convert a GGUF model into a plain Hugging Face folder (atomic).",
    )
    p.add_argument("--gguf", required=True, help="the .gguf file")
    p.add_argument("--out", required=True, help="output folder (must not exist or be empty)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="dtype of the written weights")
    args = p.parse_args(argv)
    try:
        out = convert(args.gguf, args.out, args.dtype)
    except ConvertError as err:
        print(f"{p.prog}: error: {err}" + (f"\n  what to do: {err.hint}" if err.hint else ""), file=sys.stderr)
        return err.exit_code
    except OSError as err:  # a full disk or a permission: the path and the reason, not a traceback
        print(f"{p.prog}: error: {err.filename or args.out}: {err.strerror or err}", file=sys.stderr)
        return 3
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
