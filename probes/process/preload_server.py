"""The preloaded starter: ``python -m probes.process.preload_server [MODULE ...]`` imports the named modules once
(torch, DeepSpeed, transformers' model code: about 6 CPU seconds on a 2-core EPYC), then forks one child for each
request, so that a CPU probe starts without paying those imports again (:mod:`probes.process.preloaded` is the
parent's side).

One JSON object a line. Requests on stdin: ``{"module", "args", "cwd", "env", "log"}``. Replies on stdout:
``{"ready": true}`` once the modules are imported (or ``{"failed": "Type: message"}``, then exit 1); for each request,
in order, ``{"started": pid}`` (or ``{"refused": "Type: message"}`` when the fork failed); and when a child ends,
``{"ended": pid, "returncode": rc, "cpu_s": s}``. The return code reads as :class:`subprocess.Popen`'s does (``-N``:
ended by signal N); ``cpu_s`` is the child's own and its reaped children's user + system time (``os.wait4``).

The child is what ``python -m MODULE ARGS`` started in ``cwd`` with ``env`` would be: a session and process group
of its own (as ``start_new_session=True``), ``env`` as its whole environment, stdin from ``/dev/null``, stdout and
stderr appended to ``log``, and MODULE run as ``__main__`` (:func:`runpy.run_module`). What differs is only what
was imported before the environment was set: the parent keeps one server per environment
(:func:`probes.process.preloaded.server_key`), so the variables read at import time are the child's own.

This process stays single-threaded (a fork of a threaded process can copy a lock another thread holds) and runs no
torch operation (an OpenMP thread pool used before a fork hangs the child). It ends at the end of its stdin (its
parent closed it, or died: the end of a process, not of the thread that started it, which ``PR_SET_PDEATHSIG``
would be): children still running are told to end (SIGTERM: each ends what it started) and then killed. A child
whose starter is killed ends on its own (:mod:`probes.process.parent_watch`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import sys
import time
import traceback
from typing import Any, NoReturn

from probes.process.command_line import set_command_line
from probes.process.cpu_info import cache_cpu_info

__all__ = ["exit_code", "main"]

POLL_S = 0.1  # how often a running child is looked for while children run
END_GRACE_S = 10.0  # how long a child told to end (SIGTERM) may take to end what it started
REQUEST_FD, REPLY_FD = 0, 1


def exit_code(status: int) -> int:
    """A ``waitpid`` status as :class:`subprocess.Popen` reports it: the exit code, or ``-N`` for signal N."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else status


def _reply(data: dict[str, Any]) -> None:
    line = (json.dumps(data) + "\n").encode()
    while line:
        line = line[os.write(REPLY_FD, line) :]


def _describe(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__


def _system_exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _become_child(request: dict[str, Any]) -> NoReturn:
    """In the forked child: become ``python -m MODULE ARGS`` in its folder, with its environment; never returns."""
    code = 1
    try:
        os.setsid()
        set_command_line([sys.executable, "-m", request["module"], *request["args"]])  # ps shows the child it is
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in any Python process (the server ignores it)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        sys.argv = [request["module"], *request["args"]]
        sys.path[0] = request["cwd"]  # as ``python -m`` started in that folder
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _system_exit_code(exc)
    except BaseException:  # noqa: BLE001 - the child's failure is its log and its exit code, as with python -m
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _start(request: dict[str, Any]) -> int:
    pid = os.fork()
    if pid == 0:
        _become_child(request)
    return pid


def _reap(children: set[int], block: bool = False) -> None:
    """Reply ``ended`` for each child that has ended (all of them, when ``block``)."""
    while children:
        try:
            pid, status, usage = os.wait4(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        if pid in children:
            children.discard(pid)
            cpu_s = round(usage.ru_utime + usage.ru_stime, 3)
            with contextlib.suppress(OSError):
                _reply({"ended": pid, "returncode": exit_code(status), "cpu_s": cpu_s})


def serve() -> None:
    """Fork a child for each request line until the end of stdin, then kill and reap what still runs."""
    children: set[int] = set()
    pending = b""
    while True:
        readable, _, _ = select.select([REQUEST_FD], [], [], POLL_S if children else None)
        if readable:
            chunk = os.read(REQUEST_FD, 1 << 16)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                try:
                    pid = _start(json.loads(line))
                except Exception as exc:  # noqa: BLE001 - a request that cannot start is refused, the server goes on
                    _reply({"refused": _describe(exc)})
                    continue
                children.add(pid)
                _reply({"started": pid})
        _reap(children)
    _end(children)


def _end(children: set[int]) -> None:
    """End the children still running: SIGTERM first, so that each ends everything it started (its compilers
    in groups of their own too: :func:`probes.process.parent_watch.end_tree`), then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + END_GRACE_S
        while children and time.monotonic() < deadline:
            _reap(children)
            time.sleep(POLL_S)
    _reap(children, block=True)


def main(modules: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the planner's Ctrl-C is the planner's: this ends with its stdin
    try:
        for name in modules:
            importlib.import_module(name)
        cache_cpu_info()
        if "deepspeed" in modules:  # asked here once, so no child starts a process for it
            import cpuinfo  # type: ignore[import-untyped,unused-ignore]

            cpuinfo.get_cpu_info()
        # what the imports made is never garbage in a child: moved out of the collector's generations, a child's
        # gc.collect() (DeepSpeed's ZeRO-3 defragment and hybrid engine call it) and gc.get_objects() (the live-tensor
        # tracker's scan) walk only what the child made, not the ~460,000 objects of torch, DeepSpeed and
        # transformers (about 0.4 CPU s a collection, the pages copied on write besides); as Python's gc.freeze docs
        # advise before forking without exec. No tensor is among them (the tracker would no longer find it)
        gc.freeze()
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which then starts its children plainly
        _reply({"failed": _describe(exc)})
        return 1
    _reply({"ready": True})
    serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
