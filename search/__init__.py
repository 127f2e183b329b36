"""Predicting and choosing: the cost model (pure functions), its coefficients and the Optuna search.

Nothing here imports torch, deepspeed or transformers; ``search`` depends only on ``store``.
"""

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients, describe_coefficients
from search.optimize import Candidate, SearchResult, exhaustive, search
from search.predict import predict
from search.prediction import PhasePrediction, Prediction

__all__ = [
    "DEFAULT_COEFFICIENTS",
    "Candidate",
    "Coefficients",
    "PhasePrediction",
    "Prediction",
    "SearchResult",
    "describe_coefficients",
    "exhaustive",
    "predict",
    "search",
]
