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

The outcome (:data:`OUTCOMES`), worst first where ranks differ:

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
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from probes.process.isolation import child_env, read_events, read_result, release_shared_memory, tail
from probes.process.jit_lock import extensions_root, release_stale_locks
from probes.process.process_tree import kill_tree, wait_group_gone
from probes.process.workdir import probe_folder
from probes.process.worst_rank import worst_phases
from probes.script.settings import (
    EVENTS_FILE,
    HOOK_ERRORS_FILE,
    HOOK_FOLDER,
    PROJECT_ROOT,
    RESULT_FILE,
    SETTINGS_FILE,
    SETTINGS_VARIABLE,
    ScriptProbeSettings,
)
from store.measurements import PhaseMeasurement, ProbeResult, script_sha256

__all__ = [
    "OUTCOMES",
    "RankReport",
    "ScriptProbeResult",
    "decide",
    "program_fingerprint",
    "run_script_probe",
    "script_env",
]

OUTCOMES = ("ok", "contradicts_plan", "not_applied", "oom", "error", "timeout", "no_initialize")
NO_INITIALIZE_REASONS = ("exited", "timeout")
LOG_FILE = "program.log"
OUT_FOLDER = "out"
POLL_S = 0.2
FAILURE_GRACE_S = 5.0  # after a rank reported a failure: the others' time to report theirs
DONE_GRACE_S = 20.0  # after every rank reported its timed steps: the launcher's time to exit
FAILURES = ("oom", "error")  # which failing rank names the outcome, in this order
VERSIONED = ("torch", "deepspeed", "transformers", "accelerate", "trl", "peft")
WATCH_CODE = (
    "import sys; sys.path.insert(0, {root!r}); from probes.script.watch import main; sys.exit(main(sys.argv[1:]))"
)


@dataclass(frozen=True)
class RankReport:
    """What one rank left in its folder: its events and its result (None: it wrote none)."""

    rank: int
    events: tuple[dict[str, Any], ...] = ()
    result: dict[str, Any] | None = None

    @property
    def initialized(self) -> bool:
        return any("initialize" in event for event in self.events)

    @property
    def last_phase(self) -> str | None:
        phases = [event["phase"] for event in self.events if "phase" in event]
        return phases[-1] if phases else None

    @property
    def steps(self) -> int:
        return max((event["step"] for event in self.events if isinstance(event.get("step"), int)), default=0)

    @property
    def world_size(self) -> int:
        return max((e["world_size"] for e in self.events if isinstance(e.get("world_size"), int)), default=1)

    @property
    def pids(self) -> list[int]:
        return [event["pid"] for event in self.events if isinstance(event.get("pid"), int)]

    @property
    def ports(self) -> list[str]:
        return [str(event["master_port"]) for event in self.events if event.get("master_port")]

    @property
    def rss(self) -> int:
        return max((event["rss"] for event in self.events if isinstance(event.get("rss"), int)), default=0)


@dataclass(frozen=True)
class ScriptProbeResult:
    """One script probe (module docstring). ``phases`` are the worst rank's per phase; ``ranks`` every rank's
    own result (or, for a rank without one, its last phase and steps); ``ran_with`` what the engine ran with
    (the lowest rank that reported), ``program`` the command's fingerprint (:func:`program_fingerprint`)."""

    outcome: str
    reason: str = ""  # no_initialize: "exited" or "timeout"
    message: str = ""
    failed_phase: str | None = None
    failed_rank: int | None = None
    phases: tuple[PhaseMeasurement, ...] = ()
    ran_with: dict[str, Any] = field(default_factory=dict)
    contradictions: tuple[str, ...] = ()
    not_applied: tuple[str, ...] = ()
    step_time_s: dict[str, Any] = field(default_factory=dict)
    phase_time_s: dict[str, Any] = field(default_factory=dict)
    host_rss_peak_bytes: int = 0
    worst_rank: int | None = None
    world_size: int = 0  # ranks that reported themselves
    initialized: bool = False
    steps_done: int = 0  # optimizer steps of the rank that did fewest (of the ranks that initialized)
    exit_code: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    log_tail: str = ""
    pid: int = 0  # the watch process that ran the command: also the program's process group, gone by now
    ranks: tuple[dict[str, Any], ...] = ()
    program: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {self.outcome!r}")

    @property
    def peak_allocated_bytes(self) -> int:
        return max((p.peak_allocated_bytes for p in self.phases), default=0)

    @property
    def peak_reserved_bytes(self) -> int:
        return max((p.peak_reserved_bytes for p in self.phases), default=0)

    def phase(self, name: str) -> PhaseMeasurement | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def read_ranks(out: Path) -> list[RankReport]:
    """Every rank folder under ``out``, by rank."""
    reports = []
    for folder in sorted(out.glob("rank*")):
        suffix = folder.name[len("rank") :]
        if not suffix.isdigit():
            continue
        reports.append(
            RankReport(
                rank=int(suffix),
                events=tuple(read_events(folder / EVENTS_FILE)),
                result=read_result(folder / RESULT_FILE),
            )
        )
    return sorted(reports, key=lambda report: report.rank)


