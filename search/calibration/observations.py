"""One probe as the fit sees it, and the quantities the cost model predicts for it under given values.

A quantity is named by its scope (the phase: ``forward``, ``backward``, ``optimizer_step``, ``generation``,
...) and what was measured there: ``time`` (seconds of the phase per optimizer step), ``peak_allocated``
and ``peak_reserved`` (bytes). On DeepSpeed's CPU accelerator the prediction is the CPU backend's view
(:func:`search.predictor.predict_cpu_backend`): no CUDA context, no caching allocator.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.calibration.parameters import apply_values
from search.coefficients import Coefficients
from search.prediction import Prediction
from search.predictor import cpu_backend_coefficients, predict
from store.records import Hardware, RLHFStrategy, Strategy, Workload

QUANTITIES: tuple[str, ...] = ("time", "peak_allocated", "peak_reserved")
QuantityKey = tuple[str, str]  # (scope, quantity)
STEP = "step"  # the scope of a whole optimizer step (a training loop's row measures no phases)


@dataclass(frozen=True)
class Observation:
    """A probe that finished: the job it ran (cut model included), on which device, and what it measured.

    ``hardware`` carries the GPU whose rates the calibration's values are fractions of: the catalog entry
    of the probed GPU, or for the CPU backend the generic rates (``store.gpus.GENERIC_RATES``).
    """

    label: str  # the probe id, or a record's id
    workload: Workload
    strategy: Strategy | RLHFStrategy
    hardware: Hardware
    device: str  # "cuda" or "cpu"
    measured: tuple[tuple[str, str, float], ...]  # (scope, quantity, value), values > 0

    @property
    def keys(self) -> tuple[QuantityKey, ...]:
        return tuple((scope, quantity) for scope, quantity, _ in self.measured)


def prediction_under(obs: Observation, values: dict[str, float], coef: Coefficients) -> Prediction:
    """The cost model's prediction of the observation's job with ``values`` applied over ``coef``."""
    hardware, coef = apply_values(obs.hardware, coef, values)
    if obs.device == "cpu":
        return predict(obs.workload, obs.strategy, hardware, cpu_backend_coefficients(coef)).on_cpu_backend()
    return predict(obs.workload, obs.strategy, hardware, coef)


def predicted_quantities(obs: Observation, values: dict[str, float], coef: Coefficients) -> dict[QuantityKey, float]:
    """The predicted value of every quantity the observation measured (a phase the model does not have: 0)."""
    prediction = prediction_under(obs, values, coef)
    phases = {phase.name: phase for phase in prediction.phases}
    out: dict[QuantityKey, float] = {}
    for scope, quantity in obs.keys:
        phase = phases.get(scope)
        if scope == STEP:
            step = {"time": prediction.step_time_s, "peak_allocated": prediction.peak_allocated_bytes}
            out[(scope, quantity)] = float(step.get(quantity, prediction.peak_reserved_bytes))
        elif phase is None:
            out[(scope, quantity)] = 0.0
        elif quantity == "time":
            out[(scope, quantity)] = phase.time_s * phase.count
        else:
            out[(scope, quantity)] = float(getattr(phase, f"{quantity}_bytes"))
    return out
