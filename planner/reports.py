"""Building the typed results from records and predictions (no I/O)."""

from __future__ import annotations

from planner.inputs import ResolvedJob
from planner.results import Alternative, Predicted, PredictionReport
from probes.ds_config import outside_settings, render_ds_config
from search import Prediction
from store.records import Strategy


def predicted_block(prediction: Prediction) -> Predicted:
    """The ``predicted`` block of the JSON document."""
    return Predicted.model_validate(prediction.to_dict())


def alternative(strategy: Strategy, prediction: Prediction) -> Alternative:
    return Alternative(strategy=strategy.to_dict(), predicted=predicted_block(prediction))


def prediction_report(job: ResolvedJob, strategy: Strategy, prediction: Prediction) -> PredictionReport:
    """Workload, hardware, strategy, prediction and the DeepSpeed config that runs it."""
    workload = job.workload.to_dict()
    workload["params"] = job.workload.model.total_params
    return PredictionReport(
        workload=workload,
        hardware=job.hardware.to_dict(),
        strategy=strategy.to_dict(),
        fits=prediction.fits,
        predicted=predicted_block(prediction),
        ds_config=render_ds_config(strategy, job.workload, job.hardware),
        outside_settings=outside_settings(strategy),
        readings=list(job.readings),
    )
