"""One probe, one process: start ``python -m probes.step.child DIR`` in its own process group, wait, collect.

The parent writes ``DIR/request.json``; the child appends one JSON line to ``DIR/events.jsonl`` as it
enters each phase (``{"phase": name, "t": seconds, "rss": bytes}``; also ``{"fingerprint": {...}}``) and
writes ``DIR/result.json`` (atomically) when it is done, failed or not, with the allocation records it
listed there in ``DIR/artifact.<name>`` (:mod:`probes.process.artifacts`); its stdout and stderr go to
``DIR/child.log``. On timeout (or when the parent is interrupted) the child's process tree is killed with
SIGKILL (:func:`probes.process.process_tree.kill_tree`: its group and the groups its helpers made), so no DeepSpeed
helper outlives the probe; the last phase event says where it stopped. ``DIR`` names its owner
(:mod:`probes.process.workdir`), and the child ends itself when the planner dies (:mod:`probes.process.parent_watch`;
the
planner's pid is ``MEMPLAN_PLANNER_PID`` in its environment).

The environment (:func:`child_env`) is set before the child starts, hence before it imports torch:
``DS_ACCELERATOR`` (cpu or cuda), ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` for a CUDA probe
of the expandable-segments allocator (unset for the default one), ``CUDA_VISIBLE_DEVICES=""`` for a CPU
probe, a one-rank process group: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, MASTER_ADDR and a free
MASTER_PORT, and a ``TORCH_CUDA_ARCH_LIST`` DeepSpeed's op builder can parse (:mod:`probes.process.arch_list`:
``9.0a`` becomes ``9.0``), and ``TORCH_EXTENSIONS_DIR``: the user's, else a folder of this environment
(:mod:`probes.process.op_cache`). The op-build child (:mod:`probes.ops.child`) runs the same way with the same
environment, so the probes load the ops it built instead of building them again. A probe of several ranks
starts PyTorch's elastic launcher instead, with this environment (:mod:`probes.process.rank_group`). A one-rank CPU
child is forked from a starter that has already imported torch, DeepSpeed and transformers
(:mod:`probes.process.preloaded`; ``MEMPLAN_PRELOAD=0`` starts it plainly): the same program, folder, environment
and process group, without paying those imports each time. Pure Python: no torch here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.process.arch_list import arch_list_env
from probes.process.artifacts import read_artifacts
from probes.process.jit_lock import extensions_root, release_stale_locks
from probes.process.op_cache import op_cache_env
from probes.process.parent_watch import PLANNER_PID_VARIABLE
from probes.process.preloaded import prepare as prepare_starter
from probes.process.preloaded import start_child
from probes.process.process_tree import kill_group, kill_tree, wait_group_gone
from probes.process.workdir import probe_folder
from store.artifacts import ProbeArtifact

__all__ = [
    "ChildRun",
    "PROJECT_ROOT",
    "child_env",
    "free_port",
    "kill_group",
    "read_events",
    "read_result",
    "release_shared_memory",
    "run_child",
    "tail",
    "wait_group_gone",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # probes/process/isolation.py -> the checkout
CHILD_MODULE = "probes.step.child"
REQUEST_FILE, EVENTS_FILE, RESULT_FILE, LOG_FILE = "request.json", "events.jsonl", "result.json", "child.log"
LOG_TAIL_CHARS = 4000
EXPANDABLE = "expandable_segments:True"


@dataclass
class ChildRun:
    """What the parent saw of one child: exit status, timeout, the child's events, report and log tail."""

    returncode: int | None
    timed_out: bool
    wall_s: float
    pid: int = 0  # the child's process id, which is also its process group's id
    events: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    log_tail: str = ""
    artifacts: tuple[ProbeArtifact, ...] = ()  # the records the child listed in its result

    @property
    def last_phase(self) -> str | None:
        phases = [e["phase"] for e in self.events if "phase" in e]
        return phases[-1] if phases else None

    @property
    def last_rss(self) -> int:
        values = [e["rss"] for e in self.events if isinstance(e.get("rss"), int)]
        return max(values, default=0)

    @property
    def fingerprint(self) -> dict[str, Any] | None:
        found = [e["fingerprint"] for e in self.events if "fingerprint" in e]
        return found[-1] if found else None


def free_port() -> int:
    """A TCP port free on this machine now (for the child's MASTER_PORT)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(device: str, allocator: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment (see the module docstring); ``base`` defaults to this process's."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "DS_ACCELERATOR": "cuda" if device == "cuda" else "cpu",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cuda":
        if allocator == "expandable-segments":
            env["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    paths = [str(PROJECT_ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env[PLANNER_PID_VARIABLE] = str(os.getpid())  # the children end with this process (probes.process.parent_watch)
    return op_cache_env(arch_list_env(env)[0], device)


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of an events file, one a line (a torn last line is skipped)."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            item = json.loads(line)
            if isinstance(item, dict):
                events.append(item)
    return events


def read_result(path: Path) -> dict[str, Any] | None:
    """A child's result object, or None while there is none."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def tail(path: Path) -> str:
    """The last LOG_TAIL_CHARS of a log."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL_CHARS))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


SHM_FOLDER = Path("/dev/shm")


def release_shared_memory(port: str) -> int:
    """Remove the shared-memory allreduce buffer DeepSpeed's CPU backend made for this process group.

    With LOCAL_SIZE equal to the world size, DeepSpeed's shm comm creates
    ``/dev/shm/deepspeed_allreduce_buffer_<...>_<addr>_<port>_<rank>`` (66 MB) and never unlinks it, so
    every CPU engine would leak that much RAM until reboot. Returns how many files were removed.
    """
    if not port or not SHM_FOLDER.is_dir():
        return 0
    removed = 0
    for path in SHM_FOLDER.glob(f"deepspeed_allreduce_buffer_*_{port}_*"):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def run_child(request: dict[str, Any], env: dict[str, str], timeout_s: float, module: str = CHILD_MODULE) -> ChildRun:
    """Run ``python -m module DIR`` on ``request`` (a ProbeRequest dict for the probe child) within
    ``timeout_s`` seconds of wall time."""
    with probe_folder() as folder:
        (folder / REQUEST_FILE).write_text(json.dumps(request), encoding="utf-8")
        prepare_starter(module, env)  # its imports are not the child's time
        start = time.perf_counter()
        timed_out = False
        with (folder / LOG_FILE).open("wb") as log:
            proc = start_child(module, [str(folder)], folder, env, log)  # its own process group: killed as a whole
            try:
                returncode: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_tree(proc.pid, [])
                returncode = proc.wait()
            except BaseException:  # interrupted (Ctrl-C, SIGTERM, SIGHUP: planner.cli.stopping): leave nothing behind
                kill_tree(proc.pid, [])
                proc.wait()
                raise
            finally:
                kill_group(proc.pid)  # helpers the child may have left behind
                wait_group_gone(proc.pid)
                release_shared_memory(env.get("MASTER_PORT", ""))
                release_stale_locks(extensions_root(env))  # a JIT lock the killed child held
        wall = time.perf_counter() - start
        result = None if timed_out else read_result(folder / RESULT_FILE)
        return ChildRun(
            returncode=returncode,
            timed_out=timed_out,
            wall_s=wall,
            pid=proc.pid,
            events=read_events(folder / EVENTS_FILE),
            result=result,
            log_tail=tail(folder / LOG_FILE),
            artifacts=read_artifacts(folder, result),
        )
