"""``store.processes.pid_alive``: a running process is alive; a finished one, reaped or not (a zombie), is not."""

from __future__ import annotations

import os
import subprocess
import sys

from store.processes import pid_alive


def test_this_process_is_alive() -> None:
    assert pid_alive(os.getpid())


def test_a_finished_child_is_not_alive_before_or_after_it_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # it has exited and is not reaped yet
    assert not pid_alive(child.pid)  # a zombie: /proc/PID/stat says Z
    child.wait()
    assert not pid_alive(child.pid)
