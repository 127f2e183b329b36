"""Probes a newcomer can run (issue 32, item 5): a timed-out probe runs again when given longer, probes that would
take minutes (or run past their timeout) are announced before the first one starts, with numbers from the
prediction, and progress shows as plain lines where no live display does (a pipe, a file, --json).

The probes here are stand-ins (an injected runner, or ``probes.run_probe`` replaced in a child process); the
database is a real SQLite file.
"""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import REPO, subprocess_env

from store.measurements import PhaseMeasurement, ProbeRequest, ProbeResult

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}  # fmt: skip
TINY_JOB: dict[str, Any] = dict(
    workload="sft", gpu_mem="24G", cpu_mem="64G", batch=2, seq_len=32, steps=2, device="cpu", dtype="fp32"
)
ONE = [{"zero_stage": 0, "micro_batch": 2, "grad_accum": 1}]
RATES = (1e11, 1e10)  # FLOP/s and bytes/s this "CPU" reaches (measuring is replaced: the tests are deterministic)


@pytest.fixture(autouse=True)
def fixed_cpu_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.probing.estimate

    monkeypatch.setattr(planner.probing.estimate, "cpu_rates", lambda dtype: RATES)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return folder


def _strategies(tmp_path: Path, strategies: list[dict[str, Any]]) -> str:
    path = tmp_path / f"strategies-{len(list(tmp_path.glob('strategies-*')))}.json"
    path.write_text(json.dumps(strategies))
    return str(path)


def _result(outcome: str, request: ProbeRequest, step_s: float = 0.1) -> ProbeResult:
    if outcome == "timeout":
        return ProbeResult(
            outcome="timeout",
            failed_phase="backward",
            message=f"timed out after {request.timeout_s:g} s in phase backward; process group killed",
            wall_s=request.timeout_s,
            layers=request.layers,
        )
    if outcome == "oom":
        return ProbeResult(outcome="oom", failed_phase="backward", message="probe memory cap", layers=request.layers)
    phases = tuple(
        PhaseMeasurement(name=name, peak_allocated_bytes=2**20, peak_reserved_bytes=2**20, time_s=step_s / 3)
        for name in ("forward", "backward", "optimizer_step")
    )
    spread = {"min": step_s, "median": step_s, "max": step_s, "steps": [step_s]}
    return ProbeResult(outcome="ok", phases=phases, wall_s=20.0, layers=request.layers, extra={"step_time_s": spread})


class Runner:
    """A stand-in probe runner: ``outcome`` for every probe, or a timeout under ``needs_s`` seconds and ok from
    there; it records the timeout each request gave and the strategy it ran."""

    def __init__(self, outcome: str = "ok", needs_s: float | None = None, events: list[str] | None = None) -> None:
        self.outcome = outcome
        self.needs_s = needs_s
        self.timeouts: list[float] = []
        self.strategies: list[str] = []
        self.events = events

    def __call__(self, request: ProbeRequest) -> ProbeResult:
        self.timeouts.append(request.timeout_s)
        self.strategies.append(json.dumps(request.strategy, sort_keys=True))
        if self.events is not None:
            self.events.append("probe ran")
        if self.needs_s is not None:
            return _result("ok" if request.timeout_s >= self.needs_s else "timeout", request)
        return _result(self.outcome, request)


# --- a timed-out probe runs again when given longer -----------------------------------------------------------


