"""CPU probe children forked from a process that has already imported torch, DeepSpeed and transformers.

Each probe child is a fresh Python process (:mod:`probes.process.isolation`), and on the CPU most of a small probe
is its imports: torch, DeepSpeed and transformers' model code cost about 6 CPU seconds on a 2-core EPYC, where
the probe of a tiny model then runs in a few. :func:`start_child` hands a CPU child to a preloaded starter
(:mod:`probes.process.preload_server`), which imported those once and forks the child from there: the same
``python -m MODULE ARGS`` in the same folder, environment, session and log, without the imports. A CUDA child is
always started plainly (a process that has touched CUDA cannot fork a CUDA user; this one never does, but the
rule is kept simple), as is any child when ``MEMPLAN_PRELOAD=0`` or the starter could not start. The ranks of a CPU
group are forked so too, each with the variables ``torch.distributed.run`` would give it
(:mod:`probes.process.rank_group`).

One starter serves one environment (:func:`server_key`: all but the per-probe port and the rank variables), so what
a library reads from the environment at import time is what the child was given; at most ``MAX_SERVERS`` are kept,
and one is closed to make room only when no child of it runs (else the new child starts plainly: issue 47, a CI run
whose accuracy probe was killed so, by another thread's eviction). The starter reaps its children and reports each
one's CPU seconds, which :func:`reaped_cpu_s` adds up while the starter runs (a forked child is the starter's, not
this process's, so ``getrusage(RUSAGE_CHILDREN)`` here counts it only once the starter ends and is reaped; from then
on it is counted there, and no longer in :func:`reaped_cpu_s`, so that no child's CPU seconds count twice).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = [
    "PRELOADED_MODULES",
    "PRELOAD_VARIABLE",
    "ForkedChild",
    "StartedChild",
    "close_all",
    "preload_enabled",
    "prepare",
    "reaped_cpu_s",
    "server_key",
    "start_child",
]

PRELOAD_VARIABLE = "MEMPLAN_PRELOAD"  # "0": start every child plainly
# what a probe child imports before its first step (a cProfile of a tiny Llama probe: 84% of its time), the
# model classes of the catalog's most common families included; none reads the environment as it is imported
# beyond what the starter's own environment (the child's) holds
PRELOADED_MODULES = (
    "torch",
    "torch._dynamo",
    "torch.distributed.tensor",
    "torch.utils.cpp_extension",
    "deepspeed",
    "deepspeed.ops.op_builder",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.llama.modeling_llama",
    "transformers.models.opt.modeling_opt",
    # DeepSpeed 0.19.8 imports this in every ZeRO engine's set-up (runtime/zero/utils.py is_zero_supported_optimizer,
    # from engine.py's optimizer check), and its import wraps Muon's update functions in torch.compile, which loads
    # torch's compiler stack: 1.4-1.9 CPU s a ZeRO child on the 2-core EPYC, once here instead (41 MiB resident)
    "deepspeed.runtime.zero.muon.muon_optimizer",
)
PRELOADABLE_CHILDREN = frozenset({"probes.step.child", "probes.ops.child"})
# what each child sets on its own, read when its process group forms (after the fork): its port and its place in
# a group of ranks (the variables torch.distributed.run sets for each rank; LOCAL_SIZE as DeepSpeed's launcher)
PER_CHILD_VARIABLES = frozenset(
    {
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "LOCAL_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "PYTEST_CURRENT_TEST",  # pytest names the running test and its phase here; no library reads it
    }
)
# one starter per setting a CPU tune alternates between: one rank or a group (OMP_NUM_THREADS=1, as torchrun sets
# for several), each with or without what the probe's own environment adds; about 370 MB resident each (torch,
# DeepSpeed and transformers imported, measured on the 2-core EPYC), so four hold 1.5 GB
MAX_SERVERS = 4
READY_TIMEOUT_S = 600.0  # the imports of a cold, busy machine; a starter not ready by then is not used
SERVER_MODULE = "probes.process.preload_server"


class StartedChild(Protocol):
    """What :func:`start_child` returns: a :class:`subprocess.Popen` or a :class:`ForkedChild`."""

    pid: int

    def wait(self, timeout: float | None = None) -> int: ...

    def poll(self) -> int | None: ...


class _Server:
    """One preloaded starter and the replies it has sent."""

    def __init__(self, env: Mapping[str, str], modules: Sequence[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, *modules],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the terminal's Ctrl-C is the planner's; this ends when its stdin closes
        )
        self.requests: IO[bytes] = self.process.stdin  # type: ignore[assignment]
        self.replies: IO[bytes] = self.process.stdout  # type: ignore[assignment]
        self.changed = threading.Condition()
        self.started: list[dict[str, Any]] = []
        self.ended: dict[int, tuple[int, float]] = {}
        self.alive = True
        self.send_lock = threading.Lock()
        self.children: set[int] = set()  # forked and not yet reported ended
        self.reported_cpu_s = 0.0  # the CPU seconds of its ended children, added to :func:`reaped_cpu_s`
        self.claims = 0  # callers that chose this starter and have not yet sent their request (under ``_lock``)
        self.ready = self._wait_ready()
        if self.ready:
            threading.Thread(target=self._read, name="memplan-preload-replies", daemon=True).start()
        else:
            self.close()

    def _wait_ready(self) -> bool:
        answer: list[bytes] = []
        reader = threading.Thread(target=lambda: answer.append(self.replies.readline()), daemon=True)
        reader.start()
        reader.join(READY_TIMEOUT_S)
        if not answer:
            return False
        with contextlib.suppress(json.JSONDecodeError):
            return bool(json.loads(answer[0]).get("ready"))
        return False

    def _read(self) -> None:
        for line in self.replies:
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self.changed:
                if "ended" in reply:
                    self.ended[int(reply["ended"])] = (int(reply["returncode"]), float(reply.get("cpu_s", 0.0)))
                    self.children.discard(int(reply["ended"]))
                    self.reported_cpu_s += float(reply.get("cpu_s", 0.0))
                    _add_cpu(float(reply.get("cpu_s", 0.0)))
                else:
                    self.started.append(reply)
                self.changed.notify_all()
        with self.changed:
            self.alive = False
            self.changed.notify_all()

    def start(self, request: dict[str, Any]) -> int | None:
        """Send one request; the child's pid, or None when the starter refused it or is gone."""
        with self.send_lock:
            try:
                self.requests.write((json.dumps(request) + "\n").encode())
                self.requests.flush()
            except (OSError, ValueError):
                return None
            with self.changed:
                self.changed.wait_for(lambda: self.started or not self.alive)
                if not self.started:
                    return None
                reply = self.started.pop(0)
                if "started" not in reply:
                    return None
                pid = int(reply["started"])
                if pid not in self.ended:
                    self.children.add(pid)
        return pid

    def busy(self) -> bool:
        """Whether a child of this starter still runs or a caller is about to start one: closing it would end them."""
        with self.changed:
            return self.alive and (self.claims > 0 or bool(self.children))

    def wait(self, pid: int, timeout: float | None) -> int:
        with self.changed:
            if not self.changed.wait_for(lambda: pid in self.ended or not self.alive, timeout):
                raise subprocess.TimeoutExpired(f"preloaded child {pid}", timeout or 0.0)
            if pid in self.ended:
                return self.ended[pid][0]
        return -9  # the starter died: its children got SIGKILL from their parent-death signal or their watch

    def poll(self, pid: int) -> int | None:
        with self.changed:
            if pid in self.ended:
                return self.ended[pid][0]
            return None if self.alive else -9

    def close(self) -> None:
        """End the starter (it kills what still runs) and reap it, so its CPU seconds reach this process: its
        children's with them, which :func:`reaped_cpu_s` then stops counting."""
        with contextlib.suppress(OSError, ValueError):
            self.requests.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with self.changed:  # the reader has seen every reply once the starter's stdout closed
            if self.ready:
                self.changed.wait_for(lambda: not self.alive, 5.0)
            _add_cpu(-self.reported_cpu_s)
            self.reported_cpu_s = 0.0


