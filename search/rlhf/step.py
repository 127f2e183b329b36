"""The cost model of an RLHF step (ppo, remax, grpo), DeepSpeed-Chat step 3 / OpenRLHF style, top to bottom.

Per GPU a step takes ``global_batch / world_size`` prompts. They are generated ``generation_batch`` prompts
per call, each prompt giving ``samples_per_prompt`` sequences of prompt + generation tokens (ReMax adds a
greedy generate call per batch for its baseline). Every generated batch is then scored: no-grad forwards of
the actor and the reference (log-probs over the vocabulary), the reward model and, for PPO, the critic
(scalar heads). A KL coefficient of 0 holds no reference and rule-based rewards no reward model
(:func:`search.rlhf.models.holds_role`): their bytes and forwards drop out. Training runs ``ppo_epochs``
passes over the step's sequences, ``micro_batch`` sequences per micro-step and ``grad_accum`` micro-steps per
optimizer step, actor and critic micro-steps interleaved.

Phases: ``generation``, ``scoring``, ``actor_training``, ``critic_training`` (PPO only). Every phase gets a
peak allocated (all resident model bytes plus its own live bytes), a peak reserved (plus the caching
allocator's fragments) and a time. Fragments follow arXiv 2410.15651: each phase fragments a share of what
it allocates and frees, and leaves a share of it cached for the phases after it, until ``empty_cache``
releases them (``never``; ``after-generation``; ``after-inference``: after generation and after scoring;
``after-phase``; ``every-step``: between steps only).

The reference is a separate model, as DeepSpeed-Chat keeps it, even when the actor is LoRA-tuned from the same
base; TRL's GRPO runs the LoRA actor with its adapters off instead, scores in micro-batches through its fused
head and may skip the old policy's forward (:mod:`search.rlhf.scoring`).
"""

from __future__ import annotations

from functools import lru_cache

from search.coefficients import Coefficients
from search.model.placement import TrainedPlacement
from search.model.training_time import training_time
from search.rlhf.build_notes import model_build_notes
from search.rlhf.job import RLHFContext
from search.rlhf.memory import generation_live, hybrid_engine_injects, training_live, training_named
from search.rlhf.models import (
    Models,
    models_init_cached,
    models_resident_sizes,
    place_models,
    role_micro_batch,
    trained_model,
)
from search.rlhf.scoring import reference_is_actor
from search.rlhf.scoring_phase import StepHalf, half_of, scoring_half
from search.rlhf.timing import ema_time, generation_time
from search.step.assemble import Step
from search.step.assemble import reserved_floor as step_reserved_floor
from search.streams.init import engine_init
from search.streams.phases import INFERENCE, TRAINING, StepPhase, trained_factor
from search.streams.sizes import inference_sizes, training_sizes, weight_tensors
from store.records import RLHFStrategy, TrainedModelStrategy


@lru_cache(maxsize=4096)
def generation_phase(
    ctx: RLHFContext, actor: TrainedPlacement, hybrid_engine: bool, generation_batch: int
) -> StepPhase:
    """All generate calls of a step, ``generation_batch`` prompts each (ReMax: a greedy call beside each)."""
    w, coef, job = ctx.workload, ctx.coef, ctx.job
    batch = generation_batch * job.samples_per_prompt
    calls = job.prompts_per_gpu // generation_batch * job.generate_passes
    seconds = generation_time(ctx, actor, hybrid_engine, batch)
    moments = generation_live(
        actor,
        hybrid_engine=hybrid_engine,
        sequences=batch,
        prompt_len=job.prompt_len,
        gen_len=job.gen_len,
        dtype=w.dtype,
        attn_impl=w.attn_impl,
        coef=coef,
    )
    return StepPhase(
        "generation",
        INFERENCE,
        moments,
        trained_factor(actor, coef, training=False),
        coef.frag_inference_carried,
        calls * seconds,
        calls,
        sizes=inference_sizes(actor.model, batch, job.prompt_len, w.dtype, w.attn_impl, coef, 1),
        kv_layers=actor.model.num_layers,
    )


@lru_cache(maxsize=16384)
def inference_half(
    ctx: RLHFContext, models: Models, hybrid_engine: bool, generation_batch: int, micro_batch: int, grad_accum: int
) -> StepHalf:
    """Generation (DeepSpeed's: the hybrid engine or HF generate) and scoring of the step's prompts,
    ``generation_batch`` prompts per call (TRL scores ``micro_batch`` sequences per forward)."""
    job = ctx.job
    generation = generation_phase(ctx, models.actor, hybrid_engine, generation_batch)
    calls = job.prompts_per_gpu // generation_batch
    scoring = scoring_half(
        ctx, models, generation_batch, calls * job.generate_passes, micro_batch, grad_accum, rollout_engine=False
    )
    role_time = dict(scoring.role_time)
    role_time["actor"] += generation.time_s
    time = dict(scoring.time, generation=generation.time_s)
    return half_of([generation, *scoring.phases], time, role_time)


