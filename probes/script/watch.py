"""``python -m probes.script.watch COMMAND ARGS...``: run the user's command in a process that ends with the planner.

The script probe (:mod:`probes.script.launch`) starts this, not the command itself, in a process group of its
own: it watches its parent and the planner (:func:`probes.process.parent_watch.watch_parent`: the parent-death
signal, SIGTERM and SIGHUP, and a watch thread), and ends the command with every process under it (ranks a
launcher put in sessions of their own included) when either is gone. The command is started as its child with
the same environment, in the same process group, with this process as the child subreaper
(``PR_SET_CHILD_SUBREAPER``): a daemon the command starts (double fork and ``setsid``) is adopted by this process
instead of init, so it is found under it and ended with the rest when the command ends, when the planner stops
or kills the tree, and when the planner is gone. This process exits with the command's exit code (a command
killed by signal N: 128 + N). Pure Python: no torch here.
"""

from __future__ import annotations

import subprocess
import sys

from probes.process.parent_watch import set_child_subreaper, watch_parent
from probes.process.process_tree import end_descendants

__all__ = ["exit_code", "main"]


def exit_code(returncode: int) -> int:
    """A shell's exit code for ``returncode`` (negative: killed by that signal)."""
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str]) -> int:
    """Watch the parent, run ``argv`` as the reaper of everything it starts, end all of it once ``argv`` ends
    (a daemon too), return its exit code."""
    watch_parent()
    set_child_subreaper()  # a daemon of the program (double fork, setsid) stays under this process
    try:
        proc = subprocess.Popen(argv)
    except OSError as exc:
        print(f"memplan script probe: cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    code = exit_code(proc.wait())
    end_descendants()  # what the program left running: a daemon, a helper it did not wait for
    return code


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m probes.script.watch COMMAND [ARGS...]")
    sys.exit(main(sys.argv[1:]))