class ForkedChild:
    """A child the preloaded starter forked: its pid (also its process group) and :meth:`wait`, as Popen's."""

    def __init__(self, server: _Server, pid: int) -> None:
        self.server = server
        self.pid = pid

    def wait(self, timeout: float | None = None) -> int:
        """The child's return code (``-N``: ended by signal N); :class:`subprocess.TimeoutExpired` after
        ``timeout`` seconds."""
        return self.server.wait(self.pid, timeout)

    def poll(self) -> int | None:
        """The child's return code once it has ended, else None (as Popen's)."""
        return self.server.poll(self.pid)


_servers: OrderedDict[tuple[tuple[str, str], ...], _Server] = OrderedDict()
_refused: set[tuple[tuple[str, str], ...]] = set()
_lock = threading.Lock()
_cpu = [0.0]


def _add_cpu(seconds: float) -> None:
    _cpu[0] += seconds


def reaped_cpu_s() -> float:
    """CPU seconds of every preloaded child that has ended so far in this process and whose starter still runs
    (those of a starter that ended are in ``getrusage(RUSAGE_CHILDREN)``)."""
    return _cpu[0]


def server_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The environment a starter is started with: the child's, less what each child sets on its own."""
    return tuple(sorted((k, v) for k, v in env.items() if k not in PER_CHILD_VARIABLES))


