"""Nothing outlives the planner: a probe child and its helpers end with it, and its working folder goes too.

Real processes, no torch: a small "planner" (the real :func:`probes.process.isolation.run_child` under the real
:func:`planner.cli.stopping.stop_on_signals`, as ``planner probe`` runs it) starts a child program that calls the
real :func:`probes.process.parent_watch.watch_parent` first, as :mod:`probes.step.child` does, and then starts two
helpers:
one in the child's process group and one in a group of its own (as ninja starts every compile command). The
planner is then sent SIGTERM or SIGKILL. PDEATHSIG and the watch thread are each shown alone (the other one
switched off), since either must be enough. Every wait is generous: a failure is a process left running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from probes.process.workdir import OWNER_FILE, PREFIX, remove_stale_folders
from store.processes import pid_alive

PROJECT = Path(__file__).resolve().parents[2]
PATIENCE_S = 120.0  # the most any process here may take to start or to be gone (a busy 2-core machine)

PLANNER = """
import os, sys
from planner.cli.stopping import stop_on_signals
from probes.process.isolation import child_env, run_child

env = child_env("cpu", "default")
env["PYTHONPATH"] = sys.argv[1] + os.pathsep + env["PYTHONPATH"]
request = {"poll_s": float(sys.argv[2]), "pdeathsig": sys.argv[3] == "1"}
code = 0
with stop_on_signals() as stop:
    run_child(request, env, 600.0, module="watched_program")
sys.exit(stop.finish(code))
"""

PROGRAM = """
import json, os, subprocess, sys, time
from pathlib import Path
import probes.process.parent_watch as watch

folder = Path(sys.argv[1])
request = json.loads((folder / "request.json").read_text())
if not request["pdeathsig"]:
    watch.set_parent_death_signal = lambda sig=None: False
watch.watch_parent(poll_s=request["poll_s"])
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
own_group = subprocess.Popen(sleep, process_group=0)  # as ninja starts a compile command
same_group = subprocess.Popen(sleep)
with (folder / "events.jsonl").open("a") as events:
    events.write(json.dumps({"pids": [os.getpid(), own_group.pid, same_group.pid]}) + "\\n")
time.sleep(600)
"""


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = PATIENCE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} after {timeout_s:g} s"
        time.sleep(0.05)


def _start(tmp_path: Path, poll_s: float, pdeathsig: bool) -> tuple[subprocess.Popen[bytes], list[int], Path]:
    """The planner, its child's pids (child, helper in its own group, helper in the child's group), its TMPDIR."""
    (tmp_path / "watched_program.py").write_text(textwrap.dedent(PROGRAM))
    (tmp_path / "fake_planner.py").write_text(textwrap.dedent(PLANNER))
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(PROJECT)}
    argv = [sys.executable, str(tmp_path / "fake_planner.py"), str(tmp_path), str(poll_s), "1" if pdeathsig else "0"]
    planner = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    pids: list[int] = []

    def announced() -> bool:
        for events in temp.glob(f"{PREFIX}*/events.jsonl"):
            lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
            pids.extend(lines[0]["pids"] if lines else [])
        return bool(pids) or planner.poll() is not None

    _wait(announced, "the child did not announce itself")
    assert planner.poll() is None, planner.stderr.read() if planner.stderr else ""
    return planner, pids, temp


def _assert_all_gone(pids: list[int]) -> None:
    assert len(pids) == 3
    _wait(lambda: not any(pid_alive(pid) for pid in pids), f"still running: {[p for p in pids if pid_alive(p)]}")


@pytest.mark.parametrize(
    ("poll_s", "pdeathsig"), [(600.0, True), (0.1, False)], ids=["parent-death-signal", "watch-thread"]
)
def test_a_killed_planner_takes_its_child_and_the_helpers_with_it(
    tmp_path: Path, poll_s: float, pdeathsig: bool
) -> None:
    planner, pids, temp = _start(tmp_path, poll_s, pdeathsig)
    try:
        planner.kill()
        assert planner.wait(timeout=PATIENCE_S) == -signal.SIGKILL
        _assert_all_gone(pids)
    finally:
        for pid in pids:
            with_suppressed_kill(pid)
    (left,) = temp.glob(f"{PREFIX}*")  # a killed planner cannot remove its folder: it names its owner
    assert (left / OWNER_FILE).read_text().split()[1] == str(planner.pid)
    assert remove_stale_folders(temp) == [left]  # the next run's clean-up
    assert list(temp.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_the_child_remove_the_folder_and_exit_128_plus_signum(
    tmp_path: Path, sig: signal.Signals
) -> None:
    planner, pids, temp = _start(tmp_path, 600.0, False)  # no parent watch: the planner ends them itself
    try:
        planner.send_signal(sig)
        assert planner.wait(timeout=PATIENCE_S) == 128 + sig
        assert planner.stderr is not None
        assert planner.stderr.read().decode().strip() == f"planner: stopped by {sig.name}; its probes were ended"
        _assert_all_gone(pids)
    finally:
        for pid in pids:
            with_suppressed_kill(pid)
    assert list(temp.iterdir()) == []


def test_folders_of_running_planners_are_left_alone(tmp_path: Path) -> None:
    live = tmp_path / f"{PREFIX}{os.getpid()}-abc"
    live.mkdir()
    (live / OWNER_FILE).write_text(f"{os.uname().nodename} {os.getpid()}")
    unowned = tmp_path / f"{PREFIX}{os.getpid()}-def"  # being made right now: no owner file yet
    unowned.mkdir()
    other = tmp_path / f"{PREFIX}x"  # not one of ours
    other.mkdir()
    assert remove_stale_folders(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, unowned.name, other.name])


def with_suppressed_kill(pid: int) -> None:
    """Kill what a failed test left (never the test's own process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
