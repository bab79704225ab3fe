"""Where things live inside a speclock image, and where caches live on the build host.

Every module that runs inside an image (doctor, smoke, gate) finds its inputs through
`ImageLayout`, so the Containerfile and the code agree in one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from speclock.core.errors import BadInput
from speclock.core.files import os_error

# The folder holding this speclock package (src/ in a checkout): what a child Python needs on PYTHONPATH
# to import this same copy. The one place, as is REPO_ROOT.
IMPORT_ROOT = Path(__file__).resolve().parents[2]
# The checkout this package runs from (src/speclock/core/layout.py -> the repository root).
REPO_ROOT = IMPORT_ROOT.parent


@dataclass(frozen=True)
class ImageLayout:
    root: Path

    @property
    def venv(self) -> Path:  # the Python environment with the engine (outside root on purpose)
        return Path("/opt/venv")

    @property
    def stack_file(self) -> Path:  # stacks/<name>.toml as built
        return next((self.root / "stacks").glob("*.toml"))

    @property
    def lock_file(self) -> Path:  # the lock the image was built from (JSON)
        return self.root / "lock.json"

    @property
    def target_dir(self) -> Path:  # the target model as a plain Hugging Face folder
        return self.root / "target"

    @property
    def draft_dir(self) -> Path:  # the EAGLE-3 drafter (engine format) with speclock-manifest.json
        return self.root / "draft"

    @property
    def prompts_file(self) -> Path:  # smoke prompts, JSONL
        return self.root / "prompts" / "prompts.jsonl"

    @property
    def patches_dir(self) -> Path:  # the patch series applied at build, for doctor's probes
        return self.root / "patches"

    @property
    def baselines_dir(self) -> Path:  # stored baseline smoke reports
        return self.root / "baselines"

    @property
    def build_info(self) -> Path:  # JSON: tag, inputs hash, labels, patches applied
        return self.root / "image.json"


IMAGE = ImageLayout(Path(os.environ.get("SPECLOCK_HOME", "/opt/speclock")))


def in_image() -> bool:
    """True when running inside an image speclock built."""
    return os.environ.get("SPECLOCK_IN_IMAGE") == "1"


def cache_dir() -> Path:
    """Host cache (wheelhouse, base rootfs, engine wheels): outside git, reused across builds and CI runs.

    A cache path at or under a regular file is bad input (exit 2) naming the file; no traceback."""
    setting = os.environ.get("SPECLOCK_CACHE")
    base = setting or os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "speclock")
    path = Path(base)
    source = "SPECLOCK_CACHE" if setting else ("XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else "the default")
    # The nearest part of the path that exists must be a directory (mkdir would say EEXIST/ENOTDIR).
    for part in [path, *path.parents]:
        if part.exists() or part.is_symlink():
            if not part.is_dir():
                raise BadInput(
                    f"the cache folder {path} ({source}) cannot be made: {part} is a file, where a directory belongs",
                    hint="point SPECLOCK_CACHE at a folder (or a path where one can be made), or move that file",
                )
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, path, "make the cache folder") from None
    return path


def cache_subdir(name: str, *, what: str) -> Path:
    """`name` under the cache, made when missing; an OS error naming it (`what`: what the folder is for)."""
    path = cache_dir() / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, path, f"make the {what}") from None
    return path
