"""``planner ARGS`` run in this process (``planner.cli.main``), its stdout and stderr captured: the one helper the
test folders share for it, where a new ``python -m planner`` process (a second of start-up) is not what a test is
about."""

from __future__ import annotations

import contextlib
import io
import subprocess


def run_planner_here(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``planner.cli.main(ARGS)`` in this process and the current folder: what ``python -m planner ARGS`` does
    there but for the process, as a finished process (return code, stdout, stderr)."""
    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        returncode = main([str(arg) for arg in args])
    return subprocess.CompletedProcess(["planner", *args], returncode, out.getvalue(), err.getvalue())
