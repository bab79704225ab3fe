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

import os
from pathlib import Path
from typing import Any

from speclock.core.errors import BadInput

# The format's reader lives in core (the lock's model identity reads it too); its names stay importable from here.
from speclock.core.safetensors import DTYPE_BYTES as DTYPE_BYTES
from speclock.core.safetensors import check_safetensors
from speclock.core.safetensors import read_safetensors_header as read_safetensors_header


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
