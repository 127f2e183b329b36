"""The cost model of an RLHF step (ppo, remax, grpo), DeepSpeed-Chat step 3 / OpenRLHF style, top to bottom.

Per GPU a step takes ``global_batch / world_size`` prompts. They are generated ``generation_batch`` prompts
per call, each prompt giving ``samples_per_prompt`` sequences of prompt + generation tokens (ReMax adds a
greedy generate call per batch for its baseline). Every generated batch is then scored: no-grad forwards of
the actor and the reference (log-probs over the vocabulary), the reward model and, for PPO, the critic
(scalar heads). Training runs ``ppo_epochs`` passes over the step's sequences, ``micro_batch`` sequences per
micro-step and ``grad_accum`` micro-steps per optimizer step, actor and critic micro-steps interleaved.

Phases: ``generation``, ``scoring``, ``actor_training``, ``critic_training`` (PPO only). Every phase gets a
peak allocated (all resident model bytes plus its own live bytes), a peak reserved (plus the caching
allocator's fragments) and a time. Fragments follow arXiv 2410.15651: each phase fragments a share of what
it allocates and frees, and leaves a share of it cached for the phases after it, until ``empty_cache``
releases them (``never``; ``after-generation``; ``after-inference``: after generation and after scoring;
``after-phase``; ``every-step``: between steps only).

The reference is always a separate model, as DeepSpeed-Chat keeps it, even when the actor is LoRA-tuned
from the same base (TRL would run the actor with adapters disabled instead and save its bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search.coefficients import Coefficients
from search.prediction import PhasePrediction, Prediction
from search.rlhf_memory import (
    INFERENCE,
    TRAINING,
    FrozenPlacement,
    Live,
    StepPhase,
    TrainedPlacement,
    apply_policy,
    ema_bytes,
    experience_bytes,
    forward_live,
    frozen_factor,
    frozen_placement,
    generation_live,
    trained_factor,
    trained_placement,
    training_live,
)
from search.rlhf_time import ema_time, frozen_forward_time, generation_time, trained_forward_time, training_time
from search.single_model import gpu_budget_bytes
from search.space import per_gpu_batch
from store.errors import InputError
from store.records import (
    DTYPE_BYTES,
    FrozenModelStrategy,
    Hardware,
    RLHFStrategy,
    TrainedModelStrategy,
    Workload,
)


@dataclass(frozen=True)
class RLHFJob:
    """The counts of one RLHF step per GPU, checked against the hardware."""

    prompts_per_gpu: int
    samples_per_prompt: int
    prompt_len: int
    gen_len: int
    generate_passes: int  # generate calls per prompt batch: 2 for ReMax (sampled + greedy baseline)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.gen_len

    @property
    def sequences_per_gpu(self) -> int:
        return self.prompts_per_gpu * self.samples_per_prompt


def rlhf_job(workload: Workload, hardware: Hardware) -> RLHFJob:
    """Prompts and sequences per GPU per step; InputError when the workload cannot be an RLHF step."""
    if not workload.is_rlhf:
        raise InputError(f"workload {workload.kind!r} is not an RLHF workload (ppo, remax, grpo)")
    if workload.prompt_len is None or workload.gen_len is None:
        raise InputError(f"{workload.kind} needs a prompt length and a generation length")
    for name in ("prompt_len", "gen_len", "ppo_epochs", "samples_per_prompt"):
        value = getattr(workload, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{name} must be a whole number >= 1, not {value!r}")
    return RLHFJob(
        prompts_per_gpu=per_gpu_batch(workload, hardware),
        samples_per_prompt=workload.samples_per_prompt,
        prompt_len=workload.prompt_len,
        gen_len=workload.gen_len,
        generate_passes=2 if workload.kind == "remax" else 1,
    )


def check_rlhf_strategy(workload: Workload, strategy: RLHFStrategy, job: RLHFJob) -> None:
    """InputError when ``strategy`` does not match the workload or does not split its batches evenly."""
    if not isinstance(strategy, RLHFStrategy):
        raise InputError(f"{workload.kind} needs an RLHF strategy (actor/critic/reference/reward blocks)")
    s = strategy
    if workload.has_critic and s.critic is None:
        raise InputError("ppo trains a critic: the strategy needs a critic block")
    if not workload.has_critic and s.critic is not None:
        raise InputError(f"{workload.kind} trains no critic (only ppo does): drop the strategy's critic block")
    if job.prompts_per_gpu % s.generation_batch:
        raise InputError(
            f"generation_batch {s.generation_batch} does not divide the {job.prompts_per_gpu} prompts per GPU"
        )
    if s.micro_batch * s.grad_accum != job.sequences_per_gpu:
        raise InputError(
            f"micro_batch {s.micro_batch} x grad_accum {s.grad_accum} must equal the {job.sequences_per_gpu} "
            f"sequences per GPU per step ({job.prompts_per_gpu} prompts x {job.samples_per_prompt} samples)"
        )


@dataclass(frozen=True)
class RLHFStep:
    """Everything about a strategy except its ``empty_cache`` policy and allocator, which only move
    fragments (and the cost of releasing them): the search shares one RLHFStep between those choices."""

    resident: dict[str, int]
    phases: tuple[StepPhase, ...]
    repeats: dict[str, int]  # instances of each group per step
    host_bytes: int
    host_states: int  # Prediction.host_states_bytes
    time: dict[str, float]  # seconds per step by activity, without empty_cache
    role_time: dict[str, float]  # the same seconds by model (separable: each depends on its own block)
    notes: tuple[str, ...]
    base_time_s: float = 0.0  # sum of ``time`` (derived)
    resident_bytes: int = 0  # sum of ``resident`` (derived)
    peak_allocated_bytes: int = 0  # resident plus the largest phase's live bytes (derived)
    # (name, group, group repeated within a step) of every phase: what the release plan depends on (derived)
    structure: tuple[tuple[str, str, bool], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_time_s", sum(self.time.values()))
        object.__setattr__(self, "resident_bytes", sum(self.resident.values()))
        peak = self.resident_bytes + max(phase.live for phase in self.phases)
        object.__setattr__(self, "peak_allocated_bytes", peak)
        structure = tuple((ph.name, ph.group, self.repeats[ph.group] > 1) for ph in self.phases)
        object.__setattr__(self, "structure", structure)


@dataclass(frozen=True, eq=False)
class RLHFContext:
    """A workload on its hardware with its coefficients: the cache key of every piece (hashed by identity)."""

    workload: Workload
    hardware: Hardware
    coef: Coefficients
    job: RLHFJob


@lru_cache(maxsize=64)
def rlhf_context(workload: Workload, hardware: Hardware, coef: Coefficients) -> RLHFContext:
    """The context of a workload; InputError when it is not an RLHF step that splits over the GPUs."""
    return RLHFContext(workload, hardware, coef, rlhf_job(workload, hardware))


@dataclass(frozen=True, eq=False)
class Models:
    """Where the step's four models live, and the bytes that stay resident through every phase."""

    actor: TrainedPlacement
    critic: TrainedPlacement | None
    reference: FrozenPlacement
    reward: FrozenPlacement
    resident: dict[str, int]
    host_bytes: int
    host_states: int  # bytes per GPU in host memory (offloaded states, staging buffers), without slack

    @property
    def trained(self) -> list[TrainedPlacement]:
        return [self.actor] + ([self.critic] if self.critic else [])


