"""What the command line must refuse before typer reads it: typer (0.29) validates through Pydantic's lax mode,
which takes ``2.0`` for a whole number, and drops the ``--`` of ``planner probe|tune ... --`` so that a bare
separator would silently run memplan's own loop. :func:`argv_error` reads the words once, with the options each
subcommand declares, and returns the one line that refuses them (None: typer goes on)."""

from __future__ import annotations

import functools
import re
import typing
from collections.abc import Sequence
from typing import Any

SEPARATED_COMMANDS = ("probe", "tune")  # take a user's command after --
VERBOSE = "--verbose"  # the global flag: a failure's whole line, an internal error's traceback (planner.cli.failing)
WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


def _is_int(annotation: Any) -> bool:
    if annotation is int:
        return True
    return int in typing.get_args(annotation) and float not in typing.get_args(annotation)


@functools.lru_cache(maxsize=4)
def click_command(app: Any) -> Any:
    """The click command typer builds from ``app`` (every subcommand's options read from its function's signature),
    built once per process: typer builds it anew on each ``app(...)``, about 23 ms on a 2-core EPYC, twice per
    :func:`planner.cli.main` with :func:`argv_error`'s reading, paid by every in-process caller of ``main`` (the
    suite's thousands of commands) and by nothing else. The command holds no state of a call: click makes a new
    context for each."""
    import typer

    return typer.main.get_command(app)


def _options(app: Any, name: str) -> tuple[set[str], set[str]]:
    """(options of subcommand ``name`` that take a value, those of them that take a whole number)."""
    group = click_command(app)
    sub = getattr(group, "commands", {}).get(name)
    takes_value: set[str] = set()
    whole: set[str] = set()
    for param in getattr(sub, "params", []):
        if getattr(param, "param_type_name", "") != "option" or param.is_flag or param.count:
            continue
        takes_value.update(param.opts)
        descriptor = getattr(param, "type_descriptor", None)
        if _is_int(getattr(descriptor, "annotation", None)):
            whole.update(param.opts)
    return takes_value, whole


def argv_error(app: Any, args: list[str]) -> str | None:
    """The line refusing ``args`` (the words after ``planner``), or None when typer should read them: a whole-number
    option given a value that is not one (``--batch 2.0``), or ``planner probe|tune ... --`` with nothing after."""
    if not args or args[0].startswith("-"):
        return None
    takes_value, whole = _options(app, args[0])
    if args[0] in SEPARATED_COMMANDS and bare_separator(args[1:], takes_value):
        return f"planner {args[0]} -- CMD: give the launch command of your program after --"
    index = 1
    while index < len(args):
        word = args[index]
        if word == "--":
            break
        name, _, inline = word.partition("=")
        if name in whole:
            value = inline if "=" in word else (args[index + 1] if index + 1 < len(args) else None)
            if value is not None and not WHOLE_NUMBER.fullmatch(value.strip()):
                shown = value if len(value) <= 24 else value[:21] + "..."
                return f"{name} must be a whole number, not {shown!r}"
        index += 2 if word in takes_value else 1
    return None


def take_verbose(app: Any, args: list[str]) -> tuple[bool, list[str]]:
    """(whether the global ``--verbose`` flag is in ``args``, the words without it). It may stand before or after
    the subcommand; a ``--verbose`` after the ``--`` of ``planner probe|tune ... -- CMD`` is the user's program's,
    and one that is an option's value (``--study --verbose``) names that value: both are left as they are."""
    if VERBOSE not in args:  # the usual case: the subcommand's options are not read
        return False, args
    first = next((i for i, word in enumerate(args) if not word.startswith("-")), len(args))  # the subcommand
    takes_value = _options(app, args[first])[0] if first < len(args) else set()
    verbose = False
    kept: list[str] = []
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--" and index > first:  # the user's command follows, untouched
            kept.extend(args[index:])
            break
        if word == VERBOSE:
            verbose = True
        else:
            kept.append(word)
        if index > first and word in takes_value and index + 1 < len(args):
            kept.append(args[index + 1])  # its value, whatever it reads
            index += 1
        index += 1
    return verbose, kept


def bare_separator(args: Sequence[str], value_options: set[str]) -> bool:
    """Whether ``args`` (a command line after the subcommand) end in a ``--`` that separates nothing: the first
    ``--`` that is not the value of an option (one of ``value_options``, which take a value) is the last word."""
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--":
            return index == len(args) - 1
        if word in value_options:
            index += 2
            continue
        index += 1
    return False