def preload_enabled(module: str, env: Mapping[str, str]) -> bool:
    """Whether a child of ``module`` in ``env`` is forked from a starter: a probe or op-build child on the CPU (one
    rank, or each rank of a group: :mod:`probes.process.rank_group`), on Linux, unless ``MEMPLAN_PRELOAD=0``."""
    return (
        sys.platform.startswith("linux")
        and module in PRELOADABLE_CHILDREN
        and env.get("DS_ACCELERATOR") == "cpu"
        and env.get(PRELOAD_VARIABLE, os.environ.get(PRELOAD_VARIABLE, "1")) != "0"
    )


def _server_for(env: Mapping[str, str], modules: Sequence[str]) -> _Server | None:
    key = server_key(env)
    with _lock:
        if key in _refused:
            return None
        server = _servers.get(key)
        if server is not None and server.alive:
            _servers.move_to_end(key)
            server.claims += 1
            return server
        if server is not None:  # a starter that died: reaped, so that it is no zombie and its CPU is counted
            _servers.pop(key).close()
        while len(_servers) >= MAX_SERVERS:
            # the least recently used starter with nothing running goes; when every one has a child running (the
            # probes of other threads), this child starts plainly rather than end theirs
            idle = next((old_key for old_key, old in _servers.items() if not old.busy()), None)
            if idle is None:
                return None
            _servers.pop(idle).close()
        server = _Server(dict(key), modules)
        if not server.ready:
            _refused.add(key)
            return None
        _servers[key] = server
        server.claims += 1
        return server


def _release(server: _Server) -> None:
    with _lock:
        server.claims -= 1


def prepare(module: str, env: Mapping[str, str], modules: Sequence[str] = PRELOADED_MODULES) -> None:
    """Start (and wait for) the starter a child of ``module`` in ``env`` will be forked from, where there is one:
    its imports are then not part of the child's time."""
    if preload_enabled(module, env):
        server = _server_for(env, modules)
        if server is not None:
            _release(server)


def start_child(
    module: str,
    args: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    log: IO[bytes],
    modules: Sequence[str] = PRELOADED_MODULES,
) -> StartedChild:
    """Start ``python -m module args`` in ``cwd`` with ``env``, stdout and stderr to ``log``, in a session of its
    own: forked from a preloaded starter where :func:`preload_enabled`, else with :class:`subprocess.Popen`."""
    if preload_enabled(module, env):
        server = _server_for(env, modules)
        if server is not None:
            request = {"module": module, "args": list(args), "cwd": str(cwd), "env": dict(env), "log": log.name}
            try:
                pid = server.start(request)
            finally:
                _release(server)
            if pid is not None:
                return ForkedChild(server, pid)
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: killed as a whole
    )


def close_all() -> None:
    """End every starter of this process (at exit; the test session's end)."""
    with _lock:
        while _servers:
            _, server = _servers.popitem()
            server.close()


atexit.register(close_all)
