"""``benchmarks/gpu_validate.py`` writes each row as it finishes, resumes from its database, stops starting
probes after --max-minutes, runs the most informative probes first, and stops on a failed op build with one
line (fault 4 of the H100 run, issue 15: 19 probes did not fit in 10 minutes and nothing was written).

``main`` runs for real through ``planner.probe`` and a real SQLite database, on the CPU device (no GPU asked);
the probe runner, the op build and the clock are injected, so nothing depends on this machine's speed.
"""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from probes.ops.prepare import OpBuildError
from store.measurements import PhaseMeasurement, ProbeRequest, ProbeResult

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_validate.py"
PROBE_SECONDS = 25.0  # what each fake probe "takes" on the injected clock


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_validate_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gv = load_script()


class FakeProbes:
    """Stands in for run_probe: each call "takes" PROBE_SECONDS on the injected clock and checks that every
    probe finished before it is already in the csv (rows are written as they finish, not at the end)."""

    def __init__(self, out: Path) -> None:
        self.out, self.now, self.calls = out, 0.0, 0
        self.rows_seen: list[int] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, request: ProbeRequest) -> ProbeResult:
        self.rows_seen.append(len(read_csv(self.out)))
        self.calls += 1
        self.now += PROBE_SECONDS
        phases = tuple(
            PhaseMeasurement(name=name, peak_allocated_bytes=2**30, peak_reserved_bytes=2**30, time_s=0.1)
            for name in ("forward", "backward", "optimizer_step")
        )
        spread = {"min": 0.3, "median": 0.31, "max": 0.4, "steps": [0.3, 0.31, 0.4]}
        return ProbeResult(outcome="ok", phases=phases, layers=request.layers, extra={"step_time_s": spread})


def read_csv(out: Path) -> list[dict[str, str]]:
    path = out / "gpu_validate.csv"
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def no_build(requests: list[ProbeRequest], on_note: Any = None) -> list[Any]:
    return []


def args(out: Path, *more: str) -> list[str]:
    return ["--device", "cpu", "--models", "opt-125m", "--workloads", "sft", "--out", str(out), *more]


def test_the_order_puts_a_spread_of_the_matrix_first() -> None:
    cells = gv.matrix(["opt-125m", "opt-1.3b"], ["sft", "ppo"])
    ordered = gv.order_cells(cells)
    assert len(ordered) == len(cells) == 2 * 19 and all(cell in cells for cell in ordered)
    assert ordered[0] == cells[0] and ordered[0].label() == "opt-125m sft ZeRO-2"  # ties keep matrix order
    first = [cell.features() for cell in ordered[:8]]
    for knob in gv.KNOBS:  # every value of every knob is measured within the first 8 of 38 probes
        assert {f[knob] for f in first} == {cell.features()[knob] for cell in cells}, knob
    one_model = gv.order_cells(gv.matrix(["opt-1.3b"], ["sft", "ppo"]))
    assert {c.workload for c in one_model[:2]} == {"sft", "ppo"}
    assert any(c.features()["zero_stage"] == "3" for c in one_model[:3])


def test_rows_are_written_as_they_finish_stop_after_max_minutes_and_a_rerun_resumes(tmp_path: Path) -> None:
    out = tmp_path / "results"
    fake = FakeProbes(out)
    built: list[str] = []

    def prepare(requests: list[ProbeRequest], on_note: Any = None) -> list[Any]:
        built.extend(r.device for r in requests)  # called before each new probe (the real one builds once)
        return []

    # 1 minute at 25 s a probe: probes start at 0, 25 and 50 s; none starts at 75 s.
    assert gv.main(args(out, "--max-minutes", "1"), runner=fake, prepare=prepare, clock=fake.clock) == 0
    first = read_csv(out)
    assert fake.calls == 3 and fake.rows_seen == [0, 1, 2] and len(built) == 3
    assert len(first) == 3 and {r["outcome"] for r in first} == {"ok"} and not any(r["reused"] for r in first)
    assert first[0]["step_spread_s"] == "0.3/0.31/0.4"
    report = (out / "gpu_validate.md").read_text()
    assert "7 probe(s) not run" in report and report.count("not run (--max-minutes)") == 7
    assert (out / "gpu_validate.db").exists()  # the default database lives beside the results

    again = FakeProbes(out)
    assert gv.main(args(out), runner=again, prepare=prepare, clock=again.clock) == 0
    rows = read_csv(out)
    assert again.calls == 7 and len(rows) == 10  # only the 7 probes not stored ran
    assert [r["probe_id"] for r in rows[:3]] == [r["probe_id"] for r in first]
    assert [r["reused"] for r in rows] == ["yes"] * 3 + [""] * 7
    assert "not run" not in (out / "gpu_validate.md").read_text()

    third = FakeProbes(out)
    assert gv.main(args(out, "--max-minutes", "0"), runner=third, prepare=prepare, clock=third.clock) == 0
    assert third.calls == 0 and len(read_csv(out)) == 10  # past the deadline, stored probes are still read


