"""A user program that daemonizes (double fork and ``setsid``) does not outlive its probe (issue 43): the watch
process that runs the program is its child subreaper, so the daemon is found under it and ended when the program
ends, and when the planner is stopped with SIGTERM. Real processes, no torch: the program imports no DeepSpeed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_script_probe import PATIENCE_S, PLANNER, ROOT, TIMEOUT_S, python, settings_for, wait_for

from probes.script.launch import run_script_probe


def _gone(pid: int) -> bool:
    """Whether ``pid`` names no live process (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _read_pid(path: Path) -> int:
    wait_for(path.exists, "the daemon to write its pid")
    return int(path.read_text())


@pytest.fixture
def daemon_pid_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "daemon.pid"
    yield path
    if path.exists():  # a failing test leaves no daemon behind
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(path.read_text()), signal.SIGKILL)


def test_a_daemon_the_program_started_is_ended_with_the_probe(daemon_pid_file: Path) -> None:
    result = run_script_probe(python("daemonizes.py", str(daemon_pid_file)), settings_for(), TIMEOUT_S)
    assert result.exit_code == 0 and not result.initialized, result.log_tail
    pid = _read_pid(daemon_pid_file)
    deadline = time.monotonic() + PATIENCE_S  # it is gone when the probe returns; the wait only forgives a reaper
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), f"the daemon {pid} outlived the probe"


def test_a_daemon_is_ended_when_the_planner_is_stopped(daemon_pid_file: Path) -> None:
    command = python("daemonizes.py", str(daemon_pid_file), "--then", "wait")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    planner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(PLANNER), json.dumps(settings_for().to_dict()), json.dumps(command)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        pid = _read_pid(daemon_pid_file)
        planner.send_signal(signal.SIGTERM)
        output, _ = planner.communicate(timeout=PATIENCE_S)
        assert planner.returncode == 143, output.decode(errors="replace")
        wait_for(lambda: _gone(pid), "the daemon to be gone after the planner stopped")
    finally:
        if planner.poll() is None:
            planner.kill()
            planner.wait()
