"""`planner tune`: the cost model ranks, an Optuna study in the plan database decides what to probe, probes
calibrate, and a measured plan is confirmed and saved.

Most cases run on a simulated device: a stand-in probe runner that measures what the cost model predicts under
coefficients the planner does not know (a slower host, slower matrix products), so that what the tune should find
is known. One case tunes DeepSpeed's CPU accelerator for real, end to end through the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import CliResult

from probes.measure.fingerprint import host_fingerprint
from store.measurements import DeviceFingerprint, PhaseMeasurement, ProbeRequest, ProbeResult

Cli = Callable[..., CliResult]
# The device the tune meets: its host issues kernels 2.5x slower than the default coefficient says, and its
# matrix products reach half the catalog's rate (its peak reserved is the allocator replay's: nothing to tune).
TRUE_VALUES = {"host_s_per_kernel": 1e-4, "gpu.matmul_efficiency": 0.5}
JOB: dict[str, Any] = dict(workload="sft", gpu_mem="12G", cpu_mem="64G", batch=16, seq_len=1024)


def truth(request: ProbeRequest) -> tuple[dict[str, float], float, int]:
    """What the simulated device measures for a probe request: per-phase times, step time, peak reserved (the
    worst rank's, for a probe of several ranks: the cost model predicts per GPU)."""
    from planner.calibration.gather import probe_observation
    from planner.job.target import device_target
    from search.calibration import predicted_quantities
    from search.coefficients import DEFAULT_COEFFICIENTS

    phases = [{"name": n, "time_s": 1.0, "peak_allocated_bytes": 1, "peak_reserved_bytes": 1} for n in PHASES]
    result = {"phases": phases, "extra": {"warmup_steps": 2}}  # steady: every phase timed
    obs = probe_observation("sim", request.to_dict(), result, device_target(request.device))
    q = predicted_quantities(obs, TRUE_VALUES, DEFAULT_COEFFICIENTS)
    times = {n: q[(n, "time")] for n in PHASES}
    reserved = "peak_reserved" if request.device == "cuda" else "peak_allocated"
    return times, sum(times.values()), int(max(q[(n, reserved)] for n in PHASES))


PHASES = ("forward", "backward", "optimizer_step")
FINGERPRINT = DeviceFingerprint(device="cuda", name="unknown GPU", total_memory_bytes=0)  # as device_target sees it


class SimulatedDevice:
    """A probe runner for the simulated device; counts the probes it ran and can be told to be interrupted."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.ran: list[str] = []
        self.requests: list[ProbeRequest] = []
        self.interrupt_at = interrupt_at

    def __call__(self, request: ProbeRequest) -> ProbeResult:
        if self.interrupt_at is not None and len(self.ran) + 1 == self.interrupt_at:
            raise KeyboardInterrupt
        self.ran.append(json.dumps(request.strategy, sort_keys=True))
        self.requests.append(request)
        times, step, reserved = truth(request)
        fingerprint = FINGERPRINT if request.device == "cuda" else host_fingerprint("cpu")
        budget = request.hardware["gpu_memory_bytes"]
        if reserved > budget:
            return ProbeResult(
                outcome="oom",
                failed_phase="backward",
                message="CUDA out of memory (simulated)",
                fingerprint=FINGERPRINT,
            )
        phases = tuple(
            PhaseMeasurement(name=n, peak_allocated_bytes=reserved, peak_reserved_bytes=reserved, time_s=times[n])
            for n in PHASES
        )
        spread = {"min": 0.995 * step, "median": step, "max": 1.005 * step, "steps": 3}
        return ProbeResult(
            outcome="ok", phases=phases, wall_s=5 * step, extra={"step_time_s": spread}, fingerprint=fingerprint
        )


def _tune(db: Path | str, runner: SimulatedDevice, model: str = "opt-350m", **options: Any) -> Any:
    from planner import tune

    return tune(model, **{"device": "cuda", "steps": 3, "runner": runner, "db": str(db), **JOB, **options})


def test_tune_confirms_the_fastest_plan_that_fits_the_device_with_few_probes(db: Path) -> None:
    device = SimulatedDevice()
    report = _tune(db, device, max_probes=12)
    assert report.confirmed and report.plan is not None and report.plan.plan_id
    assert report.probes_run == len(device.ran) < report.candidates  # far fewer probes than candidates
    # the confirmed plan is the fastest the simulated device measured among the candidates that fit it
    from optuna import load_study

    from store.db import optuna_storage_url

    study = load_study(study_name=report.study, storage=optuna_storage_url(str(db)))
    space = study.user_attrs["candidates"]
    best_row = report.rows[0]
    assert best_row["fits"] and report.plan.strategy == best_row["strategy"]
    # nothing it left untested is faster on the device by more than a few percent (the fit's residual)
    measured = {json.dumps(r["strategy"], sort_keys=True) for r in report.rows}
    for key in space:
        if key in measured:
            continue
        strategy = json.loads(key)
        request = ProbeRequest(
            workload=report.plan.workload, strategy=strategy, hardware=report.plan.hardware, device="cuda", steps=3
        )
        times, step, reserved = truth(request)
        assert reserved > report.plan.predicted.gpu_budget_bytes or step > 0.95 * best_row["step_time_s"], key
    # the trials are in the study, with the probe each measured
    told = [t for t in study.trials if t.state.name in ("COMPLETE", "FAIL")]
    assert sorted(t.user_attrs["probe_id"] for t in told) == sorted(r["probe_id"] for r in report.rows)


def test_an_interrupted_tune_resumes_and_probes_nothing_twice(db: Path) -> None:
    interrupted = SimulatedDevice(interrupt_at=2)
    with pytest.raises(KeyboardInterrupt):
        _tune(db, interrupted, max_probes=12)
    assert len(interrupted.ran) == 1
    resumed_device = SimulatedDevice()
    resumed = _tune(db, resumed_device, max_probes=12)
    # the resumed run starts where the first stopped: what was measured is kept, not probed again
    assert interrupted.ran[0] not in resumed_device.ran
    assert resumed.probes_measured == 1 + len(resumed_device.ran) and resumed.probes_run == len(resumed_device.ran)
    assert resumed.confirmed and resumed.plan is not None
    fastest = min((r for r in resumed.rows if r["fits"]), key=lambda r: r["step_time_s"])
    assert resumed.plan.strategy == fastest["strategy"]
    from optuna import load_study

    from planner import probes
    from store.db import optuna_storage_url

    keys = [p.key for p in probes(db=str(db), limit=100)]
    assert len(keys) == len(set(keys)) == resumed.probes_measured  # one stored probe per measured candidate
    trials = load_study(study_name=resumed.study, storage=optuna_storage_url(str(db))).trials
    assert [t.user_attrs.get("interrupted") for t in trials].count(True) == 1
    assert not [t for t in trials if t.state.name == "RUNNING"]  # the interrupt left no trial running


def test_a_confirmed_plan_is_saved_and_exports_like_any_plan(cli: Cli, db: Path, tmp_path: Path) -> None:
    report = _tune(db, SimulatedDevice(), max_probes=12)
    assert report.plan is not None
    shown = cli("plans", "--db", db, "--json")
    assert shown.rc == 0 and report.plan.plan_id in shown.out
    out = tmp_path / "ds_config.json"
    exported = cli("export", report.plan.plan_id, "-o", out, "--db", db)
    assert exported.rc == 0, exported.err
    config = json.loads(out.read_text())
    assert config["train_micro_batch_size_per_gpu"] == report.plan.strategy["micro_batch"]
    assert config["zero_optimization"]["stage"] == report.plan.strategy["zero_stage"]
    assert report.plan.search["tune"]["probe_id"] == report.rows[0]["probe_id"]


def test_tune_on_a_postgresql_database(postgres_url: str) -> None:
    """The store and the study both live in one PostgreSQL database; a second tune on it resumes."""
    first = _tune(postgres_url, SimulatedDevice(), max_probes=1)
    assert first.probes_run == 1
    second_device = SimulatedDevice()
    second = _tune(postgres_url, second_device, max_probes=12)
    assert second.probes_measured == first.probes_measured + second.probes_run
    assert second.plan is not None and second.confirmed


CPU_MODEL = {
    "model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}  # fmt: skip


@pytest.mark.slow
def test_tune_confirms_a_plan_on_the_cpu_backend(cli: Cli, db: Path, tmp_path: Path) -> None:
    """Real probes of DeepSpeed's CPU accelerator through the CLI. How fast this machine is decides which plan
    wins and when the tune stops; what must hold is that it stops with a measured plan that fits, saved."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CPU_MODEL))
    job = ("--model", folder, "--device", "cpu", "--gpu-mem", "2G", "--cpu-mem", "64G", "--workload", "sft")
    run = cli("tune", *job, "--batch", "4", "--seq-len", "64", "--steps", "2", "--timeout", "3600",
              "--max-probes", "2", "--json", "--db", db)  # fmt: skip
    assert run.rc == 0, run.err
    report = run.json()
    assert report["target"].startswith("cpu:") and 1 <= report["probes_run"] <= 2
    assert report["plan"] is not None and report["plan"]["plan_id"]
    assert report["rows"][0]["fits"] and report["rows"][0]["outcome"] == "ok"
    assert report["calibration_id"]  # refit to the probes it ran
    assert "probe 1/2: " in run.err  # progress on stderr


def test_tune_on_two_gpus_of_this_node_probes_two_ranks(db: Path) -> None:
    """--gpus 2: the candidates are ranked for two data-parallel ranks and every probe runs two (here, the
    CPU backend's limit of four allows it; a tune for several nodes is refused in one line)."""
    device = SimulatedDevice()
    report = _tune(db, device, "opt-125m", max_probes=12, device="cpu", gpus=2)  # the CPU backend: <= 200M
    assert report.plan is not None and report.plan.hardware["gpus"] == 2
    assert device.requests and all(r.hardware["gpus"] == 2 for r in device.requests)
    strategy = report.plan.strategy
    assert strategy["micro_batch"] * strategy["grad_accum"] * 2 == JOB["batch"]  # per-rank share of the batch
    from store.errors import InputError

    with pytest.raises(InputError, match="give --nodes 1"):
        _tune(db, SimulatedDevice(), "opt-125m", device="cpu", gpus=2, nodes=2)
    with pytest.raises(InputError, match="at most 4 ranks"):
        _tune(db, SimulatedDevice(), "opt-125m", device="cpu", gpus=8)


def test_two_machines_share_one_study_and_probe_nothing_twice(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tuning processes on one PostgreSQL database (Optuna's own writes on a SQLite file can meet
    "database is locked" when several processes tell trials at once), each naming no study: the job's own. They
    are ``test_tune_shared``'s workers (forked from one process that imported what a tune imports, tuning the CPU
    backend of opt-125m in fp32), here two of them, with up to four probes each."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # under any import mode
    from test_tune_shared import run_workers

    db = postgres_url
    run, lines = run_workers(db, 4, count=2, study="")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert lines[-1] == {"exit_codes": [0, 0]}, (lines[-1], run.stderr[-3000:])
    ran = [len(line["ran"]) for line in lines[:-1]]
    assert len(ran) == 2, run.stdout[-3000:]
    from optuna import load_study

    from planner import probes
    from store.db import optuna_storage_url

    stored = probes(db=str(db), limit=100)
    assert len({p.key for p in stored}) == len(stored) == sum(ran)  # every probe ran once, on one machine
    name = _tune(db, SimulatedDevice(), "opt-125m", max_probes=1, device="cpu", dtype="fp32").study  # the job's own
    study = load_study(study_name=name, storage=optuna_storage_url(str(db)))
    measured = [t.user_attrs["probe_id"] for t in study.trials if "probe_id" in t.user_attrs]
    assert set(measured) == {p.probe_id for p in stored}  # no trial lost, none without its probe
