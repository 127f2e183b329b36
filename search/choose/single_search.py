"""The Optuna search over single-model strategies: least predicted step time such that memory fits.

A study samples the outer knobs (:mod:`search.choose.single_space`); each trial resolves the inner knobs
exactly and reports the candidate's score (:mod:`search.choose.candidates`). The sampler is seeded: the same
inputs always give the same plan. Small spaces are walked by Optuna's grid sampler (every point once, so it
cannot miss the optimum); larger ones use seeded multivariate TPE with a trial budget.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from search.choose.candidates import Candidate, SearchResult
from search.choose.single_space import OuterPoint, all_strategies, inner_choices, outer_points, strategy_at
from search.coefficients import Coefficients
from search.single.predict import screen_single_model
from store.records import Hardware, Workload

if TYPE_CHECKING:
    import optuna

GRID_LIMIT = 64
TPE_TRIALS = 48


def best_inner(point: OuterPoint, workload: Workload, hardware: Hardware, coef: Coefficients) -> Candidate:
    """The fastest (micro-batch, empty_cache, allocator) of an outer point that fits; else the least overflow."""
    options = [
        Candidate(s, screen_single_model(workload, s, hardware, coef))
        for s in (strategy_at(point, inner) for inner in inner_choices(workload, hardware))
    ]
    return min(options, key=lambda c: c.score)  # min keeps the first of equals: the simpler setting


def search_single(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    lora_ranks: tuple[int, ...] = (0,),
    seed: int = 0,
    sampler: str = "auto",
    quantizations: tuple[str, ...] = ("none",),
) -> SearchResult:
    """Run the Optuna study over the outer knobs and rank what it evaluated (fastest fitting first)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    points = list(outer_points(workload, hardware, lora_ranks, quantizations))
    by_key = {_key(p): p for p in points}
    if sampler == "auto":
        sampler = "grid" if len(points) <= GRID_LIMIT else "tpe"
    layouts = list(dict.fromkeys(_layout(p) for p in points))
    loras = list(dict.fromkeys(p.lora_rank for p in points))
    bases = list(dict.fromkeys(p.quantization for p in points)) or ["none"]  # the base weights the points hold
    evaluated: dict[tuple[Any, ...], Candidate] = {}

    def objective(trial: optuna.Trial) -> float:
        layout = trial.suggest_categorical("layout", layouts)
        ckpt = trial.suggest_categorical("gradient_checkpointing", [False, True])
        lora = trial.suggest_categorical("lora_rank", loras)
        quantized = trial.suggest_categorical("quantization", bases) if len(bases) > 1 else bases[0]
        key = (*_parse_layout(layout), ckpt, lora, quantized)
        if key not in by_key:  # a grid corner no point has (QLoRA under ZeRO-3, or without LoRA)
            trial.set_user_attr("fits", False)
            return float("inf")
        if key not in evaluated:
            evaluated[key] = best_inner(by_key[key], workload, hardware, coef)
        candidate = evaluated[key]
        trial.set_user_attr("fits", candidate.prediction.fits)
        return candidate.score

    grid: dict[str, list[Any]] = {"layout": layouts, "gradient_checkpointing": [False, True], "lora_rank": loras}
    if len(bases) > 1:
        grid["quantization"] = bases
    grid_size = len(layouts) * 2 * len(loras) * len(bases)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if sampler == "grid":
            study_sampler: optuna.samplers.BaseSampler = optuna.samplers.GridSampler(grid, seed=seed)
        else:
            study_sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True)
        study = optuna.create_study(direction="minimize", sampler=study_sampler)

        def stop_when_all_seen(study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
            if len(evaluated) == len(points):
                study.stop()

        study.optimize(
            objective,
            n_trials=grid_size if sampler == "grid" else TPE_TRIALS,
            callbacks=[stop_when_all_seen],
        )
    order = {_key(p): i for i, p in enumerate(points)}
    # equal times: the one with more headroom first, then the simpler (earlier) layout
    ranked = sorted(evaluated.items(), key=lambda kv: (*kv[1].rank_key, order[kv[0]]))
    return SearchResult(
        ranked=tuple(c for _, c in ranked),
        trials=len(study.trials),
        sampler=sampler,
        fastest_ignoring_memory=fastest_ignoring_memory(points, workload, hardware, coef),
    )


def fastest_ignoring_memory(
    points: list[OuterPoint], workload: Workload, hardware: Hardware, coef: Coefficients
) -> Candidate | None:
    """The fastest strategy if memory were unlimited: the yardstick for a plan's time overhead."""
    fastest: Candidate | None = None
    for point in points:
        strategy = strategy_at(point, inner_choices(workload, hardware)[0])  # largest micro-batch, no extras
        candidate = Candidate(strategy, screen_single_model(workload, strategy, hardware, coef))
        if fastest is None or candidate.prediction.step_time_s < fastest.prediction.step_time_s:
            fastest = candidate
    return fastest


def exhaustive_single(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    lora_ranks: tuple[int, ...] = (0,),
    quantizations: tuple[str, ...] = ("none",),
) -> Candidate | None:
    """The fastest fitting strategy by trying every point of the whole space (for tests and checks)."""
    best: Candidate | None = None
    for strategy in all_strategies(workload, hardware, lora_ranks, quantizations):
        candidate = Candidate(strategy, screen_single_model(workload, strategy, hardware, coef))
        if candidate.prediction.fits and (best is None or candidate.rank_key < best.rank_key):
            best = candidate
    return best


def _key(p: OuterPoint) -> tuple[Any, ...]:
    return (p.zero_stage, p.offload_optimizer, p.offload_param, p.gradient_checkpointing, p.lora_rank, p.quantization)


def _layout(p: OuterPoint) -> str:
    """The memory layout of a point as one categorical value: ``z3/cpu/cpu`` (stage/optimizer/params)."""
    return f"z{p.zero_stage}/{p.offload_optimizer}/{p.offload_param}"


def _parse_layout(layout: str) -> tuple[int, str, str]:
    stage, off_opt, off_param = layout.split("/")
    return int(stage[1:]), off_opt, off_param
