"""What a script probe's ranks left, and the outcome decided from it (:data:`OUTCOMES`, worst first where ranks
differ: see :mod:`probes.script.launch`, which runs the program and calls :func:`decide`). Pure Python.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from probes.process.isolation import read_events, read_result
from probes.process.worst_rank import worst_phases
from probes.script.settings import (
    EVENTS_FILE,
    HOOK_ERRORS_FILE,
    RESULT_FILE,
    ScriptProbeSettings,
)
from store.measurements import PhaseMeasurement, ProbeResult

OUTCOMES = ("ok", "contradicts_plan", "not_applied", "oom", "error", "timeout", "no_initialize")


NO_INITIALIZE_REASONS = ("exited", "timeout")


FAILURES = ("oom", "error")  # which failing rank names the outcome, in this order


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


def finished(ranks: list[RankReport]) -> bool:
    """Every rank of the program has written a result (ok, or a setting it cannot apply)."""
    if not ranks:
        return False
    world = max(report.world_size for report in ranks)
    done = [r for r in ranks if r.result is not None and r.result.get("outcome") in ("ok", "not_applied")]
    return len(done) >= world


def failed(ranks: list[RankReport]) -> bool:
    return any(r.result is not None and r.result.get("outcome") in FAILURES for r in ranks)


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
    common = _common(
        ranks, settings, timed_out=timed_out, exit_code=exit_code, wall_s=wall_s, log_tail=log_tail,
        program=program, pid=pid,
    )  # fmt: skip
    initialized = bool(common["initialized"])
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
    if done and finished(ranks) and (stopped == "finished" or not exited or exit_code == 0):
        return _measured(done, ranks, settings, common)
    if not initialized:
        return _not_initialized(ranks, timed_out, exit_code, timeout_s, log_tail, common)
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


def _common(
    ranks: list[RankReport],
    settings: ScriptProbeSettings,
    *,
    timed_out: bool,
    exit_code: int | None,
    wall_s: float,
    log_tail: str,
    program: dict[str, Any] | None,
    pid: int,
) -> dict[str, Any]:
    """The fields of a result whatever its outcome: every rank's view, counts, the run, the settings."""
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
    return common


def _not_initialized(
    ranks: list[RankReport],
    timed_out: bool,
    exit_code: int | None,
    timeout_s: float,
    log_tail: str,
    common: dict[str, Any],
) -> ScriptProbeResult:
    """``no_initialize`` (ran past the limit, or exited 0) or ``error`` (exited non-zero) before ``initialize``."""
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
        message=f"the program exited with code {exit_code} before calling deepspeed.initialize: {_last_line(log_tail)}",
        **common,
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
