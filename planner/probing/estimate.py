"""How long the probes about to run will take, said before the first of them starts.

A probe's time is a start-up allowance plus its steps at the predicted step time, each warm-up step counted
one and a half times (it pays for the first allocations, lazy inits and, under ZeRO-3, the fetch trace: on a
2-core CPU a warm-up step took 1.0 to 1.2 steady steps, on an H100 ZeRO-3's about two):

    seconds = STARTUP_S[device] + step_time_s * (steps + WARMUP_EXTRA * warm-up steps)

The start-up allowance covers what a probe child does before its first step (:mod:`probes.step.child`): a fresh
process importing torch, transformers and DeepSpeed, joining its process group and building the model and
engines. A tiny model's probe on a 2-core CPU took 15 to 22 s in all, 10 to 14 s of it in ``setup``
(``ProbeResult.wall_s``, ``extra["setup_s"]``).

The step time is the prediction's on the probed device:

- on cuda, the cost model's step time (calibrated to the GPU when a calibration of it is stored);
- on the CPU backend with a calibration of this CPU, the calibrated step time;
- on the CPU backend without one, the GPU time model run on this CPU's own rates, measured in a fraction of a
  second the first time this host probes and kept (:mod:`planner.probing.cpu_rates`: a matrix product in the
  probe's dtype and in fp32, a memory copy). The cost model's times are otherwise a GPU's: a CPU computes two or
  three orders of magnitude slower, and bf16 on a processor without oneDNN bf16 kernels two more. A dtype's
  matrix products count at most ``FAST_DTYPE_GAIN`` times fp32's: the rest of a bf16 step (element-wise kernels,
  conversions, the fp32 master weights) does not speed up with AMX's matrix units. Against real CPU probes
  (OPT-125m sft, 2 layers and 12, batch 4 x 256, ZeRO-0 and ZeRO-3, on a busy 2-core Xeon with AMX) the step time
  came out within 35% in fp32 and within a factor of 2 in bf16; the GPU model's was 100 to 500 times short.

The estimate is rough (a factor of two either way); it is said, never enforced: :func:`cost_note` is one line
when the probes would take minutes, or when one would likely run past its timeout, with what to change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.job.cut import cut_workload
from planner.job.inputs import ResolvedJob
from planner.probing.cpu_rates import cpu_rates
from planner.probing.device import device_coefficients
from planner.probing.plan import PlannedProbe, depth_label
from probes.step.warmup import warmup_steps
from search import Coefficients, Prediction, predict
from store.records import Hardware, RLHFStrategy, Strategy, Workload, strategy_label

STARTUP_S = {"cpu": 20.0, "cuda": 30.0}  # process start, imports, process group, model and engines
WARMUP_EXTRA = 0.5  # a warm-up step costs this much more than a steady one
WARN_TOTAL_S = 120.0  # probes that would take longer than this in all are announced
TIMEOUT_HEADROOM = 1.5  # the --timeout suggested for a probe that would time out: its estimate times this


@dataclass(frozen=True)
class ProbeCost:
    """One probe's estimated seconds (start-up and steps) against its timeout."""

    label: str
    step_time_s: float
    seconds: float
    timeout_s: float

    @property
    def likely_timeout(self) -> bool:
        return self.seconds > self.timeout_s


def probe_seconds(step_time_s: float, steps: int, warmup: int, device: str) -> float:
    """The start-up allowance plus ``steps`` steps, the ``warmup`` warm-up steps among them counted 1.5 times."""
    return STARTUP_S.get(device, STARTUP_S["cuda"]) + step_time_s * (steps + WARMUP_EXTRA * warmup)


