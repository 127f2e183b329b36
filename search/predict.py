"""One entry point for a prediction, whatever the workload kind."""

from __future__ import annotations

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients
from search.prediction import Prediction
from search.single_model import predict_single_model
from store.errors import InputError
from store.records import SINGLE_MODEL_WORKLOADS, Hardware, Strategy, Workload


def predict(
    workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients = DEFAULT_COEFFICIENTS
) -> Prediction:
    """Predicted memory and time of ``strategy`` for ``workload`` on ``hardware``."""
    if workload.kind in SINGLE_MODEL_WORKLOADS:
        return predict_single_model(workload, strategy, hardware, coef)
    raise InputError(f"workload {workload.kind!r} is not supported yet; supported: {', '.join(SINGLE_MODEL_WORKLOADS)}")