def test_a_timed_out_probe_runs_again_only_when_given_a_longer_timeout(tiny: Path, tmp_path: Path) -> None:
    """The timeout is no part of a probe's key: the same probe at 10 s, 5 s and 60 s is one request. A timeout
    stored at 10 s answers 5 s and 10 s (said in a note), and runs again at 60 s, stored as the newest."""
    from planner import probe
    from store.db import open_storage

    db = str(tmp_path / "p.db")
    job = dict(TINY_JOB, strategies=_strategies(tmp_path, ONE), layers="2", db=db)
    runner = Runner("timeout")
    first = probe(str(tiny), timeout_s=10, runner=runner, **job)
    assert runner.timeouts == [10.0]
    (row,) = first.rows
    assert row.outcome == "timeout" and not row.reused

    for shorter in (5, 10):
        notes: list[str] = []
        again = probe(str(tiny), timeout_s=shorter, runner=runner, on_note=notes.append, **job)
        assert runner.timeouts == [10.0]  # not run: it had at least as long
        assert again.rows[0].reused and again.rows[0].probe_id == row.probe_id
        (said,) = [n for n in notes if "timed out before" in n]
        assert "shown as stored" in said and "a --timeout above 10 s runs it again" in said

    notes = []
    longer = probe(str(tiny), timeout_s=60, runner=runner, on_note=notes.append, **job)
    assert runner.timeouts == [10.0, 60.0]
    assert not longer.rows[0].reused and longer.rows[0].probe_id != row.probe_id
    assert [n for n in notes if "timed out before" in n] == [
        "1 stored probe timed out before under a shorter --timeout (up to 10 s): running it again with --timeout 60 s"
    ]
    with open_storage(db) as storage:
        newest, oldest = storage.list_probes()
        assert newest.probe_id == longer.rows[0].probe_id and newest.request.timeout_s == 60.0
        assert oldest.probe_id == row.probe_id and newest.key == oldest.key  # one request, two results
        assert storage.find_probe(newest.key).probe_id == newest.probe_id

    # the 60 s timeout is now what is stored: 30 s reuses it, and a 60 s timeout again too
    for timeout in (30, 60):
        assert probe(str(tiny), timeout_s=timeout, runner=runner, **job).rows[0].probe_id == newest.probe_id
    assert runner.timeouts == [10.0, 60.0]


@pytest.mark.parametrize("outcome", ["ok", "oom"])
def test_an_ok_or_oom_probe_is_reused_whatever_the_timeout(tiny: Path, tmp_path: Path, outcome: str) -> None:
    from planner import probe

    job = dict(TINY_JOB, strategies=_strategies(tmp_path, ONE), layers="2", db=str(tmp_path / "p.db"))
    runner = Runner(outcome)
    first = probe(str(tiny), timeout_s=10, runner=runner, **job)
    for timeout in (5, 60, 3600):
        notes: list[str] = []
        again = probe(str(tiny), timeout_s=timeout, runner=runner, on_note=notes.append, **job)
        assert again.rows[0].reused and again.rows[0].probe_id == first.rows[0].probe_id
        assert again.rows[0].outcome == outcome and not [n for n in notes if "timed out" in n]
    assert runner.timeouts == [10.0]


def test_force_still_runs_a_stored_probe_whatever_its_outcome(tiny: Path, tmp_path: Path) -> None:
    from planner import probe

    job = dict(TINY_JOB, strategies=_strategies(tmp_path, ONE), layers="2", db=str(tmp_path / "p.db"))
    runner = Runner("timeout")
    probe(str(tiny), timeout_s=60, runner=runner, **job)
    probe(str(tiny), timeout_s=10, runner=runner, force=True, **job)
    assert runner.timeouts == [60.0, 10.0]


def test_tune_probes_a_timed_out_candidate_again_when_given_longer(tiny: Path, tmp_path: Path) -> None:
    """A tune's study remembers a timed-out candidate as measured: a later tune given a longer timeout probes it
    again (``planner.tuning.study.probe_candidate`` through the same probe session), a shorter one does not."""
    from planner import tune
    from store.db import open_storage

    db = str(tmp_path / "t.db")
    job = dict(TINY_JOB, db=db)
    first = Runner(needs_s=60)
    tune(str(tiny), timeout_s=10, max_probes=3, runner=first, **job)
    assert first.timeouts and set(first.timeouts) == {10.0}  # every candidate it probed timed out

    shorter = Runner(needs_s=60)
    tune(str(tiny), timeout_s=5, max_probes=3, runner=shorter, **job)
    assert not set(shorter.strategies) & set(first.strategies)  # none of the timed-out ones again

    longer = Runner(needs_s=60)
    report = tune(str(tiny), timeout_s=60, max_probes=1, runner=longer, **job)
    assert longer.timeouts == [60.0] and longer.strategies[0] in first.strategies + shorter.strategies
    (row,) = [r for r in report.rows if json.dumps(r["strategy"], sort_keys=True) == longer.strategies[0]]
    assert row["outcome"] == "ok" and row["fits"]
    with open_storage(db) as storage:
        newest = storage.get_probe(row["probe_id"])
        assert newest.request.timeout_s == 60.0 and storage.find_probe(newest.key).probe_id == newest.probe_id


# --- probes that would take minutes are announced --------------------------------------------------------------

