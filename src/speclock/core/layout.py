"""Where things live inside a speclock image, and where caches live on the build host.

Every module that runs inside an image (doctor, smoke, gate) finds its inputs through
`ImageLayout`, so the Containerfile and the code agree in one place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from speclock.core.errors import BadInput
from speclock.core.files import os_error

# The folder holding this speclock package (src/ in a checkout, site-packages in an install): what a child
# Python needs on PYTHONPATH to import this same copy. It says where the code is, never where the project is.
IMPORT_ROOT = Path(__file__).resolve().parents[2]

# The project (stacks/, locks/, patches/, models/, baselines/) is found as git and cargo find theirs: `--root DIR`
# (the CLI applies it with use_root() before it imports the command modules, and exports it in this variable for
# the processes it starts), else this variable, else the nearest folder at or above the working directory that
# holds both stacks/ and locks/ (docs/install.md).
ROOT_ENV = "SPECLOCK_ROOT"
ROOT_MARKERS = ("stacks", "locks")
NO_PROJECT_HINT = f"run inside a speclock project (a folder holding {' and '.join(m + '/' for m in ROOT_MARKERS)}) or pass --root DIR / {ROOT_ENV}"


@dataclass(frozen=True)
class ProjectRoot:
    path: Path  # the project; where none was found, the working directory (so paths in messages read naturally)
    source: str  # "--root" / SPECLOCK_ROOT, "the working directory", "the image", or "none"
    problem: str | None = None  # why the root given explicitly cannot be used

    @property
    def found(self) -> bool:
        return self.source != "none" and self.problem is None


def is_project(folder: Path) -> bool:
    return all((folder / m).is_dir() for m in ROOT_MARKERS)


def find_root(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> ProjectRoot:
    """The project root by the rule above. Inside an image (and a host-env, which has the image's layout) the
    package sits in the image's own tree, whose parent is the root it always had: that stays."""
    env = os.environ if environ is None else environ
    if env.get("SPECLOCK_IN_IMAGE") == "1":
        return ProjectRoot(IMPORT_ROOT.parent, "the image")
    try:
        here = (cwd or Path.cwd()).absolute()
    except OSError:  # the working directory was removed under us
        here = Path("/")
    given = env.get(ROOT_ENV)
    if given:
        path = (here / given).resolve()
        problem = None if path.is_dir() else f"{ROOT_ENV}={given}: {path} is not a folder"
        return ProjectRoot(path, ROOT_ENV, problem)
    for folder in [here, *here.parents]:
        if is_project(folder):
            return ProjectRoot(folder, "the working directory")
    return ProjectRoot(here, "none")


ROOT = find_root()
# The project this process works on, found once at import (modules bind it by value; tests monkeypatch it).
REPO_ROOT = ROOT.path


def no_project(cwd: Path | None = None) -> BadInput:
    """The error of a command that needs a project where none was found (exit 2)."""
    here = cwd or ROOT.path
    return BadInput(
        f"no speclock project here: no folder holding {' and '.join(m + '/' for m in ROOT_MARKERS)} at or above {here}",
        hint=NO_PROJECT_HINT,
    )


def use_root(path: Path, source: str = "--root") -> None:
    """Make `path` the project root of this process after import (the CLI's --root, for callers that imported
    speclock's modules before parsing): every loaded speclock module that bound the old REPO_ROOT is rebound."""
    global ROOT, REPO_ROOT
    old = REPO_ROOT
    ROOT = ProjectRoot(path, source, None if path.is_dir() else f"--root {path} is not a folder")
    REPO_ROOT = path
    for name, module in list(sys.modules.items()):
        if name.startswith("speclock.") and getattr(module, "REPO_ROOT", None) is old:
            module.REPO_ROOT = path  # type: ignore[attr-defined]


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
