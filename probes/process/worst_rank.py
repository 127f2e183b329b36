"""A rank group's reports as one ProbeResult: the probe's figure is its worst rank.

Every rank of a group (:mod:`probes.process.rank_group`) measures its own phases. The group's result:

- ``ok`` when every rank reported ``ok``: each phase's peak allocated, peak reserved, time, inactive split
  bytes, retries and OOM count are the largest over the ranks (the ranks may differ per phase); the host
  RSS peak is the largest rank's. ``extra`` is the extra of the worst rank (largest step peak allocated;
  the lowest such rank), whose allocation records the result carries, plus ``world_size``, ``worst_rank``,
  ``worst_rank_by_phase`` (phase -> rank) and ``ranks``: every rank's own result (its ``to_dict`` without
  the fingerprint, with ``rank``), or for a rank that did not report, its last phase.
- a failure of any rank: that rank's outcome, phase and message (``rank r: ...``); an ``oom`` ranks before
  an ``error``, then the lowest rank. The ranks still running were stopped (their last phase is kept).
- ``timeout``: the group ran past the timeout and was killed; the phase is that of the lowest rank that did
  not finish.
- no report at all: ``error``, with the launcher's exit code and the log's tail.

Pure Python: no torch.
"""

from __future__ import annotations

from typing import Any

from probes.process.isolation import ChildRun
from store.measurements import DeviceFingerprint, PhaseMeasurement, ProbeRequest, ProbeResult

__all__ = ["group_result", "worst_phases"]

FAILURE_ORDER = ("oom", "error", "timeout")  # which failing rank names the group's outcome


def worst_phases(results: list[ProbeResult]) -> tuple[tuple[PhaseMeasurement, ...], dict[str, int]]:
    """Per phase (in the first result's order) the largest figures over ``results``, and which rank had the
    largest peak allocated in it."""
    phases: list[PhaseMeasurement] = []
    by_phase: dict[str, int] = {}
    for first in results[0].phases:
        same = [(rank, p) for rank, r in enumerate(results) for p in r.phases if p.name == first.name]
        worst_rank, _ = max(same, key=lambda item: (item[1].peak_allocated_bytes, -item[0]))
        by_phase[first.name] = worst_rank
        phases.append(
            PhaseMeasurement(
                name=first.name,
                peak_allocated_bytes=max(p.peak_allocated_bytes for _, p in same),
                peak_reserved_bytes=max(p.peak_reserved_bytes for _, p in same),
                time_s=max(p.time_s for _, p in same),
                inactive_split_bytes=max(p.inactive_split_bytes for _, p in same),
                alloc_retries=max(p.alloc_retries for _, p in same),
                num_ooms=max(p.num_ooms for _, p in same),
            )
        )
    return tuple(phases), by_phase


def _rank_dict(rank: int, run: ChildRun, result: ProbeResult | None) -> dict[str, Any]:
    if result is None:
        return {"rank": rank, "outcome": None, "last_phase": run.last_phase, "pid": run.pid}
    data = {"rank": rank, **result.to_dict()}
    data.pop("fingerprint", None)
    return data


def group_result(
    runs: list[ChildRun],
    request: ProbeRequest,
    *,
    layers: int,
    wall_s: float,
    timed_out: bool,
    returncode: int | None,
    log_tail: str,
    fallback: DeviceFingerprint,
) -> ProbeResult:
    """One ProbeResult of the ranks' reports (see the module docstring)."""
    results = [ProbeResult.from_dict(run.result) if run.result is not None else None for run in runs]
    ranks = [_rank_dict(rank, run, result) for rank, (run, result) in enumerate(zip(runs, results, strict=True))]
    fingerprint = next((r.fingerprint for r in results if r is not None and r.fingerprint), None)
    fingerprint = fingerprint or next(
        (DeviceFingerprint.from_dict(run.fingerprint) for run in runs if run.fingerprint), fallback
    )
    common = {"world_size": len(runs), "ranks": ranks}
    rss = max([r.host_rss_peak_bytes for r in results if r is not None] + [run.last_rss for run in runs])
    failed = [(rank, r) for rank, r in enumerate(results) if r is not None and r.outcome != "ok"]
    if failed:
        rank, worst = min(failed, key=lambda item: (_order(item[1].outcome), item[0]))
        return ProbeResult(
            outcome=worst.outcome,
            phases=worst.phases,
            failed_phase=worst.failed_phase,
            message=f"rank {rank}: {worst.message}",
            host_rss_peak_bytes=rss,
            wall_s=wall_s,
            fingerprint=fingerprint,
            layers=worst.layers if worst.layers is not None else layers,
            extra={**worst.extra, **common, "failed_rank": rank, "log_tail": log_tail},
            artifacts=runs[rank].artifacts,
        )
    missing = [rank for rank, r in enumerate(results) if r is None]
    if missing:
        rank = missing[0]
        phase = runs[rank].last_phase
        if timed_out:
            how = f"timed out after {request.timeout_s:g} s in phase {phase or 'startup'} (rank {rank})"
            outcome, message = "timeout", how + "; rank group killed"
        else:
            outcome = "error"
            message = (
                f"rank {rank} of {len(runs)} ended without a report (in phase {phase or 'startup'}); "
                f"the launcher exited with code {returncode}"
            )
        return ProbeResult(
            outcome=outcome,
            failed_phase=phase,
            message=message,
            host_rss_peak_bytes=rss,
            wall_s=wall_s,
            fingerprint=fingerprint,
            layers=layers,
            extra={**common, "failed_rank": rank, "exit_code": returncode, "log_tail": log_tail},
        )
    done = [r for r in results if r is not None]
    phases, by_phase = worst_phases(done)
    worst = max(range(len(done)), key=lambda rank: (done[rank].peak_allocated_bytes, -rank))
    return ProbeResult(
        outcome="ok",
        phases=phases,
        host_rss_peak_bytes=rss,
        wall_s=wall_s,
        fingerprint=fingerprint,
        layers=done[worst].layers if done[worst].layers is not None else layers,
        extra={**done[worst].extra, **common, "worst_rank": worst, "worst_rank_by_phase": by_phase},
        artifacts=runs[worst].artifacts,
    )


def _order(outcome: str) -> int:
    return FAILURE_ORDER.index(outcome) if outcome in FAILURE_ORDER else len(FAILURE_ORDER)
