"""The typed blocks of a prediction, read from search's record of it (no I/O, nothing computed)."""

from __future__ import annotations

from planner.report.results import Alternative, Predicted
from planner.report.strategy_record import PlanStrategy
from search import Prediction
from store.records import RLHFStrategy, Strategy


def predicted_block(prediction: Prediction) -> Predicted:
    """The ``predicted`` block of the JSON document."""
    return Predicted.model_validate(prediction.to_dict())


def alternative(strategy: Strategy | RLHFStrategy, prediction: Prediction) -> Alternative:
    """Another strategy with its prediction, as a plan lists it."""
    return Alternative(strategy=PlanStrategy(strategy.to_dict()), predicted=predicted_block(prediction))
