"""Predicting and choosing: the cost model (pure functions), its coefficients and the search.

Nothing here imports torch, deepspeed or transformers; ``search`` depends only on ``store``. Sub-packages and
modules, each importing only those after it (an import-linter contract in pyproject.toml):

- ``search.choose``: the strategy spaces and the searches over them.
- ``search.calibration``: fitting the named coefficients to what probes measured; ``search.retarget``: a plan's
  rollout engine re-solved for a framework that runs another engine.
- ``search.predictor``: the one entry point of a prediction, whatever the workload.
- ``search.rlhf`` (RLHF workloads: ppo, remax, grpo, with a vLLM or SGLang engine beside the trainer) and
  ``search.single`` (single-model workloads: sft, reward, dpo).
- ``search.rollout`` (vLLM's and SGLang's own memory rules) and ``search.spread`` (a plan's measured spread).
- ``search.step``: a step of phases shared by every workload: live moments -> fragments -> Prediction.
- ``search.streams`` (the step's phases and its allocation stream) and ``search.allocator`` (torch's caching
  allocator, ported, to replay the stream).
- ``search.model``: one trained or frozen model: shapes, states and buffers (placement), activations and
  the moments of its training, its seconds.
- ``search.prediction``, ``search.batches``, ``search.frameworks`` and ``search.coefficients`` at the floor.

The public names are re-exported here.
"""

from search.batches import micro_batches, per_gpu_batch
from search.choose.candidates import Candidate, SearchResult
from search.choose.optimize import exhaustive, screen_search, search
from search.choose.rlhf_search import exhaustive_rlhf, search_rlhf
from search.choose.rollout_space import ROLLOUT_FAMILIES
from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients, describe_coefficients
from search.frameworks import differences as framework_differences
from search.model.activation_sources import formula_reason, variant_sources
from search.model.activation_sources import source as activation_source
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
from search.retarget import Retargeted, for_engine
from search.rlhf.engine_step import trainer_hardware
from search.rlhf.predict import predict_rlhf, screen_rlhf
from search.rollout.engine_accepts import tensor_parallel_refusal
from search.step.replayed import StepTimeline
from store.phases import PHASES

RLHF_PHASES: tuple[str, ...] = PHASES["ppo"]

__all__ = [
    "DEFAULT_COEFFICIENTS",
    "RLHF_PHASES",
    "ROLLOUT_FAMILIES",
    "Candidate",
    "Coefficients",
    "PhasePrediction",
    "Prediction",
    "Retargeted",
    "SearchResult",
    "StepTimeline",
    "activation_source",
    "for_engine",
    "formula_reason",
    "framework_differences",
    "micro_batches",
    "per_gpu_batch",
    "tensor_parallel_refusal",
    "trainer_hardware",
    "variant_sources",
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