def read_hook_errors(folder: Path) -> list[str]:
    """The hook's own failures before it could report per rank (one line each)."""
    return [
        f"pid {e.get('pid')}: {e.get('what')}: {_last_line(str(e.get('error', '')))}"
        for e in read_events(folder / HOOK_ERRORS_FILE)
    ]


def _finished(ranks: list[RankReport]) -> bool:
    """Every rank of the program has written a result (ok, or a setting it cannot apply)."""
    if not ranks:
        return False
    world = max(report.world_size for report in ranks)
    done = [r for r in ranks if r.result is not None and r.result.get("outcome") in ("ok", "not_applied")]
    return len(done) >= world


def _failed(ranks: list[RankReport]) -> bool:
    return any(r.result is not None and r.result.get("outcome") in FAILURES for r in ranks)


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
        timed_out = False
        stopped = ""
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
                failed_at = finished_at = None
                while proc.poll() is None:
                    now = time.perf_counter()
                    ranks = read_ranks(out)
                    if read_hook_errors(folder):
                        stopped = "hook"
                        break
                    if now - start > timeout_s:
                        timed_out = True
                        break
                    if _failed(ranks):
                        failed_at = failed_at if failed_at is not None else now
                        if now - failed_at > FAILURE_GRACE_S:
                            stopped = "failure"
                            break
                    if _finished(ranks):
                        finished_at = finished_at if finished_at is not None else now
                        if now - finished_at > DONE_GRACE_S:
                            stopped = "finished"
                            break
                    time.sleep(poll_s)
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


def _rank_view(report: RankReport) -> dict[str, Any]:
    if report.result is not None:
        return {"rank": report.rank, **report.result}
    return {
        "rank": report.rank,
        "outcome": None,
        "initialized": report.initialized,
        "last_phase": report.last_phase,
        "steps_done": report.steps,
        "pids": report.pids,
    }


def _phases(result: dict[str, Any]) -> tuple[PhaseMeasurement, ...]:
    return tuple(PhaseMeasurement.from_dict(p) for p in result.get("phases") or ())


