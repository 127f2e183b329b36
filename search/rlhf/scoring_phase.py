"""The scoring phase of an RLHF step: each scoring model's no-grad forwards over the generated sequences, and the
half-step record both halves of a step are (:class:`StepHalf`).

Which models score and how (DeepSpeed-Chat's one forward per generate call, or TRL's micro-batches through its
fused head) is :mod:`search.rlhf.scoring`; this module turns that into the phase's moments, sizes and seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search.model.placement import FrozenPlacement, TrainedPlacement
from search.rlhf.job import RLHFContext
from search.rlhf.memory import forward_live
from search.rlhf.models import Models
from search.rlhf.scoring import scorers, scoring_chunks, scoring_head
from search.rlhf.timing import frozen_forward_time, gae_seconds, trained_forward_time
from search.streams.phases import INFERENCE, Live, StepPhase, frozen_factor, trained_factor
from search.streams.phases import live as moment_of
from search.streams.sizes import Sizes, inference_sizes, sizes_of
from store.workload_kinds import traits


@dataclass(frozen=True, eq=False)
class StepHalf:
    """The inference half (generation, scoring) or the training half (actor and critic) of a step."""

    phases: tuple[StepPhase, ...]
    time: dict[str, float]  # seconds per step by activity
    role_time: dict[str, float]  # the same seconds by model
    live: int  # the most bytes any of its phases adds to the resident ones


def half_of(phases: list[StepPhase], time: dict[str, float], role_time: dict[str, float]) -> StepHalf:
    return StepHalf(tuple(phases), time, role_time, max(phase.live for phase in phases))


@lru_cache(maxsize=4096)
def scoring_forward(
    ctx: RLHFContext, model: TrainedPlacement | FrozenPlacement, generation_batch: int, micro_batch: int
) -> tuple[Live, float, float]:
    """(live bytes, seconds per step, fragmentation factor) of one model's scoring forwards: one per generate
    call, or TRL's, ``micro_batch`` sequences each through its fused head (:mod:`search.rlhf.scoring`)."""
    w, hw, coef, job = ctx.workload, ctx.hardware, ctx.coef, ctx.job
    batch, forwards = scoring_chunks(ctx, generation_batch, micro_batch)
    if isinstance(model, TrainedPlacement):
        gathered = model.states.zero3_gathered // 2  # parameters of the live module, no gradients
        seconds = trained_forward_time(model, batch, job.seq_len, w.dtype, hw, coef)
        factor = trained_factor(model, coef, training=False)
    else:
        gathered = model.gathered
        seconds = frozen_forward_time(model, batch, job.seq_len, w.dtype, hw, coef)
        factor = frozen_factor(model, coef)
    head = scoring_head(ctx, model, batch)
    live = forward_live(
        model.model,
        model.lm_head,
        gathered=gathered,
        sequences=batch,
        seq_len=job.seq_len,
        dtype=w.dtype,
        attn_impl=w.attn_impl,
        coef=coef,
        fused_head=None if head is None else head.forward,
    )
    return live, forwards * seconds, factor


def live_of_nothing() -> Live:
    """A moment that holds no bytes (a scoring phase in which no model runs)."""
    return moment_of(transient=0)


def scoring_sizes(
    ctx: RLHFContext, model: TrainedPlacement | FrozenPlacement, generation_batch: int, micro_batch: int
) -> Sizes:
    """The tensor sizes of one model's scoring forward: the logits (and their fp32 upcast), or TRL's fused head's
    hidden copy, tile and fp32 vectors in their place."""
    w, job = ctx.workload, ctx.job
    batch, _ = scoring_chunks(ctx, generation_batch, micro_batch)
    head = scoring_head(ctx, model, batch)
    logit_tokens = job.seq_len if model.lm_head and head is None else 0
    sizes = inference_sizes(model.model, batch, job.seq_len, w.dtype, w.attn_impl, ctx.coef, logit_tokens)
    if head is None:
        return sizes
    kept = tuple(pair for pair in sizes if pair[0] != "logits")
    return kept + sizes_of(logits=(head.hidden_copy, head.tile, head.vectors))


@lru_cache(maxsize=16384)
def scoring_half(
    ctx: RLHFContext,
    models: Models,
    generation_batch: int,
    generate_calls: int,
    micro_batch: int,
    grad_accum: int,
    rollout_engine: bool,
) -> StepHalf:
    """The scoring forwards of the step's generated sequences (:func:`search.rlhf.scoring.scorers`: which models
    score, and TRL's micro-batches of ``micro_batch`` sequences), and the per-call overhead of ``generate_calls``
    generate calls (the generation phase itself is the caller's). ``grad_accum`` and ``rollout_engine`` (a vLLM or
    SGLang engine generates) decide whether TRL's old-policy forward runs. A reference run through the LoRA actor
    counts as the actor's seconds: the actor's weights and layout run it."""
    job = ctx.job
    runs = scorers(ctx, models, grad_accum, rollout_engine)
    forwards = [(role, p, scoring_forward(ctx, p, generation_batch, micro_batch)) for role, p in runs]
    role_time = dict.fromkeys(("actor", "critic", "reference", "reward"), 0.0)
    for role, p, (_, seconds, _) in forwards:
        role_time["actor" if p is models.actor else role] += seconds
    calls = job.prompts_per_gpu // generation_batch
    overhead = role_time["shared"] = ctx.coef.step_overhead_s * (calls + generate_calls)
    scoring_seconds = sum(seconds for _, _, (_, seconds, _) in forwards)
    if traits(ctx.workload.kind).gae_advantages:  # GAE: a Python loop over the generated positions, per call
        advantages = calls * gae_seconds(job.gen_len, ctx.coef)
        scoring_seconds += advantages
        role_time["shared"] += advantages  # no model's: the bound walk counts it with the shared seconds
    # TRL's GRPO with rule-based rewards, no reference and no old-policy forward scores with no model at all: the
    # phase stays, holding nothing (its rewards are computed on the CPU)
    moments = tuple(live for _, _, (live, _, _) in forwards) or (live_of_nothing(),)
    scoring = StepPhase(
        "scoring",
        INFERENCE,
        moments,
        max((factor for _, _, (_, _, factor) in forwards), default=1.0),
        ctx.coef.frag_inference_carried,
        scoring_seconds,
        calls,
        moment_sizes=tuple(scoring_sizes(ctx, p, generation_batch, micro_batch) for _, p, _ in forwards) or ((),),
    )
    time = {"generation": 0.0, "scoring": scoring_seconds, "overhead": overhead}
    return half_of([scoring], time, role_time)
