"""A probe of several ranks: ``torch.distributed.run`` starts N children on this node; watch them, end them.

One probe of a plan for N GPUs (N > 1, one node) is one rank group: the parent starts PyTorch's elastic
launcher (``python -m probes.process.watched torch.distributed.run --nproc-per-node N --master-port P -m
probes.step.child
DIR``: the ``torchrun`` of the venv, in a process that ends with the planner, :mod:`probes.process.parent_watch`) in
its own process group, with the environment of :func:`probes.process.isolation.child_env`
(``LOCAL_SIZE`` set to N, as DeepSpeed's launcher sets it; the launcher sets RANK, LOCAL_RANK, WORLD_SIZE and
MASTER_PORT of each rank). Every rank runs :mod:`probes.step.child` in ``DIR/rank<r>/``: its own events, result
and allocation records, the request read from ``DIR``. The ranks' output goes to the one ``DIR/child.log``.

The parent polls every ``poll_s`` seconds and ends the group (:func:`kill_tree`) when the launcher has
exited, when any rank has reported a failure (its outcome is recorded; the others, waiting for it in a
collective, are not waited for), or when ``timeout_s`` has passed. The launcher starts each rank in a session
of its own, so killing the launcher's group would orphan them: the launcher's group is stopped first
(SIGSTOP: it starts nothing more), then every descendant found under ``/proc`` and every pid a rank
announced is killed with its process group, then the launcher (:mod:`probes.process.process_tree`). The working
folder is :func:`probes.process.workdir.probe_folder`'s. Pure Python: no torch here.

On the CPU the ranks are instead forked from the preloaded starter (:mod:`probes.process.preloaded`, where
:func:`~probes.process.preloaded.preload_enabled`), each with the environment the launcher would have given it
(:func:`rank_env`), without the launcher: a rank's imports are about 6 CPU seconds on 2 cores, most of a tiny
probe. The parent then watches the ranks themselves: the group ends when every rank has exited, when one has
failed (its report says so, or it exited non-zero: the others wait for it in a collective) or at the timeout, and
each rank is killed with its tree. ``MEMPLAN_PRELOAD=0`` (or a CUDA probe) uses the launcher.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from probes.process.artifacts import read_artifacts
from probes.process.isolation import (
    CHILD_MODULE,
    EVENTS_FILE,
    LOG_FILE,
    REQUEST_FILE,
    RESULT_FILE,
    ChildRun,
    read_events,
    read_result,
    release_shared_memory,
    tail,
    wait_group_gone,
)
from probes.process.jit_lock import extensions_root, release_stale_locks
from probes.process.preloaded import StartedChild, preload_enabled, prepare, start_child
from probes.process.process_tree import descendants, kill_tree
from probes.process.workdir import probe_folder

__all__ = ["GroupRun", "descendants", "kill_tree", "launcher_command", "rank_env", "rank_folder", "run_group"]

LAUNCHER = "torch.distributed.run"
WATCHED = "probes.process.watched"  # runs the launcher in a process that ends with the planner
POLL_S = 0.1


def rank_folder(folder: Path, rank: int) -> Path:
    """Where rank ``rank`` of a group writes its events, result and records."""
    return folder / f"rank{rank}"


def launcher_command(world_size: int, port: str, module: str, folder: Path) -> list[str]:
    """The elastic launcher's command line for ``world_size`` ranks of ``python -m module folder``."""
    return [
        sys.executable,
        "-m",
        WATCHED,
        LAUNCHER,
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(world_size),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--max-restarts",
        "0",
        "-m",
        module,
        str(folder),
    ]


def rank_env(env: dict[str, str], rank: int, world_size: int) -> dict[str, str]:
    """The environment ``torch.distributed.run`` gives rank ``rank`` of one node of ``world_size`` ranks (its
    ``_start_workers``: rank, group and role variables; ``OMP_NUM_THREADS=1`` unless set, as ``run.py`` sets it for
    several ranks a node), for a rank started without it."""
    ranks = str(world_size)
    return {
        **env,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": ranks,
        "LOCAL_WORLD_SIZE": ranks,
        "LOCAL_SIZE": ranks,
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": ranks,
        "MASTER_ADDR": "127.0.0.1",
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
    }


@dataclass
class GroupRun:
    """What the parent saw of a rank group: the launcher's exit, why it ended, each rank's report."""

    returncode: int | None
    timed_out: bool
    wall_s: float
    pid: int  # the launcher's process id (and group)
    ranks: list[ChildRun] = field(default_factory=list)  # by rank
    log_tail: str = ""
    stopped_after_failure: bool = False  # a rank reported a failure and the group was ended


def _rank_failed(folder: Path, world_size: int) -> bool:
    for rank in range(world_size):
        result = read_result(rank_folder(folder, rank) / RESULT_FILE)
        if result is not None and result.get("outcome") != "ok":
            return True
    return False


def _announced(folder: Path, world_size: int) -> list[int]:
    pids = []
    for rank in range(world_size):
        for event in read_events(rank_folder(folder, rank) / EVENTS_FILE):
            if isinstance(event.get("pid"), int):
                pids.append(event["pid"])
    return pids


