"""The search for every workload kind: single-model kinds to the Optuna study of
:mod:`search.choose.single_search`, RLHF kinds to :mod:`search.choose.rlhf_search` (same arguments), ranked
by the screen, then confirmed by the allocator replay (:mod:`search.choose.confirm`)."""

from __future__ import annotations

from functools import partial

from search.choose.candidates import Candidate, SearchResult
from search.choose.confirm import confirm
from search.choose.engine_inner import engine_bound, fewest_seconds
from search.choose.live_floor import strategy_floor
from search.choose.rlhf_search import exhaustive_rlhf, search_rlhf
from search.choose.rlhf_space import RLHFOuterPoint, batch_choices, cache_choices
from search.choose.rlhf_walk import RLHF_ALTERNATIVES, point_bounds
from search.choose.rollout_space import ROLLOUT_FAMILIES, knob_variants
from search.choose.single_search import exhaustive_single, search_single
from search.choose.single_space import OuterPoint, inner_choices, strategy_at
from search.coefficients import Coefficients
from search.rlhf.predict import predict_rlhf, screen_rlhf
from search.single.predict import predict_single_model, screen_single_model
from search.spread.measured import with_measured_spread
from store.records import Hardware, RLHFStrategy, Strategy, Workload
from store.rollout import RolloutStrategy


def screen_search(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    lora_ranks: tuple[int, ...] = (0,),
    seed: int = 0,
    sampler: str = "auto",
    rollouts: tuple[str, ...] = ROLLOUT_FAMILIES,
    closest: bool = True,
    alternatives: int = RLHF_ALTERNATIVES - 1,
    quantizations: tuple[str, ...] = ("none",),
) -> SearchResult:
    """Rank the strategies a search evaluated by the screen (peak reserved from the fragment coefficients),
    fastest fitting first (seeded: same inputs, same ranking). Arguments as for :func:`search`."""
    if workload.is_rlhf:
        return search_rlhf(
            workload,
            hardware,
            coef,
            lora_ranks=lora_ranks,
            seed=seed,
            sampler=sampler,
            rollouts=rollouts,
            closest=closest,
            alternatives=alternatives,
        )
    return search_single(
        workload, hardware, coef, lora_ranks=lora_ranks, seed=seed, sampler=sampler, quantizations=quantizations
    )


def search(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    lora_ranks: tuple[int, ...] = (0,),
    seed: int = 0,
    sampler: str = "auto",
    rollouts: tuple[str, ...] = ROLLOUT_FAMILIES,
    closest: bool = True,
    alternatives: int = RLHF_ALTERNATIVES - 1,
    quantizations: tuple[str, ...] = ("none",),
    quick: bool = False,
) -> SearchResult:
    """Rank the strategies a search evaluated, fastest fitting first (seeded: same inputs, same plan), every
    prediction replayed through the allocator port: the screen's ranking (:func:`screen_search`) confirmed
    until ``alternatives`` + 1 replayed plans fit (:func:`search.choose.confirm.confirm`).

    ``rollouts``: what may generate an RLHF rollout ("hybrid-engine" for DeepSpeed's own, "vllm", "sglang").
    ``closest`` False (RLHF): when the search's bounds prove that nothing fits, return at once with nothing
    ranked instead of ranking the closest strategies (for a caller that reads only ``best``). ``alternatives``:
    how many fitting strategies after the best to rank (RLHF: the bound walk ranks that many exactly).
    ``quantizations``: the base weights a single-model search tries ("none": 16-bit; "nf4": QLoRA, with LoRA
    ranks above 0 only). ``quick``: the confirmation passes over the points the screen rejects once enough plans
    fit (:func:`search.choose.confirm.confirm`): for a caller that asks whether a change of the job fits."""
    screened = screen_search(
        workload,
        hardware,
        coef,
        lora_ranks=lora_ranks,
        seed=seed,
        sampler=sampler,
        rollouts=rollouts,
        closest=closest,
        alternatives=alternatives,
        quantizations=quantizations,
    )
    if workload.is_rlhf:
        return confirm(
            screened,
            alternatives + 1,
            partial(rlhf_variants, workload, hardware),
            partial(screen_rlhf, workload, hardware=hardware, coef=coef),
            partial(predict_rlhf, workload, hardware=hardware, coef=coef),
            partial(strategy_floor, workload, hardware, coef),
            quick=quick,
            least_seconds=partial(fewest_seconds, workload, hardware, coef),
            point_least=partial(rlhf_point_least, workload, hardware, coef),
            point_budget=partial(replay_budget, workload, hardware, coef),
        )
    return confirm(
        screened,
        alternatives + 1,
        partial(single_variants, workload, hardware),
        partial(screen_single_model, workload, hardware=hardware, coef=coef),
        partial(predict_single_model, workload, hardware=hardware, coef=coef),
        partial(strategy_floor, workload, hardware, coef),
        quick=quick,
        point_budget=partial(replay_budget, workload, hardware, coef),
    )


