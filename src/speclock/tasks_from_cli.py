"""invoke tasks generated from the `speclock` CLI parser, so every sub-command flag works from both.

Each task has exactly its sub-command's options (same long names; values are handed to the CLI as
given, so the CLI's types, choices and defaults stay the only ones), plus `--args` for anything else.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from invoke import Local, Task

from speclock.cli import build_parser

# A command group's task runs this sub-command (`invoke patches` = `speclock patches check`).
GROUP_DEFAULTS = {"patches": "check", "train": "all", "stack": "check"}
# Extra arguments for the CLI, taken as one shell-quoted string (`--args "--num-prompts 3"`).
EXTRA = "args"


@dataclass(frozen=True)
class TaskOption:
    """One argparse action as a task parameter: how invoke takes it and how it goes back to the CLI."""

    name: str  # the task parameter (and `--name` flag of the task)
    flag: str | None  # the CLI option string; None: a positional argument
    kind: str  # "flag" (store_true), "count", "value", "list" (append / nargs), "words" (remainder)
    required: bool
    help: str

    def default(self):
        return {"flag": False, "count": 0, "list": None}.get(
            self.kind, inspect.Parameter.empty if self.required and self.flag is None else None
        )

    def argv(self, value) -> list[str]:
        """The CLI arguments for this option's task value ([] when not given: the CLI default applies)."""
        if value in (None, False, 0, "", []) and not (self.kind == "value" and value == 0):
            return []
        if self.kind == "words":
            return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]
        values = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        if self.flag is None:  # a positional argument (flags and counts are options: they have a flag)
            return values
        if self.kind == "flag":
            return [self.flag]
        if self.kind == "count":
            return [self.flag] * int(value)
        if self.kind == "list":
            return [self.flag, *values]
        return [self.flag, values[0]]


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    try:
        text = text % {**vars(action), "prog": ""}
    except (KeyError, TypeError, ValueError):
        pass
    if action.default not in (None, False, argparse.SUPPRESS, "") and "default" not in text:
        text += f" (default {action.default})"
    if action.choices and "|" not in text:
        text += f" [{'|'.join(map(str, action.choices))}]"
    return text.strip()


def options_of(parser: argparse.ArgumentParser) -> list[TaskOption]:
    """The task options of one sub-command parser, in the parser's order."""
    out = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        if a.option_strings:
            long = next((s for s in a.option_strings if s.startswith("--")), a.option_strings[0])
            name = long.lstrip("-").replace("-", "_")
            if isinstance(a, argparse._StoreTrueAction):
                kind = "flag"
            elif isinstance(a, argparse._CountAction):
                kind = "count"
            elif isinstance(a, argparse._AppendAction) or a.nargs in ("+", "*"):
                kind = "list"
            else:
                kind = "value"
            out.append(TaskOption(name, long, kind, bool(a.required), _help(a)))
        else:
            # An optional or open-ended positional becomes a `--name` option of the task.
            kind = "words" if a.nargs in (argparse.REMAINDER, "*", "+") else "value"
            required = a.nargs is None
            out.append(TaskOption(a.dest, None, kind, required, _help(a)))
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return {c.dest: c.help or "" for c in (sub._choices_actions if sub else [])}


def commands(parser: argparse.ArgumentParser | None = None) -> dict[str, tuple[list[str], argparse.ArgumentParser, str]]:
    """{task name: (CLI command words, its parser, its one-line help)} for every top-level sub-command."""
    parser = parser or build_parser()
    out = {}
    for name, sp in _subparsers(parser).items():
        words, summary = [name], _summaries(parser).get(name, "")
        leaves = _subparsers(sp)
        if leaves:
            leaf = GROUP_DEFAULTS[name]
            words, summary = [name, leaf], _summaries(sp).get(leaf, summary)
            sp = leaves[leaf]
        out[name] = (words, sp, summary)
    return out


def cli_task(
    name: str, words: list[str], parser: argparse.ArgumentParser, summary: str, run: Callable[[object, list[str]], object]
) -> Task:
    """An invoke task named `name` that runs `speclock WORDS ...` with its parser's options."""
    opts = options_of(parser)
    if EXTRA not in {o.name for o in opts}:
        opts.append(TaskOption(EXTRA, None, "words", False, f"more arguments for `speclock {' '.join(words)}`"))

    def body(c, **values):
        argv = list(words)
        named = [o for o in opts if o.flag is not None]
        positional = [o for o in opts if o.flag is None]
        for o in named + positional:
            argv += o.argv(values.get(o.name))
        return run(c, argv)

    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [
        inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=o.default())
        for o in opts
        if o.default() is inspect.Parameter.empty
    ]
    params += [
        inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=o.default())
        for o in opts
        if o.default() is not inspect.Parameter.empty
    ]
    # What invoke reads (inspect.signature): function attributes live in __dict__ (typeshed declares no __signature__).
    body.__dict__["__signature__"] = inspect.Signature(params)
    body.__name__ = name.replace("-", "_")
    body.__doc__ = summary[:1].upper() + summary[1:] + f" (runs `speclock {' '.join(words)}`)."
    return Task(
        body,
        name=name,
        help={o.name: o.help for o in opts},
        positional=[o.name for o in opts if o.default() is inspect.Parameter.empty],
        iterable=[o.name for o in opts if o.kind == "list"],
        incrementable=[o.name for o in opts if o.kind == "count"],
    )


def cli_tasks(run: Callable[[object, list[str]], object], skip: Collection[str] = frozenset()) -> list[Task]:
    """One task per `speclock` sub-command (except those in `skip`)."""
    return [cli_task(name, words, sp, summary, run) for name, (words, sp, summary) in commands().items() if name not in skip]


class SignalForwardingLocal(Local):
    """invoke's local runner with Ctrl-C passed through (#40): the command runs in a process group of its own, so a
    terminal's Ctrl-C reaches invoke alone, which sends SIGINT to the command's group once and waits for it; invoke
    then exits with the command's code (speclock's 130). invoke's own runner writes ^C to the command's stdin pipe
    instead, and where that pipe is closed it exits 1 at once while speclock runs on. SIGTERM and SIGHUP to invoke
    are passed on the same way. Set as `runners.local` in tasks.py."""

    PASSED_ON = (signal.SIGTERM, signal.SIGHUP)

    def start(self, command: str, shell: str, env: dict[str, Any]) -> None:
        if self.using_pty:
            super().start(command, shell, env)
            return
        self.process = subprocess.Popen(
            command,
            shell=True,
            executable=shell,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.PIPE,
            process_group=0,
        )
        self._saved_handlers: dict[int, Any] = {}
        try:
            for sig in self.PASSED_ON:
                self._saved_handlers[sig] = signal.signal(sig, lambda signum, frame: self._pass_on(signum))
        except ValueError:  # not the main thread: invoke's defaults stay
            pass

    def _pass_on(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # the command has ended

    def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        if self.using_pty:
            super().send_interrupt(interrupt)
        else:
            self._pass_on(signal.SIGINT)

    def stop(self) -> None:
        for sig, handler in getattr(self, "_saved_handlers", {}).items():
            signal.signal(sig, handler)
        self._saved_handlers = {}
        super().stop()