def run_group(
    request: dict[str, Any],
    env: dict[str, str],
    timeout_s: float,
    world_size: int,
    module: str = CHILD_MODULE,
    poll_s: float = POLL_S,
) -> GroupRun:
    """Run ``world_size`` ranks of ``python -m module DIR`` on ``request`` within ``timeout_s`` seconds."""
    env = {**env, "LOCAL_SIZE": str(world_size)}
    forked = preload_enabled(module, env)
    if forked:
        prepare(module, rank_env(env, 0, world_size))  # the starter's imports are not the group's time
    with probe_folder() as folder:
        (folder / REQUEST_FILE).write_text(json.dumps(request), encoding="utf-8")
        for rank in range(world_size):
            rank_folder(folder, rank).mkdir()
        start = time.perf_counter()
        with (folder / LOG_FILE).open("wb") as log:
            if forked:
                returncode, pid, timed_out, stopped = _watch_forked(
                    folder, env, module, world_size, log, timeout_s, poll_s
                )
            else:
                returncode, pid, timed_out, stopped = _watch_launched(
                    folder, env, module, world_size, log, timeout_s, poll_s
                )
        wall = time.perf_counter() - start
        ranks = []
        for rank in range(world_size):
            where = rank_folder(folder, rank)
            result = read_result(where / RESULT_FILE)
            ranks.append(
                ChildRun(
                    returncode=None,
                    timed_out=timed_out and result is None,
                    wall_s=wall,
                    pid=next((e["pid"] for e in read_events(where / EVENTS_FILE) if "pid" in e), 0),
                    events=read_events(where / EVENTS_FILE),
                    result=result,
                    artifacts=read_artifacts(where, result),
                )
            )
        return GroupRun(
            returncode=returncode,
            timed_out=timed_out,
            wall_s=wall,
            pid=pid,
            ranks=ranks,
            log_tail=tail(folder / LOG_FILE),
            stopped_after_failure=stopped,
        )


Watched = tuple[int | None, int, bool, bool]  # return code, the launcher's (or rank 0's) pid, timed out, stopped


def _watch_launched(
    folder: Path, env: dict[str, str], module: str, world_size: int, log: IO[bytes], timeout_s: float, poll_s: float
) -> Watched:
    """The ranks under ``torch.distributed.run``: until the launcher exits, a rank reports a failure or the
    timeout; then the launcher's tree is ended."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        launcher_command(world_size, env["MASTER_PORT"], module, folder),
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        timed_out, stopped = _wait(
            lambda: proc.poll() is None, lambda: _rank_failed(folder, world_size), start, timeout_s, poll_s
        )
    finally:  # whatever ended the wait (an interrupt too): leave nothing behind
        kill_tree(proc.pid, _announced(folder, world_size))
        proc.wait()
        wait_group_gone(proc.pid)
        _release(env)
    return proc.returncode, proc.pid, timed_out, stopped


def _watch_forked(
    folder: Path, env: dict[str, str], module: str, world_size: int, log: IO[bytes], timeout_s: float, poll_s: float
) -> Watched:
    """The ranks forked from the preloaded starter: until every rank has exited, one has failed (reported, or
    exited non-zero) or the timeout; then each rank's tree is ended."""
    start = time.perf_counter()
    ranks: list[StartedChild] = []
    try:
        for rank in range(world_size):
            ranks.append(start_child(module, [str(folder)], folder, rank_env(env, rank, world_size), log))
        timed_out, stopped = _wait(
            lambda: any(child.poll() is None for child in ranks),
            lambda: _rank_failed(folder, world_size) or any(child.poll() not in (None, 0) for child in ranks),
            start,
            timeout_s,
            poll_s,
        )
    finally:  # whatever ended the wait (an interrupt too): leave nothing behind
        ended = [child.poll() for child in ranks]  # before any is killed: a failed rank's own code
        announced = _announced(folder, world_size)
        for child in ranks:
            kill_tree(child.pid, announced)
        for child in ranks:
            child.wait()
            wait_group_gone(child.pid)
        _release(env)
    # the code of a rank that ended on its own first (its peers' -9 is this watch's doing), else of any rank
    codes = [code for code in ended if code] + [child.poll() for child in ranks]
    returncode = next((code for code in codes if code), 0)
    return returncode, ranks[0].pid if ranks else 0, timed_out, stopped


def _wait(
    running: Callable[[], bool], failed: Callable[[], bool], start: float, timeout_s: float, poll_s: float
) -> tuple[bool, bool]:
    """Poll until the group is no longer ``running``, a rank has ``failed`` or ``timeout_s`` has passed since
    ``start``: (timed out, stopped after a failure)."""
    while running():
        if failed():
            return False, True
        if time.perf_counter() - start > timeout_s:
            return True, False
        time.sleep(poll_s)
    return False, False


def _release(env: dict[str, str]) -> None:
    release_shared_memory(env["MASTER_PORT"])
    release_stale_locks(extensions_root(env))  # a JIT lock a killed rank held
