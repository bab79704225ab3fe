"""A model folder's identity: what the lock pins of a target (or drafter) that is mounted at run time, not built in.

`model_identity(folder)` reads a Hugging Face-style folder and returns a JSON-ready record (schema
speclock.model-identity/v1); `identity_differences(locked, actual)` says, file by file, what differs.

What the identity covers (top-level files of the folder only):
- the config: config.json, generation_config.json, the shard map (*.safetensors.index.json) and remote code (*.py,
  which trust_remote_code runs), each by size and sha256 of its bytes;
- the tokenizer: tokenizer.json, tokenizer.model, tiktoken.model, tokenizer_config.json, special_tokens_map.json,
  added_tokens.json, vocab.json, merges.txt, chat_template.json and chat_template*.jinja, the same way;
- every weight file (*.safetensors) by size, the sha256 of its safetensors header (the 8-byte length and the header
  JSON: every tensor's name, dtype, shape and byte range) and a sha256 of its bytes. A folder whose weights total at
  most WHOLE_LIMIT (1 GiB) is hashed whole: complete. A larger folder is hashed by samples of each weight file (its
  data region's first and last SAMPLE_EDGE bytes and SAMPLE_BLOCKS evenly spaced blocks of SAMPLE_BLOCK bytes, about
  3 MiB a file), so a terabyte model is never read whole to lock it or to check it (a 1 TB folder of 64 files: about
  200 MiB read). Each weight file's record says which mode hashed it, and the sampling it used.

What it does NOT cover: in a sampled folder, bytes of a weight file outside the samples (a changed value between
two samples with the same header and size goes unseen: a fine-tune of the same shapes is caught only where its
changes fall in a sample, which for a real fine-tune, changing every tensor, is every sample); files the lists
above do not name (README, weights in other formats such as .bin or .gguf, anything in a subfolder); file modes,
owners and times. A folder without *.safetensors weights has no identity (exit 2).

Every weight file's header is checked against its size first (speclock.core.safetensors.check_safetensors): a
truncated file is exit 2 naming it, not an identity of half a model.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import struct
from fnmatch import fnmatch
from pathlib import Path
from typing import Final, Literal, NotRequired

from speclock.core.docmodel import TypedDict  # typing_extensions' where pydantic is (it validates a lock's identity)
from speclock.core.errors import BadInput
from speclock.core.files import os_error
from speclock.core.safetensors import check_safetensors

IDENTITY_SCHEMA: Final = "speclock.model-identity/v1"
WHOLE_LIMIT = 1 << 30  # a folder whose weights total at most this is hashed whole
SAMPLE_EDGE = 1 << 20  # first and last bytes of a sampled weight file's data region
SAMPLE_BLOCKS = 16  # evenly spaced blocks in between ...
SAMPLE_BLOCK = 64 << 10  # ... of this many bytes each
CONFIG_PATTERNS = ("config.json", "generation_config.json", "*.safetensors.index.json", "*.py")
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer.model",
    "tiktoken.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "chat_template*.jinja",
)
WEIGHT_PATTERN = "*.safetensors"
_CHUNK = 1 << 22


class Sampling(TypedDict):
    edge_bytes: int
    blocks: int
    block_bytes: int


class FileIdentity(TypedDict):
    """One file: size and sha256 (of all its bytes, or for mode "sampled" of its samples); weights add the header."""

    size: int
    sha256: str
    header_sha256: NotRequired[str]  # weight files: the safetensors header (length + JSON)
    mode: NotRequired[str]  # weight files: "whole" or "sampled"
    samples: NotRequired[Sampling]  # mode "sampled": where the samples are (a function of size and these)


class ModelIdentity(TypedDict):
    schema: Literal["speclock.model-identity/v1"]
    weights_bytes: int  # all weight files together (which decided whole or sampled)
    files: dict[str, FileIdentity]  # file name (top level of the folder) -> its identity


_SAMPLING_KEYS: tuple[Literal["edge_bytes", "blocks", "block_bytes"], ...] = ("edge_bytes", "blocks", "block_bytes")
DEFAULT_SAMPLING: Sampling = {"edge_bytes": SAMPLE_EDGE, "blocks": SAMPLE_BLOCKS, "block_bytes": SAMPLE_BLOCK}
_HINT = "give the model's Hugging Face folder (config.json, tokenizer, *.safetensors), complete and readable"


def covered(name: str) -> bool:
    """Whether a top-level file of a model folder is part of its identity."""
    return any(fnmatch(name, p) for p in (*CONFIG_PATTERNS, *TOKENIZER_PATTERNS, WEIGHT_PATTERN))


def _listing(folder: Path) -> list[str]:
    """The names of the folder's covered top-level files; BadInput/EnvironmentProblem naming the folder or file."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise BadInput(f"model folder {folder} does not exist", hint=_HINT) from None
        raise os_error(err, folder, "list the model folder") from None
    if not names:
        raise BadInput(f"model folder {folder} is empty", hint=_HINT)
    return [n for n in names if covered(n)]


def _stat_file(path: Path) -> int:
    """The size of a plain file (through symbolic links, as in a Hugging Face cache snapshot)."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise os_error(err, path, "read the model file") from None  # ELOOP: a link loop, named
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(f"{path} is not a plain file, where the model's {path.name} belongs", hint=_HINT)
    return st.st_size


def _hash_ranges(path: Path, ranges: list[tuple[int, int]]) -> str:
    """sha256 of the bytes of `ranges` ((start, length), in order) of a file."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for start, length in ranges:
                f.seek(start)
                left = length
                while left:
                    block = f.read(min(left, _CHUNK))
                    if not block:
                        raise BadInput(f"{path} is shorter than it was a moment ago (being written?)", hint=_HINT)
                    h.update(block)
                    left -= len(block)
    except OSError as err:
        raise os_error(err, path, "read the model file") from None
    return h.hexdigest()


