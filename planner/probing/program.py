"""``planner probe ... -- CMD``: the user's own program run under the plan's strategies, measured beside the
prediction.

Reads top to bottom: resolve the job (it describes the program's model and batch, so every measurement sits
beside its prediction), choose the strategies (the plan and its next best by default), run the command once
per strategy under the start-up hook of :mod:`probes.script` (it overrides the strategy's DeepSpeed keys in the
config the program passes, applies checkpointing and ``empty_cache``, measures each phase and ends the program
after its timed steps), then put each phase's measured peak beside the predicted one.

The program is the user's: a strategy it cannot take (LoRA on a script that builds no adapters) is reported
and not measured, and a program whose own batch contradicts the plan is measured but flagged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from planner.job.calibrated import calibrated
from planner.job.inputs import JobSpec, ResolvedJob, resolve
from planner.job.target import device_target
from planner.probing.device import PROBE_GPU_MEM, cpu_probe_dtype, device_coefficients, device_prediction
from planner.probing.limits import check_run
from planner.probing.plan import check_ranks, choose_strategies
from search import DEFAULT_COEFFICIENTS, Coefficients, Prediction, predict
from store.errors import InputError
from store.records import Strategy

DEFAULT_STRATEGIES = 2  # the plan and its next best


@dataclass(frozen=True)
class ProgramPhase:
    """One phase of the program's step: measured (worst rank) against predicted peak allocated and reserved."""

    name: str
    measured_allocated_bytes: int
    measured_reserved_bytes: int
    predicted_allocated_bytes: int | None
    predicted_reserved_bytes: int | None
    time_s: float

    @property
    def allocated_error(self) -> float | None:
        """(predicted - measured) / measured peak allocated; None where the model has no such phase."""
        if not self.predicted_allocated_bytes or not self.measured_allocated_bytes:
            return None
        return self.predicted_allocated_bytes / self.measured_allocated_bytes - 1.0


@dataclass(frozen=True)
class ProgramRun:
    """One strategy run in the user's program: its outcome (``probes.script.launch.OUTCOMES``), what the
    program really ran with, each phase measured against predicted, and the program's exit and log tail."""

    strategy: dict[str, Any]
    label: str
    outcome: str
    reason: str
    message: str
    ran_with: dict[str, Any]
    contradictions: tuple[str, ...]
    not_applied: tuple[str, ...]
    phases: tuple[ProgramPhase, ...]
    measured_step_s: float | None
    predicted_step_s: float
    exit_code: int | None
    log_tail: str


@dataclass(frozen=True)
class ProgramProbeReport:
    """Every strategy run in the user's program (``planner probe ... -- CMD``)."""

    command: tuple[str, ...]
    program: dict[str, Any]
    device: str
    runs: tuple[ProgramRun, ...]
    readings: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``--json``."""
        document = asdict(self)
        for run, shown in zip(self.runs, document["runs"], strict=True):
            for phase, phase_doc in zip(run.phases, shown["phases"], strict=True):
                phase_doc["allocated_error"] = phase.allocated_error
        return document


def _phases(measured: Any, prediction: Prediction) -> tuple[ProgramPhase, ...]:
    predicted = {phase.name: phase for phase in prediction.phases}
    rows = []
    for phase in measured:
        model = predicted.get(phase.name)
        rows.append(
            ProgramPhase(
                name=phase.name,
                measured_allocated_bytes=phase.peak_allocated_bytes,
                measured_reserved_bytes=phase.peak_reserved_bytes,
                predicted_allocated_bytes=model.peak_allocated_bytes if model else None,
                predicted_reserved_bytes=model.peak_reserved_bytes if model else None,
                time_s=phase.time_s,
            )
        )
    return tuple(rows)


def _median_step(step_time_s: dict[str, Any]) -> float | None:
    value = step_time_s.get("median") if isinstance(step_time_s, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def probe_program(
    model: str | JobSpec,
    command: list[str],
    *,
    strategies: str = "recommended",
    steps: int = 4,
    timeout_s: float = 600.0,
    device: str = "cuda",
    calibration: str = "auto",
    db: str | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    coefficients: Coefficients = DEFAULT_COEFFICIENTS,
    runner: Callable[..., Any] | None = None,
    **job: Any,
) -> ProgramProbeReport:
    """Run ``command`` (a launch line: ``python train.py``, ``torchrun ...``, ``accelerate launch ...``) once per
    strategy and compare each phase with the prediction. ``runner`` defaults to
    ``probes.script.launch.run_script_probe``; ``steps`` counts warm-up and timed steps as ``planner probe``'s."""
    if not command:
        raise InputError("planner probe -- CMD: give the launch command of your program after --")
    device, steps, timeout_s = check_run(device, steps, timeout_s)
    spec = model if isinstance(model, JobSpec) else JobSpec(model=model, **job)
    readings: list[str] = []
    spec = cpu_probe_dtype(spec, device, readings.append)
    if spec.gpu_mem is None and spec.gpu is None:  # as planner probe: the GPU memory the probe plans for
        spec = replace(spec, gpu_mem=PROBE_GPU_MEM.get(device, PROBE_GPU_MEM["cuda"]))
    resolved: ResolvedJob = resolve(spec, db, local=True)  # the program runs here: this machine's host memory
    if resolved.workload.is_rlhf:
        raise InputError("planner probe -- CMD measures single-model programs (sft, reward, dpo); not RLHF yet")
    check_ranks(resolved, device)
    resolved, coef, _ = calibrated(resolved, coefficients, choice=calibration, db=db, target=device_target(device))
    chosen = choose_strategies(resolved, strategies, coef, top=DEFAULT_STRATEGIES)
    if strategies == "recommended":
        chosen = chosen[:DEFAULT_STRATEGIES]
    # lazy on purpose: probes loads torch
    from probes.script.launch import program_fingerprint, run_script_probe
    from probes.script.settings import ScriptProbeSettings

    if on_note is not None:
        for line in readings:
            on_note(line)
    probe_coef = device_coefficients(device, coef)
    runs = []
    for index, strategy in enumerate(chosen):
        assert isinstance(strategy, Strategy)
        prediction = device_prediction(predict(resolved.workload, strategy, resolved.hardware, probe_coef), device)
        warmup = 2 if strategy.zero_stage == 3 else 1
        settings = ScriptProbeSettings.for_strategy(
            strategy,
            resolved.workload,
            resolved.hardware,
            device=device,
            warmup_steps=min(warmup, steps - 1),
            timed_steps=max(steps - warmup, 1),
        )
        if on_progress is not None:
            on_progress(strategy.describe(), index, len(chosen))
        result = (runner or run_script_probe)(list(command), settings, timeout_s)
        runs.append(
            ProgramRun(
                strategy=strategy.to_dict(),
                label=strategy.describe(),
                outcome=result.outcome,
                reason=result.reason,
                message=result.message,
                ran_with=dict(result.ran_with),
                contradictions=tuple(result.contradictions),
                not_applied=tuple(result.not_applied),
                phases=_phases(result.phases, prediction),
                measured_step_s=_median_step(result.step_time_s),
                predicted_step_s=prediction.step_time_s,
                exit_code=result.exit_code,
                log_tail=result.log_tail,
            )
        )
    return ProgramProbeReport(
        command=tuple(command),
        program=program_fingerprint(list(command)),
        device=device,
        runs=tuple(runs),
        readings=tuple(readings) + resolved.readings,
    )
