"""Predicting and choosing: the cost model (pure functions), its coefficients and the Optuna search.

Nothing here imports torch, deepspeed or transformers; ``search`` depends only on ``store``.
"""

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients, describe_coefficients
from search.optimize import Candidate, SearchResult, exhaustive, search
from search.predict import predict
from search.prediction import PhasePrediction, Prediction
from search.rlhf import predict_rlhf
from search.rlhf_memory import RLHF_PHASES
from search.rlhf_search import exhaustive_rlhf, search_rlhf

__all__ = [
    "DEFAULT_COEFFICIENTS",
    "RLHF_PHASES",
    "Candidate",
    "Coefficients",
    "PhasePrediction",
    "Prediction",
    "SearchResult",
    "describe_coefficients",
    "exhaustive",
    "exhaustive_rlhf",
    "predict",
    "predict_rlhf",
    "search",
    "search_rlhf",
]
