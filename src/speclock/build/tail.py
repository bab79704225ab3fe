"""buildah builds in two calls: the body (every stage, up to the runtime stage's last step before speclock's
source) tagged by the hash of what it is made from, then the tail (`FROM body` + `COPY config` + the labels).

Why: after a one-line edit of speclock's source only the tail changes, but a whole-Containerfile build walks
every step's cache first (0.6 s of buildah's 0.8 s on 2 cores, docs/benchmarks.md, "Warm rebuild (#37)").
When the body's tag is in the store the body is not built again. The tail is one commit; its layers
are what the whole file gives (tests/test_build_warm.py).

The body's key: its Containerfile text, the build arguments (they carry the hash of every bind-mounted folder
and the base image's ref, which is why buildah's own layer cache is sound), the timestamp, the builder's
version and its storage driver. The wheels are covered by the hash-pinned lists in WHEELS_SHA256."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from pathlib import Path

from speclock.build.builders import Builder
from speclock.core.heartbeat import Progress

TAIL = "COPY config /opt/speclock"  # the last instruction of containers/Containerfile


def split(text: str) -> str | None:
    """The Containerfile without its last instruction when that is TAIL; None (build it whole) otherwise."""
    stripped = text.rstrip()
    if not stripped.endswith("\n" + TAIL):
        return None
    return stripped[: -len(TAIL)]


def body_key(body: str, build_args: dict[str, str], timestamp: int, builder_version: str, driver: str) -> str:
    h = hashlib.sha256()
    h.update(f"builder:{builder_version}\ndriver:{driver}\ntimestamp:{timestamp}\n".encode())
    for key, value in sorted(build_args.items()):
        h.update(f"arg:{key}={value}\n".encode())
    h.update(b"containerfile:" + body.encode())
    return h.hexdigest()


def build_in_two(
    builder: Builder,
    *,
    body: str,
    key: str,
    stack_name: str,
    context: Path,
    tag: str,
    build_args: dict[str, str],
    labels: dict[str, str],
    no_cache: bool,
    timestamp: int,
    progress: Progress = print,
    before_body: Callable[[], None] = lambda: None,
) -> str:
    """Build the body unless its tag is in the store, then the tail as `tag`; return the image id.

    `before_body` runs before the body is built, only then (build-image imports the base image there)."""
    body_ref = f"localhost/speclock-{stack_name}-body:{key[:16]}"
    with tempfile.TemporaryDirectory(prefix="speclock-tail-") as tmp:
        if no_cache or not builder.image_exists(body_ref):
            before_body()
            body_file = Path(tmp) / "Containerfile.body"
            body_file.write_text(body)
            builder.build(
                containerfile=body_file,
                context=context,
                tag=body_ref,
                build_args=build_args,
                labels={},
                target="runtime",
                no_cache=no_cache,
                timestamp=timestamp,
            )
        else:
            progress(f"  every stage before speclock's source: {body_ref} (in the store)")
        tail_file = Path(tmp) / "Containerfile.tail"
        tail_file.write_text(f"FROM {body_ref}\n{TAIL}\n")
        # ONE commit instead of two (the COPY layer, then the LABEL step's image): 0.8 s instead of 1.4 s at load
        # ~3.6 on 2 cores (docs/benchmarks.md, "Warm rebuild (#37)"). buildah puts the labels before the COPY then
        # (builders.buildah.labelled_containerfile), so the layer is recorded as COPY's. The layers are byte-identical
        # to a whole-file build's, its history is not (entries marked empty elsewhere), so every buildah build goes
        # this way, --no-cache too: the same inputs give the same image id.
        # The tag is set only when the tail commits: a build stopped anywhere leaves no image under it.
        return builder.build(
            containerfile=tail_file,
            context=context,
            tag=tag,
            build_args={},
            labels=labels,
            target=None,
            no_cache=no_cache,
            timestamp=timestamp,
            layers=False,
        )