def cpu_hardware(hardware: Hardware, dtype: str) -> Hardware:
    """The job's hardware with its GPU's rates replaced by this CPU's (:func:`cpu_rates`): every matrix product at
    the measured rate, element-wise work, copies and collectives at the measured memory bandwidth."""
    flops_per_s, bytes_per_s = cpu_rates(dtype)
    tflops, gbps = flops_per_s / 1e12, bytes_per_s / 1e9
    gpu = replace(
        hardware.gpu,
        bf16_tflops=tflops,
        fp16_tflops=tflops,
        fp32_tflops=tflops,
        hbm_gbps=gbps,
        pcie_gbps=gbps,
        interconnect_gbps=gbps,
        matmul_efficiency=1.0,
        matmul_half_dim=16.0,
        hbm_efficiency=1.0,
        pcie_efficiency=1.0,
        kernel_floor_s=2e-6,
    )
    return replace(hardware, gpu=gpu)


def device_step_time(
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    prediction: Prediction,
    *,
    device: str,
    layers: int | None,
    coef: Coefficients,
    timed: bool,
) -> float:
    """A probe's predicted step time on its device: ``prediction``'s on cuda or on a CPU the coefficients were
    calibrated to (``timed``), else the cost model's on this CPU's rates (the module docstring)."""
    if device != "cpu" or timed:
        return prediction.step_time_s
    cut = cut_workload(workload, layers)
    on_cpu = predict(cut, strategy, cpu_hardware(hardware, cut.dtype), device_coefficients(device, coef))
    return on_cpu.step_time_s


def probe_cost(
    label: str,
    strategy: Strategy | RLHFStrategy,
    step_time_s: float,
    *,
    steps: int,
    device: str,
    timeout_s: float,
) -> ProbeCost:
    """The estimate of one probe of ``strategy`` at ``step_time_s`` a step."""
    warmup, _ = warmup_steps(strategy, steps)
    return ProbeCost(label, step_time_s, probe_seconds(step_time_s, steps, warmup, device), timeout_s)


def duration(seconds: float) -> str:
    """``45 s``, ``14 min``, ``2.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cost_note(costs: Sequence[ProbeCost], *, device: str, timed: bool, less: str, up_to: bool = False) -> str | None:
    """One line before the probes when they would take more than WARN_TOTAL_S in all, or one would likely run past
    its timeout: how many, the estimated time, and what to change (``less``: the options that probe less, as the
    command names them); None otherwise. ``up_to``: at most these probes run (a tune)."""
    if not costs:
        return None
    total = sum(c.seconds for c in costs)
    late = [c for c in costs if c.likely_timeout]
    if total <= WARN_TOTAL_S and not late:
        return None
    count = f"{'up to ' if up_to else ''}{len(costs)} probe{'s' if len(costs) != 1 else ''}"
    where = "the predicted step times"
    if device == "cpu":
        where = "this CPU's calibration" if timed else "this CPU's measured rates"
    startup = STARTUP_S.get(device, STARTUP_S["cuda"])
    line = (
        f"estimate: {count} to run, about {duration(total)} ({duration(startup)} start-up each, then its steps at "
        f"{where}; rough, within 2x)"
    )
    if not late:
        return line + "; Ctrl-C stops, and the same command run again resumes"
    longest = max(late, key=lambda c: c.seconds)
    suggested = min(86_400, 60 * math.ceil(longest.seconds * TIMEOUT_HEADROOM / 60))
    which = "it" if len(costs) == 1 else f"{len(late)} of them"
    return (
        f"{line}; {which} will likely time out ({longest.label}: about {duration(longest.seconds)}, --timeout "
        f"{longest.timeout_s:g} s): give --timeout {suggested}, or probe less ({less})"
    )


def planned_costs(
    job: ResolvedJob, planned: Sequence[PlannedProbe], *, device: str, steps: int, coef: Coefficients, timed: bool
) -> list[ProbeCost]:
    """The estimate of each planned probe of ``job`` (the job the probes run), predicted with ``coef``."""
    costs = []
    for item in planned:
        step = device_step_time(
            job.workload,
            item.strategy,
            job.hardware,
            item.prediction,
            device=device,
            layers=item.layers,
            coef=coef,
            timed=timed,
        )
        label = strategy_label(item.strategy, job.workload) + depth_label(item.layers)
        costs.append(
            probe_cost(label, item.strategy, step, steps=steps, device=device, timeout_s=item.request.timeout_s)
        )
    return costs
