"""Predicting and choosing: the cost model (pure functions), its coefficients and the search.

Nothing here imports torch, deepspeed or transformers; ``search`` depends only on ``store``. Sub-packages,
each depending only on those above it:

- ``search.model``: one trained or frozen model: shapes, states and buffers (placement), activations and
  the moments of its training, its seconds.
- ``search.step``: a step of phases shared by every workload: live moments -> fragments -> Prediction.
- ``search.single``: single-model workloads (sft, reward, dpo).
- ``search.rlhf``: RLHF workloads (ppo, remax, grpo).
- ``search.choose``: the strategy spaces and the searches over them.

``search.predictor`` is the one entry point of a prediction; the public names are re-exported here.
"""

from search.choose.candidates import Candidate, SearchResult
from search.choose.optimize import exhaustive, screen_search, search
from search.choose.rlhf_search import exhaustive_rlhf, search_rlhf
from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients, describe_coefficients
from search.prediction import PhasePrediction, Prediction
from search.predictor import (
    cpu_backend_coefficients,
    predict,
    predict_cpu_allocated,
    predict_cpu_backend,
    replay_memory,
    replay_timeline,
    screen,
)
from search.rlhf.predict import predict_rlhf, screen_rlhf
from store.phases import PHASES

RLHF_PHASES: tuple[str, ...] = PHASES["ppo"]

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
    "screen_rlhf",
    "screen",
    "replay_memory",
    "replay_timeline",
    "screen_search",
    "search",
    "search_rlhf",
]
