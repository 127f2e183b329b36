"""``python -m probes.script.watch COMMAND ARGS...``: run the user's command in a process that ends with the planner.

The script probe (:mod:`probes.script.launch`) starts this, not the command itself, in a process group of its
own: it watches its parent and the planner (:func:`probes.process.parent_watch.watch_parent`: the parent-death
signal, SIGTERM and SIGHUP, and a watch thread), and ends the command with every process under it (ranks a
launcher put in sessions of their own included) when either is gone. The command is started as its child with
the same environment, in the same process group; this process exits with the command's exit code (a command
killed by signal N: 128 + N). Pure Python: no torch here.
"""

from __future__ import annotations

import subprocess
import sys

from probes.process.parent_watch import watch_parent

__all__ = ["exit_code", "main"]


def exit_code(returncode: int) -> int:
    """A shell's exit code for ``returncode`` (negative: killed by that signal)."""
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str]) -> int:
    """Watch the parent, run ``argv``, return its exit code."""
    watch_parent()
    try:
        proc = subprocess.Popen(argv)
    except OSError as exc:
        print(f"memplan script probe: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    return exit_code(proc.wait())


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m probes.script.watch COMMAND [ARGS...]")
    sys.exit(main(sys.argv[1:]))