def sample_ranges(size: int, data_start: int, sampling: Sampling) -> list[tuple[int, int]] | None:
    """(start, length) of a sampled weight file's samples; None where they would cover its data region anyway."""
    edge, blocks, block = sampling["edge_bytes"], sampling["blocks"], sampling["block_bytes"]
    lo, hi = data_start + edge, size - edge
    if hi - lo <= blocks * block:
        return None
    span = hi - lo - block
    middle = [(lo + span * i // max(blocks - 1, 1), block) for i in range(blocks)]
    return [(data_start, edge), *middle, (hi, edge)]


def _weight_identity(path: Path, size: int, sampled: bool, sampling: Sampling) -> FileIdentity:
    check_safetensors(path)  # every tensor's byte range inside the file: a truncated file is named here
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
    except OSError as err:
        raise os_error(err, path, "read the model file") from None
    header = _hash_ranges(path, [(0, 8 + n)])
    ranges = sample_ranges(size, 8 + n, sampling) if sampled else None
    if ranges is None:
        return {"size": size, "header_sha256": header, "mode": "whole", "sha256": _hash_ranges(path, [(0, size)])}
    rec: FileIdentity = {"size": size, "header_sha256": header, "mode": "sampled", "sha256": _hash_ranges(path, ranges)}
    rec["samples"] = {"edge_bytes": sampling["edge_bytes"], "blocks": sampling["blocks"], "block_bytes": sampling["block_bytes"]}
    return rec


def model_identity(
    folder: str | os.PathLike[str], *, whole_limit: int = WHOLE_LIMIT, like: ModelIdentity | None = None
) -> ModelIdentity:
    """The identity of a model folder (see the module's docstring for what it covers).

    `like`: a recorded identity to compare with: each weight file it names is hashed as it was (its mode and
    sampling), so the two records compare file by file. `whole_limit`: the weights total up to which a folder is
    hashed whole (tests lower it). Bad folders (missing, empty, unreadable, a link loop, no config.json or no
    *.safetensors, a truncated weight file) are BadInput (exit 2) or EnvironmentProblem (exit 3) naming the path."""
    folder = Path(folder)
    names = _listing(folder)
    sizes = {name: _stat_file(folder / name) for name in names}
    if "config.json" not in sizes:
        raise BadInput(f"{folder} is not a model folder (no config.json)", hint=_HINT)
    weights = [n for n in names if fnmatch(n, WEIGHT_PATTERN)]
    if not weights:
        raise BadInput(f"{folder} holds no *.safetensors weights: its identity would pin no weights", hint=_HINT)
    total = sum(sizes[n] for n in weights)
    known: dict[str, FileIdentity] = like["files"] if like else {}
    files: dict[str, FileIdentity] = {}
    for name in names:
        path, size = folder / name, sizes[name]
        if name not in weights:
            files[name] = {"size": size, "sha256": _hash_ranges(path, [(0, size)])}
            continue
        before = known.get(name)
        mode = before.get("mode") if before else None
        sampled = mode == "sampled" if mode else total > whole_limit
        sampling = before.get("samples") if before else None
        files[name] = _weight_identity(path, size, sampled, sampling or DEFAULT_SAMPLING)
    return {"schema": IDENTITY_SCHEMA, "weights_bytes": total, "files": files}


def identity_differences(locked: ModelIdentity, actual: ModelIdentity) -> list[tuple[str, str]]:
    """(file, what differs) for every file whose identity differs, in name order: 'missing' (the lock has it, the
    folder not), 'extra' (the reverse), 'size', 'header' (a weight file's tensor names, dtypes, shapes or offsets),
    'bytes' (with how they were hashed). Empty when the folders have the same identity."""
    old, new = locked.get("files") or {}, actual.get("files") or {}
    out: list[tuple[str, str]] = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if b is None:
            out.append((name, "missing (the lock has it, the folder does not)"))
        elif a is None:
            out.append((name, "extra (the folder has it, the lock does not)"))
        elif a.get("size") != b.get("size"):
            out.append((name, f"size ({a.get('size')} bytes in the lock, {b.get('size')} here)"))
        elif a.get("header_sha256") != b.get("header_sha256"):
            out.append((name, "header (tensor names, dtypes, shapes or offsets differ)"))
        elif a.get("sha256") != b.get("sha256"):
            how = "in the sampled blocks" if a.get("mode") == "sampled" else "hashed whole"
            out.append((name, f"bytes ({how}: sha256 {str(a.get('sha256'))[:12]} in the lock, {str(b.get('sha256'))[:12]} here)"))
    return out


def check_identity(value: ModelIdentity, where: str, path: str | os.PathLike[str], hint: str) -> None:
    """The rules of a recorded identity (a lock's) that fits its model (spec.lock_types): a sampled file records
    where its samples are, each count at least 1. BadInput naming the key otherwise."""
    for name, rec in value["files"].items():
        key = f"{where}.files.{name[:80]}"
        if rec.get("mode") != "sampled":
            continue
        samples = rec.get("samples")
        if samples is None:
            raise BadInput(f"{path}: key '{key}.samples': missing (a sampled file records where its samples are)", hint=hint)
        for field in _SAMPLING_KEYS:
            if samples[field] < 1:
                raise BadInput(f"{path}: {key}.samples.{field} is below 1", hint=hint)