def replay_budget(workload: Workload, hardware: Hardware, coef: Coefficients, candidate: Candidate) -> int:
    """The usable GPU bytes the replay of every variant of ``candidate``'s outer point is held against: those
    :func:`search.spread.measured.with_measured_spread` sets on its prediction (the measured spread of the
    layout's kind, :func:`search.spread.kinds.kind_of`, which a point's variants share), before any replay."""
    return with_measured_spread(candidate.prediction, workload, candidate.strategy, hardware, coef).gpu_budget_bytes


def single_variants(workload: Workload, hardware: Hardware, strategy: Strategy) -> list[Strategy]:
    """The inner choices of ``strategy``'s outer point, in the search's order (simplest first)."""
    point = OuterPoint(
        strategy.zero_stage,
        strategy.offload_optimizer,
        strategy.offload_param,
        strategy.gradient_checkpointing,
        strategy.lora_rank,
        strategy.quantization,
    )
    return [strategy_at(point, inner) for inner in inner_choices(workload, hardware)]


def rlhf_point_least(workload: Workload, hardware: Hardware, coef: Coefficients, candidate: Candidate) -> float:
    """A lower bound of the replayed score of every variant (:func:`rlhf_variants`) of ``candidate``'s outer point:
    an engine point's least pair bound (:func:`search.choose.engine_inner.engine_bound`, the trainer's live bytes
    and the engine's least, against the budget without a spread), else the bound walk's per-model one
    (:func:`search.choose.rlhf_walk.point_bounds`). Both bound the replay, not only the screen."""
    s = candidate.strategy
    assert isinstance(s, RLHFStrategy)
    rollout = None if s.rollout is None else s.rollout.with_(gpu_memory_utilization=None)
    point = RLHFOuterPoint(s.actor, s.critic, s.reference, s.reward, s.hybrid_engine, rollout)
    if rollout is not None:
        return engine_bound(point, workload, hardware, coef)
    return point_bounds(workload, hardware, coef, [point])[0]


def rlhf_variants(workload: Workload, hardware: Hardware, strategy: RLHFStrategy) -> list[RLHFStrategy]:
    """``strategy`` at every (generation batch, micro-batch, accumulation) x (empty_cache, allocator), in the
    search's order (``batch_choices`` x ``cache_choices``), and with a rollout engine at each of its knob
    variants (:func:`search.choose.rollout_space.knob_variants`): the resolved knobs first, then the others. The
    screen resolves the knobs with its fragments, which may keep a slower knob that frees more memory where the
    replay fits a faster one (issue 42: ``ppo-q7b-h100x8-orlhf``, sleep level 2 at 1.84 s where sleep level 0 with
    expandable segments replays fitting at 1.54 s). The engine keeps the ``gpu_memory_utilization`` the screen
    solved only at the strategy's own batch split; at every other split, and for every other knob variant, the
    replay solves it for that split (issue 42's ``grpo-q3-1.7b-l40sx2-ds``: the utilization solved for mb 4x4 left
    mb 8x2 no room, where the one solved for mb 8x2 fits it at 2.65 s against the plan's 2.74 s)."""
    own = (strategy.generation_batch, strategy.micro_batch, strategy.grad_accum)
    resolved = strategy.rollout
    rollouts: list[RolloutStrategy | None] = [resolved]
    if resolved is not None:
        unsolved = resolved.with_(gpu_memory_utilization=None)
        rollouts += [knobs for knobs in knob_variants(unsolved) if not _same_knobs(knobs, resolved)]

    def engine_at(rollout: RolloutStrategy | None, split: tuple[int, int, int]) -> RolloutStrategy | None:
        if rollout is resolved and rollout is not None and split != own:
            return rollout.with_(gpu_memory_utilization=None)
        return rollout

    s = strategy  # every field but the inner ones kept (the constructor, not dataclasses.replace: 2x cheaper)
    return [
        RLHFStrategy(
            actor=s.actor,
            critic=s.critic,
            reference=s.reference,
            reward=s.reward,
            hybrid_engine=s.hybrid_engine,
            ema=s.ema,
            generation_batch=g,
            micro_batch=m,
            grad_accum=a,
            empty_cache=policy,
            allocator=allocator,
            rollout=engine_at(rollout, (g, m, a)),
        )
        for rollout in rollouts
        for g, m, a in batch_choices(workload, hardware)
        for policy, allocator in cache_choices(rollout)
    ]


def _same_knobs(a: RolloutStrategy, b: RolloutStrategy) -> bool:
    return (a.sleep_level, a.offload_training, a.enforce_eager) == (b.sleep_level, b.offload_training, b.enforce_eager)


def exhaustive(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    lora_ranks: tuple[int, ...] = (0,),
    rollouts: tuple[str, ...] = ROLLOUT_FAMILIES,
    quantizations: tuple[str, ...] = ("none",),
) -> Candidate | None:
    """The fastest strategy the screen says fits, by trying every point of the whole space (for tests of the
    screen search :func:`screen_search`)."""
    if workload.is_rlhf:
        return exhaustive_rlhf(workload, hardware, coef, lora_ranks=lora_ranks, rollouts=rollouts)
    return exhaustive_single(workload, hardware, coef, lora_ranks=lora_ranks, quantizations=quantizations)