BIG = [
    {"zero_stage": 2, "gradient_checkpointing": True, "micro_batch": 4, "grad_accum": 8},
    {"zero_stage": 3, "micro_batch": 4, "grad_accum": 8},
]
BIG_JOB: dict[str, Any] = dict(
    workload="sft", gpu="H100-80G", cpu_mem="256G", batch=32, seq_len=4096, layers="2", device="cuda", steps=40
)


def _expected_seconds(step_time_s: float, zero_stage: int, steps: int, device: str) -> float:
    """A probe's estimate as docs/probes.md states it: start-up, then every step, a warm-up step (two under
    ZeRO-3) counting 1.5 steps."""
    from planner.probing.estimate import STARTUP_S

    warmup = 2 if zero_stage == 3 else 1
    return STARTUP_S[device] + step_time_s * (steps - warmup + 1.5 * warmup)


def test_probes_that_would_take_minutes_are_announced_before_the_first(tmp_path: Path) -> None:
    """A 7B model cut to 2 layers, 40 steps of 32 x 4096 tokens, on the cuda device with a 60 s timeout: one line
    before any probe runs, its numbers the start-up and the steps at each row's predicted step time."""
    from planner import probe
    from planner.probing.estimate import duration

    events: list[str] = []
    runner = Runner("ok", events=events)
    report = probe(
        "llama-2-7b", strategies=_strategies(tmp_path, BIG), timeout_s=60, runner=runner, db=str(tmp_path / "p.db"),
        on_note=lambda line: events.append(line), **BIG_JOB,
    )  # fmt: skip
    estimates = [e for e in events if e.startswith("estimate:")]
    assert len(estimates) == 1 and events.index(estimates[0]) < events.index("probe ran")
    (line,) = estimates
    steps = BIG_JOB["steps"]
    expected = {
        r.label: _expected_seconds(r.predicted["step_time_s"], r.strategy["zero_stage"], steps, "cuda")
        for r in report.rows
    }
    assert len(expected) == 2 and all(60 < s < 600 for s in expected.values())
    total = sum(expected.values())
    assert line.startswith(f"estimate: 2 probes to run, about {duration(total)} (30 s start-up each")
    assert "2 of them will likely time out" in line
    label, longest = max(expected.items(), key=lambda kv: kv[1])
    assert f"({label}: about {duration(longest)}, --timeout 60 s)" in line
    assert f"give --timeout {60 * math.ceil(longest * 1.5 / 60)}, or probe less (--layers 1, --steps 2" in line
    assert "\n" not in line

    # stored now: nothing is about to run, nothing is announced
    events.clear()
    probe("llama-2-7b", strategies=_strategies(tmp_path, BIG), timeout_s=60, runner=runner, db=str(tmp_path / "p.db"),
          on_note=events.append, **BIG_JOB)  # fmt: skip
    assert not [e for e in events if e.startswith("estimate:")]


def test_minutes_within_the_timeout_are_announced_without_a_warning(tmp_path: Path) -> None:
    from planner import probe

    notes: list[str] = []
    probe("llama-2-7b", strategies=_strategies(tmp_path, BIG), timeout_s=3600, runner=Runner(), on_note=notes.append,
          db=str(tmp_path / "p.db"), **BIG_JOB)  # fmt: skip
    (line,) = [n for n in notes if n.startswith("estimate:")]
    assert "time out" not in line and line.endswith("Ctrl-C stops, and the same command run again resumes")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cheap_probes_are_not_announced(tiny: Path, tmp_path: Path, device: str) -> None:
    from planner import probe

    notes: list[str] = []
    job = dict(TINY_JOB, device=device, strategies=_strategies(tmp_path, ONE), layers="2", db=str(tmp_path / "p.db"))
    probe(str(tiny), timeout_s=600, runner=Runner(), on_note=notes.append, **job)
    assert not [n for n in notes if n.startswith("estimate:")]


