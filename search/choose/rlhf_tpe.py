"""The seeded Optuna TPE study over an RLHF step's outer knobs (``search_rlhf(..., sampler="tpe")``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from search.choose.candidates import Candidate
from search.choose.rlhf_space import RLHFOuterPoint
from search.choose.rollout_space import generation_name
from store.records import FrozenModelStrategy, Hardware, TrainedModelStrategy, Workload


def trained_name(layout: TrainedModelStrategy) -> str:
    return f"z{layout.zero_stage}/{layout.offload_optimizer}/{layout.offload_param}"


def frozen_name(block: FrozenModelStrategy) -> str:
    return f"z{block.zero_stage}/{block.offload}"


def rlhf_key(p: RLHFOuterPoint) -> tuple[Any, ...]:
    critic = (None, None) if p.critic is None else (trained_name(p.critic), p.critic.gradient_checkpointing)
    return (
        trained_name(p.actor),
        p.actor.gradient_checkpointing,
        *critic,
        frozen_name(p.reference),
        frozen_name(p.reward),
        p.hybrid_engine,
        p.actor.lora_rank,
        generation_name(p.hybrid_engine, p.rollout),
    )


def tpe_rlhf(
    workload: Workload,
    hardware: Hardware,
    resolve: Callable[[RLHFOuterPoint], Candidate],
    by_key: dict[tuple[Any, ...], RLHFOuterPoint],
    evaluated: dict[tuple[Any, ...], Candidate],
    *,
    seed: int,
    n_trials: int,
) -> int:
    """A seeded multivariate TPE study over the outer knobs; fills ``evaluated``, returns the trial count."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    points = list(by_key.values())
    layouts = list(dict.fromkeys(trained_name(p.actor) for p in points))
    # a frozen model the workload does not hold (KL 0, rule-based rewards) has one block in the points
    references = list(dict.fromkeys(frozen_name(p.reference) for p in points))
    rewards = list(dict.fromkeys(frozen_name(p.reward) for p in points))
    space: dict[str, list[Any]] = {"actor": layouts, "actor_checkpointing": [False, True]}
    if workload.has_critic:
        space.update(critic=layouts, critic_checkpointing=[False, True])
    ranks = list(dict.fromkeys(p.actor.lora_rank for p in points))
    generations = list(dict.fromkeys(generation_name(p.hybrid_engine, p.rollout) for p in points))
    space.update(reference=references, reward=rewards, generation=generations, lora_rank=ranks)

    def objective(trial: optuna.Trial) -> float:
        values = {name: trial.suggest_categorical(name, choices) for name, choices in space.items()}
        key = (
            values["actor"],
            values["actor_checkpointing"],
            values.get("critic"),
            values.get("critic_checkpointing"),
            values["reference"],
            values["reward"],
            values["generation"] in ("hybrid-engine",),
            values["lora_rank"],
            values["generation"],
        )
        if key not in evaluated:
            evaluated[key] = resolve(by_key[key])
        candidate = evaluated[key]
        trial.set_user_attr("fits", candidate.prediction.fits)
        return candidate.score

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(
            direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True)
        )

        def stop_when_all_seen(study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
            if len(evaluated) == len(points):
                study.stop()

        study.optimize(objective, n_trials=min(n_trials, len(points)), callbacks=[stop_when_all_seen])
    return len(study.trials)
