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
from store.framework_placement import frozen_block_as_run
from store.frameworks import reference_through_actor
from store.records import Hardware, RLHFStrategy, Workload


def rlhf_step(workload: Workload, strategy: RLHFStrategy, hardware: Hardware, coef: Coefficients) -> Step:
    """Validate, then build (from cached pieces) the policy-independent part of a prediction: one Step for
    every ``empty_cache`` policy and allocator of a strategy, built once for all of them (a search screens
    each of a point's variants: ten cache choices of each batch split share one step)."""
    if strategy.empty_cache != "never" or strategy.allocator != "default":
        strategy = replace(strategy, empty_cache="never", allocator="default")
    return _policy_free_step(workload, strategy, hardware, coef)


@lru_cache(maxsize=4096)
def _policy_free_step(workload: Workload, strategy: RLHFStrategy, hardware: Hardware, coef: Coefficients) -> Step:
    strategy, notes = frozen_as_run(workload, strategy)
    if isinstance(strategy, RLHFStrategy) and strategy.rollout is not None:
        step = engine_step(workload, strategy, hardware, coef)
    else:
        ctx = rlhf_context(workload, hardware, coef)
        check_rlhf_strategy(workload, strategy, ctx.job)
        step = step_of(ctx, strategy)
    return replace(step, notes=step.notes + notes) if notes else step


def frozen_as_run(workload: Workload, strategy: RLHFStrategy) -> tuple[RLHFStrategy, tuple[str, ...]]:
    """``strategy`` with its frozen models' blocks as ``workload.framework`` builds them
    (:func:`store.framework_placement.frozen_block_as_run`: OpenRLHF 0.11.2 ``get_ds_eval_config``, TRL
    ``prepare_deepspeed``, DeepSpeed-Chat ``_init_ref``/``_init_reward``), and a note for each block it remaps: a
    plan given under ``--framework`` is predicted as that program runs it, not as written."""
    held = {"reference": workload.holds_reference, "reward": workload.holds_reward_model}
    notes: list[str] = []
    for role in ("reference", "reward"):
        block = strategy.reference if role == "reference" else strategy.reward
        if not held[role] or (
            role == "reference"
            and reference_through_actor(
                workload.framework, workload.kind, workload.holds_reference, strategy.actor.lora_rank
            )
        ):
            continue
        run = frozen_block_as_run(workload.framework, role, block, strategy.actor, strategy.critic)
        if run is None:
            continue
        notes.append(
            f"{role}: --framework {workload.framework} builds it at ZeRO-{run.zero_stage}"
            f"{' offloaded to the ' + run.offload if run.offload != 'none' else ''}, not ZeRO-{block.zero_stage}"
            f"{' offloaded' if block.offload != 'none' else ''} as given: predicted as it runs"
        )
        strategy = replace(strategy, reference=run) if role == "reference" else replace(strategy, reward=run)
    return strategy, tuple(notes)


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