def test_a_cpu_probe_is_estimated_at_this_cpus_rates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Uncalibrated, the cost model's step time is a GPU's: the estimate runs it on this CPU's measured rates
    (patched here), so the matrix products of OPT-350m cut to one layer take about half as long at twice the
    rate, and hundreds of times the GPU's."""
    import planner.probing.estimate as estimate
    from planner import probe
    from planner.job.cut import cut_workload
    from planner.job.inputs import JobSpec, resolve
    from search import DEFAULT_COEFFICIENTS, predict
    from store.records import Strategy

    job = resolve(JobSpec(model="opt-350m", workload="sft", gpu_mem="24G", cpu_mem="64G", batch=8, seq_len=512))
    strategy = Strategy(zero_stage=2, micro_batch=8, grad_accum=1)
    gpu = predict(cut_workload(job.workload, 1), strategy, job.hardware, DEFAULT_COEFFICIENTS)
    steps = {}
    for flops in (1e10, 2e10):
        monkeypatch.setattr(estimate, "cpu_rates", lambda dtype, flops=flops: (flops, 1e10))
        steps[flops] = estimate.device_step_time(
            job.workload, strategy, job.hardware, gpu, device="cpu", layers=1, coef=DEFAULT_COEFFICIENTS, timed=False
        )
    assert steps[1e10] > 100 * gpu.step_time_s
    assert steps[1e10] / steps[2e10] == pytest.approx(2, rel=0.1)
    calibrated = estimate.device_step_time(
        job.workload, strategy, job.hardware, gpu, device="cpu", layers=1, coef=DEFAULT_COEFFICIENTS, timed=True
    )
    assert calibrated == gpu.step_time_s  # calibrated to this CPU: the prediction's own

    monkeypatch.setattr(estimate, "cpu_rates", lambda dtype: (1e10, 1e10))
    notes: list[str] = []
    probe("opt-350m", workload="sft", gpu_mem="24G", cpu_mem="64G", batch=8, seq_len=512, dtype="fp32", layers="1",
          strategies=_strategies(tmp_path, [strategy.to_dict()]), device="cpu", steps=2, timeout_s=60,
          runner=Runner(), on_note=notes.append, db=str(tmp_path / "p.db"))  # fmt: skip
    (line,) = [n for n in notes if n.startswith("estimate:")]
    assert "this CPU's measured rates" in line and "will likely time out" in line


def test_tune_announces_its_probes_before_the_first(tmp_path: Path) -> None:
    from planner import tune

    events: list[str] = []
    tune("opt-350m", workload="sft", gpu_mem="12G", cpu_mem="64G", batch=16, seq_len=1024, device="cuda", steps=3,
         timeout_s=1, max_probes=1, runner=Runner(), on_note=events.append, on_progress=events.append,
         db=str(tmp_path / "t.db"))  # fmt: skip
    (line,) = [e for e in events if e.startswith("estimate:")]
    assert line.startswith("estimate: up to 1 probe to run") and "it will likely time out" in line
    assert "--max-probes" in line and "--layers" not in line  # a tune probes the whole model
    assert events.index(line) == events.index(next(e for e in events if e.startswith("probe 1/1: "))) - 1


# --- progress lines where no live display shows ----------------------------------------------------------------

WALL = datetime(2026, 11, 29, 19, 40, 5, 250000, tzinfo=timezone(timedelta(hours=2)))  # an injected wall clock
STARTED = "(started 2026-11-29T17:40:05Z)"  # the same moment in UTC, to the second


def test_a_probes_line_says_when_it_started_in_utc() -> None:
    """The line a probe starts with carries the time its process starts at (ISO 8601, UTC), to match the
    process to a log; before, it said only which probe."""
    from planner.cli.progress import ProbeLines

    out = io.StringIO()
    with ProbeLines(out, timeout_s=600, interval=None, wall=lambda: WALL) as lines:
        lines.start("probe 1/3: ZeRO-2, mb 4x2")
    assert out.getvalue() == f"probe 1/3: ZeRO-2, mb 4x2 {STARTED}\n"


def test_progress_lines_start_each_probe_and_beat_while_it_runs() -> None:
    from planner.cli.progress import ProbeLines

    out = io.StringIO()
    with ProbeLines(out, timeout_s=600, interval=0.05, wall=lambda: WALL) as lines:
        lines.start("probe 1/2: A")
        time.sleep(0.4)
        lines.note("a note")
        lines.start("probe 2/2: B")
        time.sleep(0.2)
    written = out.getvalue().splitlines()
    time.sleep(0.15)
    assert out.getvalue().splitlines() == written  # nothing after the block
    b = f"probe 2/2: B {STARTED}"
    assert written[0] == f"probe 1/2: A {STARTED}" and "a note" in written and b in written
    beats = [line for line in written if line.startswith("  still running: ")]
    assert len(beats) >= 3 and all(line.endswith(" of at most 10m") for line in beats)
    after_b = written[written.index(b) + 1 :]
    assert after_b and after_b[0] == "  still running: 0s of at most 10m"  # counted from B's start


