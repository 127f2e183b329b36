"""An RLHF step, whoever generates its rollout: DeepSpeed (:mod:`search.rlhf.step`) or a vLLM/SGLang engine
(:mod:`search.rlhf.engine_step`); and its prediction."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from search.coefficients import Coefficients
from search.prediction import Prediction
from search.rlhf.engine_step import engine_step
from search.rlhf.job import check_rlhf_strategy, rlhf_context
from search.rlhf.step import step_of
from search.spread.measured import with_measured_spread
from search.step.assemble import Step, screen_step
from search.step.finish import finish_step
from store.records import Hardware, RLHFStrategy, Workload


def rlhf_step(workload: Workload, strategy: RLHFStrategy, hardware: Hardware, coef: Coefficients) -> Step:
    """Validate, then build (from cached pieces) the policy-independent part of a prediction: one Step for
    every ``empty_cache`` policy and allocator of a strategy."""
    if strategy.empty_cache != "never" or strategy.allocator != "default":
        strategy = replace(strategy, empty_cache="never", allocator="default")
    if isinstance(strategy, RLHFStrategy) and strategy.rollout is not None:
        return engine_step(workload, strategy, hardware, coef)
    ctx = rlhf_context(workload, hardware, coef)
    check_rlhf_strategy(workload, strategy, ctx.job)
    return step_of(ctx, strategy)


@lru_cache(maxsize=4096)  # a search's confirmation and the report ask for the same plan again
def predict_rlhf(workload: Workload, strategy: RLHFStrategy, hardware: Hardware, coef: Coefficients) -> Prediction:
    """Predicted peak memory per GPU, host memory per node and step time of an RLHF strategy.

    Phases ``generation``, ``scoring``, ``actor_training`` and (PPO) ``critic_training``; the breakdown is
    that of the peak phase's peak moment and sums to its peak reserved bytes, which come from the allocator
    replay of the step (:func:`search.step.finish.finish_step`). InputError for a strategy that
    does not fit the workload (a critic block for remax/grpo or none for ppo, batches that do not divide).
    """
    step = rlhf_step(workload, strategy, hardware, coef)
    prediction = finish_step(step, strategy.empty_cache, strategy.allocator, hardware, coef)
    return with_measured_spread(prediction, workload, strategy, hardware, coef)


def screen_rlhf(workload: Workload, strategy: RLHFStrategy, hardware: Hardware, coef: Coefficients) -> Prediction:
    """The search's screen of an RLHF strategy: as :func:`predict_rlhf`, peak reserved from the fragment
    coefficients (:func:`search.step.assemble.screen_step`)."""
    step = rlhf_step(workload, strategy, hardware, coef)
    return screen_step(step, strategy.empty_cache, strategy.allocator, hardware, coef)