@lru_cache(maxsize=4096)
def trained_model(ctx: RLHFContext, role: str, layout: TrainedModelStrategy, grad_accum: int) -> TrainedPlacement:
    """The actor (LM head) or the critic (scalar head) under ``layout``. Only its gradients depend on the
    accumulation: generation, scoring and resident bytes use ``grad_accum=1``."""
    w = ctx.workload
    model = w.model_for(role)
    return trained_placement(model, role == "actor", layout, w.dtype, ctx.hardware.world_size, grad_accum, ctx.coef)


@lru_cache(maxsize=1024)
def frozen_model(ctx: RLHFContext, role: str, block: FrozenModelStrategy) -> FrozenPlacement:
    """The reference (LM head) or the reward model (scalar head) under ``block``."""
    w = ctx.workload
    model = w.model_for(role)
    return frozen_placement(model, role == "reference", block, w.dtype, ctx.hardware.world_size)


@lru_cache(maxsize=16384)
def place_models(
    ctx: RLHFContext,
    actor_layout: TrainedModelStrategy,
    critic_layout: TrainedModelStrategy | None,
    reference_block: FrozenModelStrategy,
    reward_block: FrozenModelStrategy,
    ema: bool,
) -> Models:
    """Model states, frozen weights, EMA copy, rollout buffer and buckets; host memory per node."""
    w, coef, n = ctx.workload, ctx.coef, ctx.hardware.world_size
    dtype, d = w.dtype, DTYPE_BYTES[w.dtype]
    actor = trained_model(ctx, "actor", actor_layout, 1)
    critic = trained_model(ctx, "critic", critic_layout, 1) if critic_layout is not None else None
    reference, reward = frozen_model(ctx, "reference", reference_block), frozen_model(ctx, "reward", reward_block)
    trained = [actor] + ([critic] if critic else [])
    ema_gpu, ema_host = ema_bytes(actor, dtype, n) if ema else (0, 0)
    resident = {
        "parameters": sum(p.states.parameters for p in trained),
        "optimizer_states": sum(p.states.optimizer_states for p in trained),
        "gradients": sum(p.persistent_gradients for p in trained),  # ZeRO-3's partitions, kept from init on
        "reference_model": reference.resident,
        "reward_model": reward.resident,
        "ema": ema_gpu,
        "experience": experience_bytes(ctx.job.sequences_per_gpu, ctx.job.seq_len, dtype),
        "buffers": int(coef.cublas_workspace_bytes) + sum(p.buffers for p in trained),
    }
    # Host per node: offloaded states with DeepSpeed's pinned-buffer slack, offloaded frozen weights and
    # EMA copy; or, when larger, every local rank loading one model's 16-bit copy (one model at a time).
    offloaded = coef.host_buffer_factor * sum(p.states.host for p in trained)
    offloaded += reference.host + reward.host + ema_host
    loading = max(
        [d * p.resident // (n if p.layout.zero_stage == 3 else 1) for p in trained]
        + [d * p.params // (n if p.block.zero_stage == 3 else 1) for p in (reference, reward)]
    )
    host = int(max(offloaded, loading) * ctx.hardware.gpus)
    host_states = sum(p.states.host + p.work.host for p in trained) + reference.host + reward.host + ema_host
    return Models(actor, critic, reference, reward, resident, host, host_states)


@dataclass(frozen=True, eq=False)
class StepHalf:
    """The inference half (generation, scoring) or the training half (actor and critic) of a step."""

    phases: tuple[StepPhase, ...]
    time: dict[str, float]  # seconds per step by activity
    role_time: dict[str, float]  # the same seconds by model
    live: int  # the most bytes any of its phases adds to the resident ones


def _half(phases: list[StepPhase], time: dict[str, float], role_time: dict[str, float]) -> StepHalf:
    return StepHalf(tuple(phases), time, role_time, max(phase.live for phase in phases))


@lru_cache(maxsize=4096)
def generation_phase(
    ctx: RLHFContext, actor: TrainedPlacement, hybrid_engine: bool, generation_batch: int
) -> StepPhase:
    """All generate calls of a step, ``generation_batch`` prompts each (ReMax: a greedy call beside each)."""
    w, hw, coef, job = ctx.workload, ctx.hardware, ctx.coef, ctx.job
    batch = generation_batch * job.samples_per_prompt
    calls = job.prompts_per_gpu // generation_batch * job.generate_passes
    seconds = generation_time(actor, hybrid_engine, batch, job.prompt_len, job.gen_len, w.dtype, hw, coef)
    return StepPhase(
        "generation",
        INFERENCE,
        generation_live(actor, hybrid_engine, batch, job.prompt_len, job.gen_len, w.dtype, w.attn_impl, coef),
        trained_factor(actor, coef, training=False),
        coef.frag_inference_carried,
        calls * seconds,
        calls,
    )


@lru_cache(maxsize=4096)
def scoring_forward(
    ctx: RLHFContext, model: TrainedPlacement | FrozenPlacement, generation_batch: int
) -> tuple[Live, float, float]:
    """(live bytes, seconds per step, fragmentation factor) of one model's scoring forwards."""
    w, hw, coef, job = ctx.workload, ctx.hardware, ctx.coef, ctx.job
    batch, calls = generation_batch * job.samples_per_prompt, job.prompts_per_gpu // generation_batch
    if isinstance(model, TrainedPlacement):
        gathered = model.states.zero3_gathered // 2  # parameters of the live module, no gradients
        seconds = trained_forward_time(model, batch, job.seq_len, w.dtype, hw, coef)
        factor = trained_factor(model, coef, training=False)
    else:
        gathered = model.gathered
        seconds = frozen_forward_time(model, batch, job.seq_len, w.dtype, hw, coef)
        factor = frozen_factor(model, coef)
    live = forward_live(model.model, model.lm_head, gathered, batch, job.seq_len, w.dtype, w.attn_impl, coef)
    return live, calls * seconds, factor


@lru_cache(maxsize=16384)
def inference_half(ctx: RLHFContext, models: Models, hybrid_engine: bool, generation_batch: int) -> StepHalf:
    """Generation and scoring of the step's prompts, ``generation_batch`` prompts per call."""
    job = ctx.job
    generation = generation_phase(ctx, models.actor, hybrid_engine, generation_batch)
    roles = [("actor", models.actor), ("critic", models.critic), ("reference", models.reference)]
    roles.append(("reward", models.reward))
    forwards = {role: scoring_forward(ctx, p, generation_batch) for role, p in roles if p is not None}
    role_time = {role: forwards[role][1] if role in forwards else 0.0 for role, _ in roles}
    role_time["actor"] += generation.time_s
    calls = job.prompts_per_gpu // generation_batch
    role_time["shared"] = ctx.coef.step_overhead_s * calls * (job.generate_passes + 1)
    scoring_seconds = sum(seconds for _, seconds, _ in forwards.values())
    scoring = StepPhase(
        "scoring",
        INFERENCE,
        tuple(live for live, _, _ in forwards.values()),
        max(factor for _, _, factor in forwards.values()),
        ctx.coef.frag_inference_carried,
        scoring_seconds,
        calls,
    )
    time = {"generation": generation.time_s, "scoring": scoring_seconds, "overhead": role_time["shared"]}
    return _half([generation, scoring], time, role_time)


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
    dtype, attn, seq_len, epochs = w.dtype, w.attn_impl, job.seq_len, w.ppo_epochs
    actor = trained_model(ctx, "actor", actor_layout, grad_accum)
    critic = trained_model(ctx, "critic", critic_layout, grad_accum) if critic_layout is not None else None
    time = dict.fromkeys(("training", "communication", "offload", "optimizer", "ema", "overhead"), 0.0)
    role_time = {"actor": 0.0, "critic": 0.0, "shared": 0.0}
    phases = []
    for role, p in (("actor", actor), ("critic", critic)):
        if p is None:
            continue
        other = critic if role == "actor" else actor
        compute, comm, offload, optimizer = training_time(p, micro_batch, grad_accum, seq_len, dtype, hw, coef)
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
        live = training_live(p, other, micro_batch, seq_len, dtype, attn, coef)
        factor = trained_factor(p, coef, training=True)
        phases.append(
            StepPhase(f"{role}_training", TRAINING, live, factor, coef.frag_carried, seconds, epochs * grad_accum)
        )
    time["overhead"] = role_time["shared"] = coef.step_overhead_s * epochs * grad_accum * len(phases)
    return _half(phases, time, role_time)


def rlhf_step(workload: Workload, strategy: RLHFStrategy, hardware: Hardware, coef: Coefficients) -> RLHFStep:
    """Validate, then build (from cached pieces) the policy-independent part of a prediction."""
    ctx = rlhf_context(workload, hardware, coef)
    check_rlhf_strategy(workload, strategy, ctx.job)
    return step_of(ctx, strategy)


def step_halves(ctx: RLHFContext, s: RLHFStrategy) -> tuple[Models, StepHalf, StepHalf]:
    """The cached pieces of a (valid) strategy's step."""
    models = place_models(ctx, s.actor, s.critic, s.reference, s.reward, s.ema)
    return (
        models,
        inference_half(ctx, models, s.hybrid_engine, s.generation_batch),
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


def step_of(ctx: RLHFContext, s: RLHFStrategy) -> RLHFStep:
    """A (valid) strategy's step: resident bytes, the two halves' phases and times, host memory."""
    models, inference, training = step_halves(ctx, s)
    time = step_time(inference, training)
    role_time = {role: inference.role_time[role] + training.role_time.get(role, 0.0) for role in inference.role_time}
    notes = []
    if s.hybrid_engine:
        notes.append("the hybrid engine's KV cache and workspace are cudaMalloc'ed outside torch's allocator")
    if s.actor.lora_rank and ctx.workload.model_for("reference") == ctx.workload.model:
        reference = models.reference.resident / 2**30
        notes.append(
            f"the reference is a separate copy as in DeepSpeed-Chat ({reference:.1f} GiB here); running the LoRA "
            "actor with its adapters disabled (TRL) would save it"
        )
    return RLHFStep(
        resident=models.resident,
        phases=inference.phases + training.phases,
        repeats={
            INFERENCE: ctx.job.prompts_per_gpu // s.generation_batch,
            TRAINING: ctx.workload.ppo_epochs * s.grad_accum,
        },
        host_bytes=models.host_bytes,
        host_states=models.host_states,
        time=time,
        role_time=role_time,
        notes=tuple(notes),
    )


def reserved_floor(models: Models, halves: tuple[StepHalf, ...], coef: Coefficients) -> int:
    """The least peak reserved bytes any ``empty_cache`` policy and allocator can give a step: with
    ``after-phase`` no phase finds another's fragments, and expandable segments shrink its own."""
    within = coef.frag_expandable_factor * coef.frag_within_step
    resident = sum(models.resident.values())
    return max(
        resident + live + int(within * phase.factor * transient + 0)
        for half in halves
        for phase in half.phases
        for live, transient in phase.moment_bytes
    )


def score_rlhf(step: RLHFStep, empty_cache: str, allocator: str, coef: Coefficients) -> tuple[int, float]:
    """(peak reserved bytes, step seconds) of a step under a policy: what ``finish_rlhf`` would report."""
    reserved, _, cache_seconds = apply_policy(
        step.phases, step.structure, step.resident_bytes, empty_cache, allocator, coef
    )
    return max(reserved), step.base_time_s + cache_seconds


def finish_rlhf(step: RLHFStep, empty_cache: str, allocator: str, hardware: Hardware, coef: Coefficients) -> Prediction:
    """Apply the ``empty_cache`` policy and the allocator to a step: fragments, their cost, the Prediction."""
    phases = step.phases
    reserved, chosen, cache_seconds = apply_policy(
        step.phases, step.structure, step.resident_bytes, empty_cache, allocator, coef
    )
    allocated = [step.resident_bytes + phase.live for phase in phases]
    peak = max(range(len(phases)), key=lambda i: (reserved[i], allocated[i]))
    moment = phases[peak].moments[chosen[peak]]
    breakdown = dict(step.resident)
    for name, value in moment.as_dict().items():
        breakdown[name] = breakdown.get(name, 0) + value
    breakdown["fragmentation"] = reserved[peak] - step.resident_bytes - moment.total
    time_breakdown = dict(step.time, empty_cache=cache_seconds)
    return Prediction(
        peak_allocated_bytes=max(allocated),
        peak_reserved_bytes=max(reserved),
        gpu_budget_bytes=gpu_budget_bytes(hardware, coef),
        host_bytes=step.host_bytes,
        host_states_bytes=step.host_states,
        host_budget_bytes=hardware.cpu_memory_bytes,
        step_time_s=step.base_time_s + cache_seconds,
        breakdown=breakdown,
        phases=tuple(
            PhasePrediction(ph.name, allocated[i], reserved[i], ph.time_s, ph.count) for i, ph in enumerate(phases)
        ),
        peak_phase=phases[peak].name,
        time_breakdown=time_breakdown,
        notes=step.notes,
    )


def predict_rlhf(workload: Workload, strategy: RLHFStrategy, hardware: Hardware, coef: Coefficients) -> Prediction:
    """Predicted peak memory per GPU, host memory per node and step time of an RLHF strategy.

    Phases ``generation``, ``scoring``, ``actor_training`` and (PPO) ``critic_training``; the breakdown is
    that of the peak phase's peak moment and sums to its peak reserved bytes. InputError for a strategy that
    does not fit the workload (a critic block for remax/grpo or none for ppo, batches that do not divide).
    """
    step = rlhf_step(workload, strategy, hardware, coef)
    return finish_rlhf(step, strategy.empty_cache, strategy.allocator, hardware, coef)