def test_no_heartbeat_with_interval_zero_and_none_past_the_probes_end() -> None:
    from planner.cli.progress import GRACE_S, ProbeLines

    quiet = io.StringIO()
    with ProbeLines(quiet, timeout_s=600, interval=None, wall=lambda: WALL) as lines:
        lines.start("probe 1/1: A")
        time.sleep(0.1)
    assert quiet.getvalue() == f"probe 1/1: A {STARTED}\n"

    now = [0.0]
    late = io.StringIO()
    with ProbeLines(late, timeout_s=1, interval=0.02, clock=lambda: now[0]) as lines:
        lines.start("probe 1/1: A")
        now[0] = 2.0  # past its timeout: stopping
        time.sleep(0.1)
        now[0] = 2.0 + GRACE_S  # it has ended by now: silence
        time.sleep(0.05)
        said = late.getvalue()
        time.sleep(0.1)
        assert late.getvalue() == said
    assert "  still running: 2s, past its timeout: being stopped" in said


@pytest.mark.parametrize(
    ("text", "seconds"), [("", 30.0), ("2.5", 2.5), ("0", None), ("-1", None), ("soon", 30.0), ("inf", 30.0)]
)
def test_the_heartbeat_interval_comes_from_the_environment(text: str, seconds: float | None) -> None:
    from planner.cli.progress import INTERVAL_ENV, interval_s

    assert interval_s({INTERVAL_ENV: text}) == seconds


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0s"), (45, "45s"), (90, "1m30s"), (600, "10m"), (3900, "1h05m")])
def test_elapsed_text(seconds: float, text: str) -> None:
    from planner.cli.progress import elapsed_text

    assert elapsed_text(seconds) == text


SLOW_PROBES = """
import sys, time
import probes
import planner.probing.estimate
from store.measurements import PhaseMeasurement, ProbeResult

def slow(request):  # a probe that takes a second
    time.sleep(1.0)
    phase = PhaseMeasurement(name="backward", peak_allocated_bytes=2**20, peak_reserved_bytes=2**20, time_s=0.1)
    return ProbeResult(outcome="ok", phases=(phase,), wall_s=1.0, layers=request.layers)

probes.run_probe = slow
probes.prepare_ops = lambda requests, on_note=None: None
planner.probing.estimate.cpu_rates = lambda dtype: (1e11, 1e10)
from planner.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("json_out", [True, False], ids=["json", "text"])
def test_a_piped_planner_probe_prints_progress_lines(tiny: Path, tmp_path: Path, json_out: bool) -> None:
    """``planner probe`` in a real process, its stdout and stderr pipes (no terminal): a line on stderr as each
    probe starts and a heartbeat while it runs (every 0.2 s here, MEMPLAN_PROGRESS_INTERVAL_S), the report on
    stdout."""
    strategies = _strategies(tmp_path, [*ONE, {"zero_stage": 1, "micro_batch": 2, "grad_accum": 1}])
    args = ["probe", "--model", tiny, "--device", "cpu", "--dtype", "fp32", "--gpu-mem", "24G", "--cpu-mem", "64G",
            "--workload", "sft", "--batch", "2", "--seq-len", "32", "--steps", "2", "--layers", "2", "--timeout", "90",
            "--strategies", strategies, "--db", tmp_path / "p.db"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", SLOW_PROBES, *map(str, args), *(["--json"] if json_out else [])],
        cwd=REPO,
        env=subprocess_env({"MEMPLAN_PROGRESS_INTERVAL_S": "0.2"}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    starts = [line for line in lines if line.startswith("probe ")]
    stamp = r" \(started \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)"  # when its process started, ISO UTC
    assert [re.sub(stamp, "", line) for line in starts] == ["probe 1/2: ZeRO-0, mb 2x1", "probe 2/2: ZeRO-1, mb 2x1"]
    assert all(re.search(stamp + "$", line) for line in starts)
    for start, end in ((starts[0], starts[1]), (starts[1], None)):
        during = lines[lines.index(start) + 1 : lines.index(end) if end else len(lines)]
        beats = [line for line in during if line.startswith("  still running: ")]
        assert beats and all(re.fullmatch(r"  still running: \ds of at most 1m30s", b) for b in beats), during
    if json_out:
        assert [row["outcome"] for row in json.loads(proc.stdout)["rows"]] == ["ok", "ok"]
    else:
        assert "still running" not in proc.stdout and "ZeRO-1" in proc.stdout
