"""Predicting and choosing: the cost model (pure functions), its coefficients and the Optuna search.

Nothing here imports torch, deepspeed or transformers; ``search`` depends only on ``store``.
"""

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients, describe_coefficients
from search.optimize import Candidate, SearchResult, exhaustive, search
from search.predict import cpu_backend_coefficients, predict, predict_cpu_allocated, predict_cpu_backend
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
    "cpu_backend_coefficients",
    "describe_coefficients",
    "exhaustive",
    "exhaustive_rlhf",
    "predict",
    "predict_cpu_allocated",
    "predict_cpu_backend",
    "predict_rlhf",
    "search",
    "search_rlhf",
]
