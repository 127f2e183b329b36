"""The planner's side of a script probe: run the user's own command under the hook, watch it, end it, decide.

:func:`run_script_probe` writes the settings (:class:`probes.script.settings.ScriptProbeSettings`) into a fresh
working folder (:func:`probes.process.workdir.probe_folder`, removed afterwards), and starts the command through
:mod:`probes.script.watch` (a process that ends with the planner) in a process group of its own, its stdout and
stderr in ``program.log``. The program's environment is the probes' own (:func:`probes.process.isolation.child_env`:
one rank, a free ``MASTER_PORT``, ``DS_ACCELERATOR``, ``CUDA_VISIBLE_DEVICES=""`` on the CPU, the allocator's
``PYTORCH_CUDA_ALLOC_CONF``, the ops cache, the planner's pid) with ``LOCAL_SIZE`` the plan's ranks,
``PYTHONPATH`` the hook folder and then the caller's own (not memplan's checkout: its package names would shadow
the program's modules), and ``MEMPLAN_SCRIPT_PROBE`` the settings file. A launcher in the command
(``torchrun``, ``deepspeed``, ``accelerate launch``) passes all of it to its ranks.

The parent polls the ranks' folders (``out/rank<r>/events.jsonl`` and ``result.json``) and ends the program's
whole tree (:func:`probes.process.process_tree.kill_tree`: its group, every process under it, every pid a rank
announced, with their groups) when it has exited, when it runs past ``timeout_s``, when a rank reported a
failure (after :data:`FAILURE_GRACE_S`, the others waiting for it in a collective), when every rank reported its
timed steps and the launcher has not exited within :data:`DONE_GRACE_S`, when the hook failed to install, and
on any exception of its own (Ctrl-C, the planner's SIGTERM and SIGHUP, which it re-raises).

The outcome (:data:`probes.script.outcome.OUTCOMES`, decided in :mod:`probes.script.outcome`), worst first where
ranks differ:

- ``oom`` / ``error``: a rank ran out of memory or failed in a phase or in ``deepspeed.initialize`` (the phase and
  the exception), the hook failed, the program exited non-zero before ``initialize`` (the exception is in the log
  tail), or exited after it before its timed steps;
- ``not_applied``: a setting of the strategy the hook cannot apply to this program (LoRA on a script that builds
  no adapters, the chunked loss, checkpointing on a model without it); the program was ended at ``initialize``,
  nothing was measured, and ``not_applied`` says why, one line per setting;
- ``timeout``: it ran past the limit after ``initialize``; the phase and step it was in are named;
- ``no_initialize``: it never called ``deepspeed.initialize``; ``reason`` says ``exited`` (it exited 0 by itself)
  or ``timeout`` (it ran past the limit);
- ``contradicts_plan``: every rank ran its timed steps, but not as planned: its own batch, accumulation, dtype or
  ranks differ from the plan's (``contradictions``, one line each); the measurements are kept, and are not the
  strategy's;
- ``ok``: every rank ran the warm-up and timed steps as planned and the program ended cleanly.

The result keeps the program's exit code and the last :data:`probes.process.isolation.LOG_TAIL_CHARS` characters of
its output. Pure Python: no torch here.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from probes.process.isolation import child_env, release_shared_memory, tail
from probes.process.jit_lock import extensions_root, release_stale_locks
from probes.process.process_tree import kill_tree, wait_group_gone
from probes.process.workdir import probe_folder
from probes.script.outcome import RankReport, ScriptProbeResult, decide, failed, finished, read_hook_errors, read_ranks
from probes.script.settings import (
    HOOK_FOLDER,
    PROJECT_ROOT,
    SETTINGS_FILE,
    SETTINGS_VARIABLE,
    ScriptProbeSettings,
)
from store.measurements import script_sha256

__all__ = ["program_fingerprint", "run_script_probe", "script_env"]

LOG_FILE = "program.log"
OUT_FOLDER = "out"
POLL_S = 0.2
FAILURE_GRACE_S = 5.0  # after a rank reported a failure: the others' time to report theirs
DONE_GRACE_S = 20.0  # after every rank reported its timed steps: the launcher's time to exit
VERSIONED = ("torch", "deepspeed", "transformers", "accelerate", "trl", "peft")
WATCH_CODE = (
    "import sys; sys.path.insert(0, {root!r}); from probes.script.watch import main; sys.exit(main(sys.argv[1:]))"
)


# --- the command -----------------------------------------------------------------------------------------------


def _module_file(name: str, cwd: Path) -> Path | None:
    """The file ``python -m name`` would run, found without importing anything (None: not found)."""
    search: list[str] = [str(cwd), *sys.path]
    spec = None
    for part in name.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: its __main__
        for folder in spec.submodule_search_locations:
            main = Path(folder) / "__main__.py"
            if main.is_file():
                return main
        return None
    return Path(spec.origin) if spec.origin and spec.origin not in ("built-in", "frozen") else None


def script_of(command: list[str], cwd: Path | None = None) -> Path | None:
    """The user's script in ``command``: the first argument ending in ``.py`` that is a file, else the module
    after ``-m`` (a launcher's own module, ``torch.distributed.run``, comes first only where no script follows)."""
    cwd = Path.cwd() if cwd is None else cwd
    for argument in command:
        if argument.endswith(".py"):
            path = Path(argument) if Path(argument).is_absolute() else cwd / argument
            if path.is_file():
                return path.resolve()
    for before, argument in zip(command, command[1:], strict=False):
        if before == "-m":
            return _module_file(argument, cwd)
    return None


def library_versions() -> dict[str, str]:
    """Installed versions of the training libraries in this environment ("" where one is missing)."""
    from probes.measure.fingerprint import versions

    found = versions()
    for name in VERSIONED:
        if name not in found:
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                found[name] = ""
    return found


def program_fingerprint(command: list[str], cwd: Path | None = None) -> dict[str, Any]:
    """What identifies the program a script probe runs: its command line, the script's path and sha256 (the
    first ``.py`` argument, else the module after ``-m``; "" where none is found) and the library versions of
    this environment (the program's own, as its ranks saw them, are in each rank's result)."""
    script = script_of(command, cwd)
    digest = ""
    if script is not None:
        try:
            digest = script_sha256(script)
        except OSError:
            digest = ""
    return {
        "command": list(command),
        "script": str(script) if script is not None else "",
        "script_sha256": digest,
        "versions": library_versions(),
    }


def script_env(
    settings: ScriptProbeSettings, settings_path: Path, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The program's environment (module docstring); ``base`` defaults to this process's."""
    base = dict(os.environ if base is None else base)
    env = child_env(settings.device, settings.allocator, base)
    env["LOCAL_SIZE"] = str(max(1, settings.world_size))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_FOLDER), base.get("PYTHONPATH", "")) if p)
    env[SETTINGS_VARIABLE] = str(settings_path)
    return env


# --- running it ------------------------------------------------------------------------------------------------


def _watch(
    proc: subprocess.Popen[bytes], folder: Path, start: float, timeout_s: float, poll_s: float
) -> tuple[bool, str]:
    """Poll the ranks' folders until the program exits or must be ended (module docstring): whether it ran past
    ``timeout_s``, and why else it was stopped (``hook``, ``failure``, ``finished``; empty: it exited)."""
    out = folder / OUT_FOLDER
    failed_at = finished_at = None
    while proc.poll() is None:
        now = time.perf_counter()
        ranks = read_ranks(out)
        if read_hook_errors(folder):
            return False, "hook"
        if now - start > timeout_s:
            return True, ""
        if failed(ranks):
            failed_at = failed_at if failed_at is not None else now
            if now - failed_at > FAILURE_GRACE_S:
                return False, "failure"
        if finished(ranks):
            finished_at = finished_at if finished_at is not None else now
            if now - finished_at > DONE_GRACE_S:
                return False, "finished"
        time.sleep(poll_s)
    return False, ""


def run_script_probe(
    command: list[str],
    settings: ScriptProbeSettings,
    timeout_s: float,
    *,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    poll_s: float = POLL_S,
) -> ScriptProbeResult:
    """Run the user's ``command`` under the hook for ``settings`` within ``timeout_s`` seconds of wall time
    (module docstring). ``cwd`` is where it runs (default: here); ``env`` its base environment (default: this
    process's). Ctrl-C or a stop signal turned into an exception ends the program's tree, then re-raises."""
    if not command:
        raise ValueError("run_script_probe needs a command")
    where = Path.cwd() if cwd is None else Path(cwd)
    program = program_fingerprint(command, where)
    with probe_folder() as folder:
        out = folder / OUT_FOLDER
        out.mkdir()
        settings = settings.with_output(out)
        settings_path = folder / SETTINGS_FILE
        settings.write(settings_path)
        program_env = script_env(settings, settings_path, env)
        watcher = [sys.executable, "-c", WATCH_CODE.format(root=str(PROJECT_ROOT)), *command]
        start = time.perf_counter()
        timed_out, stopped = False, ""
        ranks: list[RankReport] = []
        with (folder / LOG_FILE).open("wb") as log:
            proc = subprocess.Popen(
                watcher,
                cwd=where,
                env=program_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: ended as a whole
            )
            try:
                timed_out, stopped = _watch(proc, folder, start, timeout_s, poll_s)
            finally:  # whatever ended the wait (an interrupt too): leave nothing behind
                ranks = read_ranks(out)
                kill_tree(proc.pid, [pid for report in ranks for pid in report.pids])
                proc.wait()
                wait_group_gone(proc.pid)
                for port in {program_env["MASTER_PORT"], *(p for report in ranks for p in report.ports)}:
                    release_shared_memory(port)
                release_stale_locks(extensions_root(program_env))
        wall = time.perf_counter() - start
        ranks = read_ranks(out)
        return decide(
            ranks,
            settings=settings,
            timed_out=timed_out,
            stopped=stopped,
            exit_code=proc.returncode,
            exited=not (stopped or timed_out),
            hook_errors=read_hook_errors(folder),
            timeout_s=timeout_s,
            wall_s=wall,
            log_tail=tail(folder / LOG_FILE),
            program=program,
            pid=proc.pid,
        )


# --- the outcome ------------------------------------------------------------------------------------------------
