"""The user's launch command (``planner probe|tune ... -- CMD``) is checked before anything runs or is stored.

A command the operating system cannot start is bad input, not a probe that failed: the first word must name a
program that ``subprocess.Popen`` can execute from the folder the probe runs in (``shutil.which`` semantics: a
word with a ``/`` is a path, which must be a file this user may execute; a bare word is looked up on ``PATH``).
A bare ``--`` with nothing after it is refused too, rather than silently running memplan's own loop
(``planner.cli.argv_check.bare_separator``, in the CLI). Each refusal is one InputError line, raised before the
database opens.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from store.errors import InputError

SHOWN_CHARS = 80  # a program name longer than this is cut in the line that refuses it


def _shown(word: str) -> str:
    text = repr(word)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def check_command(command: Sequence[str], cwd: Path | None = None) -> list[str]:
    """``command`` as a list when its program can be started from ``cwd`` (default: here); InputError (one line)
    for an empty command, an empty program name, a path that does not exist, is a folder or is not executable,
    and a name ``PATH`` does not hold."""
    if not command:
        raise InputError("-- CMD: give the launch command of your program after --")
    program = command[0]
    if not program.strip():
        raise InputError("-- CMD: the program name is empty")
    if "\x00" in program:
        raise InputError(f"-- CMD: the program name {_shown(program)} holds a NUL character")
    if os.sep in program or (os.altsep is not None and os.altsep in program):
        path = Path(program).expanduser()
        path = path if path.is_absolute() else (cwd or Path.cwd()) / path
        try:
            if path.is_dir():
                raise InputError(f"-- CMD: {_shown(program)} is a folder, not a program")
            if not path.exists():
                raise InputError(f"-- CMD: program {_shown(program)} does not exist")
        except OSError as exc:  # a name too long for the file system, a folder it may not search
            raise InputError(f"-- CMD: cannot look up program {_shown(program)}: {exc.strerror}") from None
        if not os.access(path, os.X_OK):
            raise InputError(
                f"-- CMD: {_shown(program)} is not executable (chmod +x it, or run it with its interpreter)"
            )
        return list(command)
    try:
        found = shutil.which(program)
    except OSError:
        found = None
    if found is None:
        raise InputError(f"-- CMD: program {_shown(program)} is not found on PATH")
    return list(command)
