"""One entry point for a prediction, whatever the workload kind."""

from __future__ import annotations

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients
from search.prediction import Prediction
from search.rlhf import predict_rlhf
from search.single_model import predict_single_model
from store.errors import InputError
from store.records import RLHF_WORKLOADS, SINGLE_MODEL_WORKLOADS, Hardware, RLHFStrategy, Strategy, Workload


def predict(
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> Prediction:
    """Predicted memory and time of ``strategy`` for ``workload`` on ``hardware``.

    Single-model kinds (sft, reward, dpo) take a ``Strategy``; RLHF kinds (ppo, remax, grpo) an
    ``RLHFStrategy``. The other shape is an InputError.
    """
    if workload.kind in SINGLE_MODEL_WORKLOADS:
        if not isinstance(strategy, Strategy):
            raise InputError(f"{workload.kind} trains one model: give a single-model strategy, not an RLHF one")
        return predict_single_model(workload, strategy, hardware, coef)
    if workload.kind in RLHF_WORKLOADS:
        if not isinstance(strategy, RLHFStrategy):
            raise InputError(
                f"{workload.kind} is an RLHF workload: give an RLHF strategy (actor/critic/reference/reward blocks)"
            )
        return predict_rlhf(workload, strategy, hardware, coef)
    kinds = ", ".join(SINGLE_MODEL_WORKLOADS + RLHF_WORKLOADS)
    raise InputError(f"workload {workload.kind!r} is not supported; supported: {kinds}")
