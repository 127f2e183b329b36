"""The Optuna search: least predicted step time such that peak reserved and host memory fit.

A study samples the outer knobs (see ``search.space``, ``search.rlhf_space``); each trial resolves the inner
knobs exactly and reports the predicted step time, or a penalty above every feasible time when nothing fits
(so that, among infeasible points, the one that overflows least ranks first). The sampler is seeded: the
same inputs always give the same plan. Small spaces are walked by Optuna's grid sampler (every point once,
so it cannot miss the optimum); larger ones use seeded multivariate TPE with a trial budget.

``search`` and ``exhaustive`` serve every workload kind: RLHF kinds go to ``search.rlhf_search``
(``search_rlhf``, ``exhaustive_rlhf``), whose candidates hold an ``RLHFStrategy``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from search.coefficients import Coefficients
from search.prediction import Prediction
from search.single_model import predict_single_model
from search.space import OuterPoint, inner_choices, outer_points, strategy_at
from store.records import Hardware, RLHFStrategy, Strategy, Workload

INFEASIBLE_PENALTY_S = 1e6
GRID_LIMIT = 64
TPE_TRIALS = 48


@dataclass(frozen=True)
class Candidate:
    """A strategy (single-model or RLHF) with its prediction."""

    strategy: Strategy | RLHFStrategy
    prediction: Prediction

    @property
    def score(self) -> float:
        """Step time when it fits; otherwise a penalty growing with the overflow."""
        p = self.prediction
        return penalized_score(
            p.step_time_s, p.peak_reserved_bytes, p.gpu_budget_bytes, p.host_bytes, p.host_budget_bytes
        )

    @property
    def rank_key(self) -> tuple[float, int]:
        """Order of preference: the score, then (equal times) the lower peak reserved."""
        return (self.score, self.prediction.peak_reserved_bytes)


def penalized_score(step_time: float, reserved: int, gpu_budget: int, host: int, host_budget: int) -> float:
    """Step time when GPU and host memory fit; otherwise a penalty growing with the overflow (GiB)."""
    if reserved <= gpu_budget and host <= host_budget:
        return step_time
    overflow = max(0, reserved - gpu_budget) + max(0, host - host_budget)
    return INFEASIBLE_PENALTY_S + overflow / 2**30


@dataclass(frozen=True)
class SearchResult:
    """What a search found: every evaluated outer point's best candidate, best first."""

    ranked: tuple[Candidate, ...]
    trials: int
    sampler: str
    fastest_ignoring_memory: Candidate | None = None

    @property
    def best(self) -> Candidate | None:
        """The fastest strategy that fits, or None."""
        return self.ranked[0] if self.ranked and self.ranked[0].prediction.fits else None

    @property
    def feasible(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.ranked if c.prediction.fits)


def best_inner(point: OuterPoint, workload: Workload, hardware: Hardware, coef: Coefficients) -> Candidate:
    """The fastest (micro-batch, empty_cache, allocator) of an outer point that fits; else the least overflow."""
    options = [
        Candidate(s, predict_single_model(workload, s, hardware, coef))
        for s in (strategy_at(point, inner) for inner in inner_choices(workload, hardware))
    ]
    return min(options, key=lambda c: c.score)  # min keeps the first of equals: the simpler setting


def search(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    lora_ranks: tuple[int, ...] = (0,),
    seed: int = 0,
    sampler: str = "auto",
) -> SearchResult:
    """Run the Optuna study over the outer knobs and rank what it evaluated (fastest fitting first).

    RLHF workloads are searched by ``search_rlhf`` (same arguments).
    """
    if workload.is_rlhf:
        from search.rlhf_search import search_rlhf  # it builds on this module's records

        return search_rlhf(workload, hardware, coef, lora_ranks=lora_ranks, seed=seed, sampler=sampler)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    points = list(outer_points(workload, hardware, lora_ranks))
    by_key = {_key(p): p for p in points}
    if sampler == "auto":
        sampler = "grid" if len(points) <= GRID_LIMIT else "tpe"
    layouts = list(dict.fromkeys(_layout(p) for p in points))
    loras = list(dict.fromkeys(p.lora_rank for p in points))
    evaluated: dict[tuple, Candidate] = {}

    def objective(trial: optuna.Trial) -> float:
        layout = trial.suggest_categorical("layout", layouts)
        ckpt = trial.suggest_categorical("gradient_checkpointing", [False, True])
        lora = trial.suggest_categorical("lora_rank", loras)
        key = (*_parse_layout(layout), ckpt, lora)
        if key not in evaluated:
            evaluated[key] = best_inner(by_key[key], workload, hardware, coef)
        candidate = evaluated[key]
        trial.set_user_attr("fits", candidate.prediction.fits)
        return candidate.score

    grid = {"layout": layouts, "gradient_checkpointing": [False, True], "lora_rank": loras}
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
            n_trials=len(points) if sampler == "grid" else TPE_TRIALS,
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
        candidate = Candidate(strategy, predict_single_model(workload, strategy, hardware, coef))
        if fastest is None or candidate.prediction.step_time_s < fastest.prediction.step_time_s:
            fastest = candidate
    return fastest


def exhaustive(
    workload: Workload, hardware: Hardware, coef: Coefficients, *, lora_ranks: tuple[int, ...] = (0,)
) -> Candidate | None:
    """The fastest fitting strategy by trying every point of the whole space (for tests and checks)."""
    if workload.is_rlhf:
        from search.rlhf_search import exhaustive_rlhf

        return exhaustive_rlhf(workload, hardware, coef, lora_ranks=lora_ranks)
    from search.space import all_strategies

    best: Candidate | None = None
    for strategy in all_strategies(workload, hardware, lora_ranks):
        candidate = Candidate(strategy, predict_single_model(workload, strategy, hardware, coef))
        if candidate.prediction.fits and (best is None or candidate.rank_key < best.rank_key):
            best = candidate
    return best


def _key(p: OuterPoint) -> tuple:
    return (p.zero_stage, p.offload_optimizer, p.offload_param, p.gradient_checkpointing, p.lora_rank)


def _layout(p: OuterPoint) -> str:
    """The memory layout of a point as one categorical value: ``z3/cpu/cpu`` (stage/optimizer/params)."""
    return f"z{p.zero_stage}/{p.offload_optimizer}/{p.offload_param}"


def _parse_layout(layout: str) -> tuple[int, str, str]:
    stage, off_opt, off_param = layout.split("/")
    return int(stage[1:]), off_opt, off_param