def test_stored_failures_are_rerun_only_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "results"

    def failing(request: ProbeRequest) -> ProbeResult:
        return ProbeResult(outcome="error", message="RuntimeError: boom")

    assert gv.main(args(out, "--max-minutes", "0.9"), runner=failing, prepare=no_build, clock=lambda: 0.0) == 0
    assert {r["outcome"] for r in read_csv(out)} == {"error"}
    fake = FakeProbes(out)
    assert gv.main(args(out), runner=fake, prepare=no_build, clock=fake.clock) == 0
    assert fake.calls == 0 and {r["outcome"] for r in read_csv(out)} == {"error"}  # reused as stored
    assert gv.main(args(out, "--retry-failed"), runner=fake, prepare=no_build, clock=fake.clock) == 0
    assert fake.calls == 10 and {r["outcome"] for r in read_csv(out)} == {"ok"}


def test_a_failed_op_build_stops_the_run_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results"
    fake = FakeProbes(out)
    calls = [0]

    def prepare(requests: list[ProbeRequest], on_note: Any = None) -> list[Any]:
        calls[0] += 1
        if calls[0] == 3:
            raise OpBuildError("building DeepSpeed's ops FusedAdamBuilder for cuda before the probes failed: boom")
        return []

    assert gv.main(args(out), runner=fake, prepare=prepare, clock=fake.clock) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_validate: error: building DeepSpeed's ops")
    assert fake.calls == 2 and len(read_csv(out)) == 2  # what finished before stays written


def test_a_matrix_probe_started_before_the_deadline_runs_all_its_depths(tmp_path: Path) -> None:
    """With --layers 1 each strategy is probed at 1 layer and whole: both rows, or neither, make the files."""
    out = tmp_path / "results"
    fake = FakeProbes(out)
    # cells open at 0 s and 50 s (each 2 probes of 25 s); the third would open at 100 s > 60 s
    cut = args(out, "--layers", "1", "--max-minutes", "1")
    assert gv.main(cut, runner=fake, prepare=no_build, clock=fake.clock) == 0
    rows = read_csv(out)
    assert fake.calls == 4 and len(rows) == 4 and fake.rows_seen == [0, 0, 2, 2]
    assert [r["strategy"].endswith("[1 layers]") for r in rows] == [True, False, True, False]
    assert "8 probe(s) not run" in (out / "gpu_validate.md").read_text()


@pytest.mark.parametrize(
    ("bf16_fast", "given", "ran"), [(False, (), "fp32"), (True, (), "bf16"), (False, ("--dtype", "bf16"), "bf16")]
)
def test_a_cpu_dry_run_probes_the_dtype_this_processor_runs_fast_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, bf16_fast: bool,
    given: tuple[str, ...], ran: str,
) -> None:  # fmt: skip
    """With no --dtype the CPU matrix runs what planner.probe picks (fp32 without oneDNN bf16 kernels), with one
    line saying so for the whole run; --dtype bf16 is kept, with the warning."""
    import probes.measure.cpu_support

    monkeypatch.setattr(probes.measure.cpu_support, "cpu_bf16_is_fast", lambda: bf16_fast)
    out = tmp_path / "results"
    fake = FakeProbes(out)
    dtypes: list[str] = []

    def runner(request: ProbeRequest) -> ProbeResult:
        dtypes.append(request.workload["dtype"])
        return fake(request)

    assert gv.main(args(out, "--max-minutes", "0.4", *given), runner=runner, prepare=no_build, clock=fake.clock) == 0
    assert dtypes and set(dtypes) == {ran}
    said = [line for line in capsys.readouterr().out.splitlines() if "dtype" in line]
    if given:
        assert len(said) == 1 and "warning: --dtype bf16" in said[0]
    else:
        assert len(said) == 1 and said[0].startswith(f"gpu_validate: dtype: {ran} (")
