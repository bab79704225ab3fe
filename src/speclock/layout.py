"""Where things live inside a speclock image, and where caches live on the build host.

Every module that runs inside an image (doctor, smoke, gate) finds its inputs through
`ImageLayout`, so the Containerfile and the code agree in one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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
    """Host cache (wheelhouse, base rootfs, engine wheels): outside git, reused across builds and CI runs."""
    base = os.environ.get("SPECLOCK_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "speclock")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path
