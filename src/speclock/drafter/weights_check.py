"""Weights checked before any engine starts (issue #40 item 4): every safetensors file of a target or drafter folder
is read by its header alone (no torch, well under a second even for a large model): the header is JSON, each tensor
has a known dtype, its byte range is exactly dtype size x shape, and lies inside the file; the tensors the config
fixes (hidden size, vocabulary) have the config's shape. A bad file is exit 2 naming the file and the tensor, where it
used to start both engines and die 127-156 s later with a traceback (a drafter header that is not JSON, or claims a
10 TB tensor).

What it does not check: the values (a file of NaNs passes), tensors the config does not fix, and weights in other
formats (.bin, .gguf), which only a loader reads.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput
from speclock.core.files import expect, json_type, os_error
from speclock.core.jsonread import loads

# Bytes per element of the safetensors dtypes (the format's own list).
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
_HINT = "the weights file is damaged or not the model's: copy or export it again"


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict, int]:
    """(header dict, byte offset of the data section) of a safetensors file, without torch."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise BadInput(f"{path} is not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", raw)
            if n > 100 << 20:
                raise BadInput(f"{path} is not a safetensors file (header size {n})")
            blob = f.read(n)
    except OSError as err:
        raise os_error(err, path, "read the weights") from None
    try:
        header = loads(blob, max_bytes=100 << 20)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise BadInput(f"{path} is not a safetensors file (bad header: {err})") from None
    if not isinstance(header, dict):
        raise BadInput(f"{path} is not a safetensors file (its header is a JSON {json_type(header)}, not an object)")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"tensor {name!r}"
        expect(info, dict, where, path=path, hint="the weights file is damaged: copy or export it again")
        expect(info.get("dtype"), str, f"{where}.dtype", path=path, hint="the weights file is damaged: copy or export it again")
        shape = expect(info.get("shape"), list, f"{where}.shape", path=path, hint="the weights file is damaged")
        for i, dim in enumerate(shape):
            expect(dim, int, f"{where}.shape[{i}]", path=path, hint="the weights file is damaged")
        offsets = expect(info.get("data_offsets"), list, f"{where}.data_offsets", path=path, hint="the weights file is damaged")
        if (
            len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise BadInput(
                f"{path}: {where}.data_offsets {offsets!r} is not [start, end] with 0 <= start <= end",
                hint="the weights file is damaged: copy or export it again",
            )
    return header, 8 + n


def check_safetensors(path: Path) -> dict[str, Any]:
    """The header of one safetensors file, every tensor's dtype, size and byte range checked against the file."""
    header, base = read_safetensors_header(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise BadInput(f"{path}: cannot read its size ({err.strerror})", hint=_HINT) from None
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPE_BYTES:
            raise BadInput(f"{path}: tensor {name!r} has dtype {dtype!r}", hint=f"one of {', '.join(DTYPE_BYTES)}; {_HINT}")
        if any(d < 0 for d in shape):
            raise BadInput(f"{path}: tensor {name!r} has shape {shape}", hint=_HINT)
        want = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - start != want:
            raise BadInput(
                f"{path}: tensor {name!r} ({dtype} {shape}) should take {want} bytes, its data_offsets give {end - start}",
                hint=_HINT,
            )
        if base + end > size:
            raise BadInput(
                f"{path}: tensor {name!r} ends at byte {base + end}, past the end of the file ({size} bytes): "
                "the file is truncated, or its header claims data it does not hold",
                hint=_HINT,
            )
    return header


def _expected_shapes(cfg: dict[str, Any], what: str) -> dict[str, tuple[int | None, ...]]:
    """Tensor name -> the shape the config fixes (None: any size on that axis)."""
    found = cfg.get("text_config")
    text: dict[str, Any] = found if isinstance(found, dict) else {}
    hidden = cfg.get("hidden_size") or text.get("hidden_size")
    vocab = cfg.get("vocab_size") or text.get("vocab_size")
    if not isinstance(hidden, int):
        return {}
    if what in ("draft", "drafter"):
        return {
            "fc.weight": (hidden, None),
            "lm_head.weight": (cfg.get("draft_vocab_size") or vocab, hidden),
            "norm.weight": (hidden,),
        }
    return {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden), "model.norm.weight": (hidden,)}


def check_model_weights(folder: str | os.PathLike, cfg: dict[str, Any], *, what: str = "target") -> int:
    """Every *.safetensors of a model folder checked (check_safetensors) and the tensors its config fixes shaped as it
    says; returns the number of tensors. BadInput names the file and tensor."""
    folder = Path(folder)
    shapes = _expected_shapes(cfg, what)
    count = 0
    for path in sorted(folder.glob("*.safetensors")):
        header = check_safetensors(path)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count += 1
            want = shapes.get(name)
            if want is None:
                continue
            got = info["shape"]
            if len(got) != len(want) or any(w is not None and g != w for g, w in zip(got, want, strict=False)):
                shown = [w if w is not None else "*" for w in want]
                raise BadInput(
                    f"{path}: tensor {name!r} has shape {got}, where {folder}/config.json gives {shown}",
                    hint=f"the {what}'s weights and config.json belong to different models: export them together",
                )
    return count