def decide(
    ranks: list[RankReport],
    *,
    settings: ScriptProbeSettings,
    timed_out: bool,
    exit_code: int | None,
    exited: bool,
    timeout_s: float,
    wall_s: float = 0.0,
    stopped: str = "",
    hook_errors: list[str] | None = None,
    log_tail: str = "",
    program: dict[str, Any] | None = None,
    pid: int = 0,
) -> ScriptProbeResult:
    """The probe's result from what the ranks left (module docstring). ``exited``: the program ended by itself
    (not killed: ``timed_out`` or ``stopped`` say why it was); ``exit_code`` is its exit status."""
    views = tuple(_rank_view(report) for report in ranks)
    initialized = any(report.initialized for report in ranks)
    stepped = [report.steps for report in ranks if report.initialized]
    rss = max([int(r.result.get("host_rss_peak_bytes", 0)) for r in ranks if r.result] + [r.rss for r in ranks] + [0])
    first = next((r.result for r in ranks if r.result and r.result.get("ran_with")), None)
    common: dict[str, Any] = {
        "ranks": views,
        "world_size": len(ranks),
        "initialized": initialized,
        "steps_done": min(stepped, default=0),
        "exit_code": exit_code,
        "timed_out": timed_out,
        "wall_s": wall_s,
        "log_tail": log_tail,
        "pid": pid,
        "program": program or {},
        "settings": settings.to_dict(),
        "host_rss_peak_bytes": rss,
        "ran_with": dict(first.get("ran_with") or {}) if first else {},
    }
    failed = [r for r in ranks if r.result is not None and r.result.get("outcome") in FAILURES]
    if failed:
        worst = min(failed, key=lambda r: (FAILURES.index(r.result["outcome"]), r.rank))  # type: ignore[index]
        result = worst.result or {}
        prefix = f"rank {worst.rank}: " if len(ranks) > 1 else ""
        return ScriptProbeResult(
            outcome=result["outcome"],
            message=prefix + str(result.get("message", "")),
            failed_phase=result.get("failed_phase"),
            failed_rank=worst.rank,
            phases=_phases(result),
            **common,
        )
    if hook_errors:
        return ScriptProbeResult(
            outcome="error", message="memplan's hook failed: " + "; ".join(hook_errors[:2]), **common
        )
    refused = [r for r in ranks if r.result is not None and r.result.get("outcome") == "not_applied"]
    if refused:
        lines = tuple(refused[0].result.get("not_applied") or ())  # type: ignore[union-attr]
        return ScriptProbeResult(
            outcome="not_applied",
            message="not probed: " + "; ".join(lines),
            not_applied=lines,
            failed_rank=refused[0].rank,
            **common,
        )
    done = [r for r in ranks if r.result is not None and r.result.get("outcome") == "ok"]
    if done and _finished(ranks) and (stopped == "finished" or not exited or exit_code == 0):
        return _measured(done, ranks, settings, common)
    if not initialized:
        # a rank folder is made where deepspeed is imported under the hook: none means the hook never saw it
        unseen = "" if ranks else " (no process of it imported deepspeed under the hook)"
        if timed_out:
            return ScriptProbeResult(
                outcome="no_initialize",
                reason="timeout",
                message=f"ran past the limit of {timeout_s:g} s without calling deepspeed.initialize{unseen}; "
                f"the program was ended{_running(log_tail)}",
                **common,
            )
        if exit_code == 0:
            return ScriptProbeResult(
                outcome="no_initialize",
                reason="exited",
                message=f"the program exited (code 0) without calling deepspeed.initialize{unseen}",
                **common,
            )
        return ScriptProbeResult(
            outcome="error",
            message=f"the program exited with code {exit_code} before calling deepspeed.initialize: "
            f"{_last_line(log_tail)}",
            **common,
        )
    missing = [r for r in ranks if r.result is None]
    lagging = missing[0] if missing else ranks[0]
    where = f"in phase {lagging.last_phase or 'setup'}, after {lagging.steps} of {settings.steps} steps"
    rank = f" (rank {lagging.rank})" if len(ranks) > 1 else ""
    if timed_out:
        return ScriptProbeResult(
            outcome="timeout",
            message=f"timed out after {timeout_s:g} s {where}{rank}; the program was ended{_running(log_tail)}",
            failed_phase=lagging.last_phase,
            failed_rank=lagging.rank,
            **common,
        )
    if done and exit_code not in (0, None):
        message = f"every rank finished its timed steps, but the program exited with code {exit_code}"
    elif exit_code == 0:
        message = (
            f"the program ended by itself {where}{rank}: it runs fewer optimizer steps than the probe needs "
            f"({settings.warmup_steps} warm-up + {settings.timed_steps} timed)"
        )
    else:
        message = f"the program exited with code {exit_code} {where}{rank}: {_last_line(log_tail)}"
    return ScriptProbeResult(
        outcome="error", message=message, failed_phase=lagging.last_phase, failed_rank=lagging.rank, **common
    )


def _measured(
    done: list[RankReport], ranks: list[RankReport], settings: ScriptProbeSettings, common: dict[str, Any]
) -> ScriptProbeResult:
    """``ok`` or ``contradicts_plan``: every rank ran its timed steps; the figures are the worst rank's."""
    results = [ProbeResult(outcome="ok", phases=_phases(r.result or {})) for r in done]
    phases, _ = worst_phases(results) if results[0].phases else ((), {})
    worst = max(range(len(done)), key=lambda i: (results[i].peak_allocated_bytes, -done[i].rank))
    worst_result = done[worst].result or {}
    lines: list[str] = []
    for report in done:
        for line in (report.result or {}).get("contradictions") or ():
            text = f"rank {report.rank}: {line}" if len(ranks) > 1 else line
            if line not in [existing.split(": ", 1)[-1] for existing in lines]:
                lines.append(text)
    outcome = "contradicts_plan" if lines else "ok"
    message = "the program does not run the plan: " + "; ".join(lines) if lines else ""
    return ScriptProbeResult(
        outcome=outcome,
        message=message,
        phases=phases,
        contradictions=tuple(lines),
        step_time_s=dict(worst_result.get("step_time_s") or {}),
        phase_time_s=dict(worst_result.get("phase_time_s") or {}),
        worst_rank=done[worst].rank,
        **common,
    )


def _running(log_tail: str) -> str:
    """What the program was doing when its time ran out: its log's last line (a JIT op build prints torch's
    ``Building extension module ...``), or nothing when it printed none."""
    line = _last_line(log_tail) if log_tail.strip() else ""
    return f"; it was running: {line[:200]}" if line else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
