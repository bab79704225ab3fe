"""The safetensors format read without torch: a file's header (8-byte little-endian length, then a JSON object of
tensor name -> dtype, shape, data_offsets) and the checks that its byte ranges fit the file.

Kept in core/ (standard library only) because two layers read it: spec/ (the lock records a model folder's
identity, spec.model_identity) and drafter/ (weights checked against the config before an engine starts)."""

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


# A header is dict[str, Any]: tensor name -> {dtype, shape, data_offsets} (checked here), and beside those the format's
# free-form "__metadata__" object, which no TypedDict can hold next to arbitrary tensor names.
def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
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


def check_safetensors(path: Path) -> dict[str, Any]:  # a header, as read_safetensors_header
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
