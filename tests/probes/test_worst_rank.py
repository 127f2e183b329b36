"""``probes.process.worst_rank.group_result``: the ranks' own reports become one ProbeResult, the worst rank's.

Pure records, no process: each rank's report is what ``probes.step.child`` writes (a ProbeResult's dict).
"""

from __future__ import annotations

from typing import Any

from tiny_models import make_hardware

from probes.process.isolation import ChildRun
from probes.process.worst_rank import group_result, worst_phases
from store.artifacts import ALLOC_STREAM, ProbeArtifact
from store.measurements import DeviceFingerprint, PhaseMeasurement, ProbeRequest, ProbeResult

CPU = DeviceFingerprint(device="cpu", name="test cpu", total_memory_bytes=1)
REQUEST = ProbeRequest(
    workload={"kind": "sft", "model": "gpt2", "seq_len": 8, "global_batch": 2},
    strategy={"zero_stage": 2, "micro_batch": 1},
    hardware=make_hardware(gpus=2).to_dict(),
    timeout_s=60.0,
)


def phase(name: str, allocated: int, time_s: float, retries: int = 0) -> PhaseMeasurement:
    return PhaseMeasurement(name, allocated, allocated + 10, time_s, alloc_retries=retries)


def report(rank: int, phases: tuple[PhaseMeasurement, ...], outcome: str = "ok", **more: Any) -> dict[str, Any]:
    result = ProbeResult(
        outcome=outcome,
        phases=phases,
        host_rss_peak_bytes=1000 + rank,
        fingerprint=CPU,
        layers=2,
        extra={"rank": rank, "world_size": 2, "resident_bytes": 100 * (rank + 1), **more.pop("extra", {})},
        **more,
    )
    return result.to_dict()


def run(result: dict[str, Any] | None, rank: int, phase_name: str = "backward") -> ChildRun:
    events = [{"pid": 4000 + rank, "rank": rank}, {"phase": "startup", "t": 0, "rss": 5}]
    events.append({"phase": phase_name, "t": 1, "rss": 7})
    artifact = ProbeArtifact(ALLOC_STREAM, "test", bytes([rank]))
    return ChildRun(None, False, 1.0, pid=4000 + rank, events=events, result=result, artifacts=(artifact,))


def combine(runs: list[ChildRun], timed_out: bool = False, returncode: int | None = 0) -> ProbeResult:
    return group_result(
        runs,
        REQUEST,
        layers=2,
        wall_s=3.0,
        timed_out=timed_out,
        returncode=returncode,
        log_tail="log",
        fallback=CPU,
    )


def test_every_phase_takes_the_largest_figure_of_any_rank() -> None:
    rank0 = (phase("forward", 50, 0.1), phase("backward", 300, 0.2), phase("optimizer_step", 40, 0.5, retries=1))
    rank1 = (phase("forward", 60, 0.3), phase("backward", 200, 0.1), phase("optimizer_step", 45, 0.4))
    result = combine([run(report(0, rank0), 0), run(report(1, rank1), 1)])
    assert result.outcome == "ok"
    assert [
        (p.name, p.peak_allocated_bytes, p.peak_reserved_bytes, p.time_s, p.alloc_retries) for p in result.phases
    ] == [
        ("forward", 60, 70, 0.3, 0),
        ("backward", 300, 310, 0.2, 0),
        ("optimizer_step", 45, 55, 0.5, 1),
    ]
    assert result.peak_allocated_bytes == 300 and result.host_rss_peak_bytes == 1001
    extra = result.extra
    assert extra["world_size"] == 2 and extra["worst_rank"] == 0
    assert extra["worst_rank_by_phase"] == {"forward": 1, "backward": 0, "optimizer_step": 1}
    assert extra["resident_bytes"] == 100  # the top-level extra is the worst rank's
    # nothing is lost: every rank's own measurements are kept
    assert [r["rank"] for r in extra["ranks"]] == [0, 1]
    assert [p["peak_allocated_bytes"] for p in extra["ranks"][1]["phases"]] == [60, 200, 45]
    assert result.artifacts[0].data == bytes([0])  # the worst rank's allocation records
    assert result.fingerprint == CPU and result.layers == 2 and result.wall_s == 3.0


def test_a_tie_names_the_lowest_rank() -> None:
    same = (phase("forward", 50, 0.1),)
    _, by_phase = worst_phases([ProbeResult("ok", same), ProbeResult("ok", same)])
    assert by_phase == {"forward": 0}
    result = combine([run(report(0, same), 0), run(report(1, same), 1)])
    assert result.extra["worst_rank"] == 0


def test_an_oom_on_one_rank_is_the_probes_outcome_and_the_stopped_rank_keeps_its_phase() -> None:
    oom = report(1, (), outcome="oom", failed_phase="backward", message="ProbeOOM: probe memory cap")
    result = combine([run(None, 0, "optimizer_step"), run(oom, 1)], returncode=-9)
    assert result.outcome == "oom" and result.failed_phase == "backward"
    assert result.message == "rank 1: ProbeOOM: probe memory cap"
    assert result.extra["failed_rank"] == 1
    assert result.extra["ranks"][0] == {"rank": 0, "outcome": None, "last_phase": "optimizer_step", "pid": 4000}
    assert result.artifacts[0].data == bytes([1])


def test_an_oom_names_the_outcome_before_another_ranks_error() -> None:
    error = report(0, (), outcome="error", failed_phase="backward", message="RuntimeError: connection closed")
    oom = report(1, (), outcome="oom", failed_phase="backward", message="ProbeOOM: cap")
    assert combine([run(error, 0), run(oom, 1)]).message == "rank 1: ProbeOOM: cap"
    other = report(1, (), outcome="error", failed_phase="setup", message="ValueError: bad")
    assert combine([run(error, 0), run(other, 1)]).message == "rank 0: RuntimeError: connection closed"


def test_a_timeout_names_the_first_unfinished_rank_and_its_phase() -> None:
    done = report(0, (phase("forward", 50, 0.1),))
    result = combine([run(done, 0), run(None, 1, "forward")], timed_out=True, returncode=-9)
    assert result.outcome == "timeout" and result.failed_phase == "forward"
    assert result.message == "timed out after 60 s in phase forward (rank 1); rank group killed"
    assert result.phases == () and result.extra["failed_rank"] == 1


def test_a_rank_that_died_without_a_report_is_an_error() -> None:
    result = combine([run(None, 0, "setup"), run(None, 1, "setup")], returncode=1)
    assert result.outcome == "error" and result.failed_phase == "setup"
    assert result.message == "rank 0 of 2 ended without a report (in phase setup); the launcher exited with code 1"
    assert result.extra["exit_code"] == 1 and result.extra["log_tail"] == "log"