@lru_cache(maxsize=16384)
def training_half(
    ctx: RLHFContext,
    actor_layout: TrainedModelStrategy,
    critic_layout: TrainedModelStrategy | None,
    ema: bool,
    micro_batch: int,
    grad_accum: int,
) -> StepHalf:
    """``ppo_epochs`` optimizer steps of the actor and (PPO) the critic, micro-steps interleaved."""
    w, hw, coef, job = ctx.workload, ctx.hardware, ctx.coef, ctx.job
    dtype, seq_len, epochs = w.dtype, job.seq_len, w.ppo_epochs
    actor = trained_model(ctx, "actor", actor_layout, grad_accum)
    critic = trained_model(ctx, "critic", critic_layout, grad_accum) if critic_layout is not None else None
    time = dict.fromkeys(("training", "communication", "offload", "optimizer", "ema", "overhead"), 0.0)
    role_time = {"actor": 0.0, "critic": 0.0, "shared": 0.0}
    phases: list[StepPhase] = []
    for role, p in (("actor", actor), ("critic", critic)):
        if p is None:
            continue
        other = critic if role == "actor" else actor
        # TRL's GRPOTrainer scores the actor's tokens through its fused log-prob head (search.model.fused_head)
        batch = role_micro_batch(ctx, role, p.layout.lora_rank, micro_batch)
        parts = training_time(
            p,
            micro_batch=micro_batch,
            grad_accum=grad_accum,
            seq_len=seq_len,
            dtype=dtype,
            hardware=hw,
            coef=coef,
            loss=batch.loss,
        )
        compute, comm, offload, optimizer = parts.compute, parts.communication, parts.offload, parts.optimizer
        extra = ema_time(p, dtype, hw, coef) if (role == "actor" and ema) else 0.0
        for key, seconds in (
            ("training", compute),
            ("communication", comm),
            ("offload", offload),
            ("optimizer", optimizer),
            ("ema", extra),
        ):
            time[key] += epochs * seconds
        seconds = epochs * (compute + comm + offload + optimizer + extra)
        role_time[role] = seconds
        live = training_live(p, other, batch)
        factor = trained_factor(p, coef, training=True)
        sizes = training_sizes(p, batch)
        phases.append(
            StepPhase(
                f"{role}_training",
                TRAINING,
                live,
                factor,
                coef.frag_carried,
                seconds,
                epochs * grad_accum,
                sizes=sizes,
                moment_named=training_named(p, batch, engine=len(phases)),
            )
        )
    time["overhead"] = role_time["shared"] = coef.step_overhead_s * epochs * grad_accum * len(phases)
    return half_of(phases, time, role_time)


def step_halves(ctx: RLHFContext, s: RLHFStrategy) -> tuple[Models, StepHalf, StepHalf]:
    """The cached pieces of a (valid) strategy's step."""
    models = place_models(ctx, s.actor, s.critic, s.reference, s.reward, s.ema)
    return (
        models,
        inference_half(ctx, models, s.hybrid_engine, s.generation_batch, s.micro_batch, s.grad_accum),
        training_half(ctx, s.actor, s.critic, s.ema, s.micro_batch, s.grad_accum),
    )


def step_time(inference: StepHalf, training: StepHalf) -> dict[str, float]:
    """Seconds per step by activity, without empty_cache (``base_time_s`` is the sum of these, in order)."""
    return {
        "generation": inference.time["generation"],
        "scoring": inference.time["scoring"],
        **{key: training.time[key] for key in ("training", "communication", "offload", "optimizer", "ema")},
        "overhead": inference.time["overhead"] + training.time["overhead"],
    }


def step_of(ctx: RLHFContext, s: RLHFStrategy) -> Step:
    """A (valid) strategy's step: resident bytes, the two halves' phases and times, host memory."""
    models, inference, training = step_halves(ctx, s)
    time = step_time(inference, training)
    role_time = {role: inference.role_time[role] + training.role_time.get(role, 0.0) for role in inference.role_time}
    notes = []
    if s.hybrid_engine and hybrid_engine_injects(models.actor.model):
        notes.append("the hybrid engine's KV cache and workspace are cudaMalloc'ed outside torch's allocator")
    elif s.hybrid_engine:
        notes.append(
            f"DeepSpeed's hybrid engine has no inference container for {models.actor.model.model_type} layers: it "
            "generates through transformers' generate, whose KV cache is in torch's allocator"
        )
    if models.reference is not None and s.actor.lora_rank and ctx.workload.model_for("reference") == ctx.workload.model:
        reference = models.reference.resident / 2**30
        notes.append(
            f"the reference is a separate copy as in DeepSpeed-Chat ({reference:.1f} GiB here); running the LoRA "
            "actor with its adapters disabled (TRL) would save it"
        )
    if models.reference is None and reference_is_actor(ctx, s.actor.lora_rank):
        notes.append("the reference log-probs come from the LoRA actor with its adapters disabled (TRL): no copy")
    notes += model_build_notes(models, ctx.workload, ctx.hardware.gpu_memory_bytes)
    return Step(
        resident=models.resident,
        phases=inference.phases + training.phases,
        repeats={
            INFERENCE: ctx.job.prompts_per_gpu // s.generation_batch,
            TRAINING: ctx.workload.ppo_epochs * s.grad_accum,
        },
        host=models.host,
        host_states=models.host_states,
        time=time,
        role_time=role_time,
        time_terms={name: seconds for name, seconds in time.items() if seconds},
        init_cached=models_init_cached(models, ctx.workload.dtype),
        notes=tuple(notes),
        resident_sizes=models_resident_sizes(ctx, models),
        engines=tuple(
            (
                f"{role}_training",
                p.states.parameters,
                p.states.optimizer_states,
                engine_init(
                    p,
                    ctx.workload.dtype,
                    ctx.hardware.gpu_memory_bytes,
                    ctx.workload.framework,
                    ctx.workload.model_build,
                ),
                weight_tensors(p.model, ctx.workload.dtype, p.layout.lora_rank),
            )
            for role, p in (("actor", models.actor), ("critic", models.critic))
            if p is not None
        ),
    )


def reserved_floor(models: Models, halves: tuple[StepHalf, ...], coef: Coefficients, dtype: str) -> int:
    """The least peak reserved bytes any ``empty_cache`` policy and allocator can give the step."""
    phases = tuple(phase for half in halves for phase in half.phases)
    return step_reserved_floor(sum(models.resident.values()), phases, coef, models_init_cached(models, dtype))
