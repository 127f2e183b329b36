"""An RLHF step whose rollout runs on a vLLM or SGLang engine beside the DeepSpeed trainer, top to bottom.

Phases, in the order OpenRLHF's colocated loop runs them (``--colocate_all_models --vllm_enable_sleep
--deepspeed_enable_sleep``), and TRL's and veRL's colocated modes alike:

- ``generation``: the engine is awake and generates every sequence of the step; the trainer waits, its
  optimizer states (and ZeRO-3 gradient partitions) moved to host memory when ``offload_training``
  (DeepSpeed's ``offload_states``: the 16-bit weights stay, OpenRLHF#808). Then the engine sleeps.
- ``scoring``, ``actor_training``, ``critic_training``: as in any RLHF step, beside what the sleeping engine
  keeps on the GPU (level 0: everything; 1 and 2: its CUDA context and graph pool).
- ``weight_sync``: the engine wakes its weights and receives the actor's new 16-bit weights.

With the ``separate`` placement the engine has ``engine_gpus`` GPUs of each node to itself: the trainer runs on
the others (its world size shrinks), waits during the rollout, and broadcasts its weights over the GPU link;
the engine's GPUs hold only the engine (``Step.separate_gpu_bytes``).

The engine's share of the GPU (``gpu_memory_utilization``) is solved here when the strategy leaves it unset
(:func:`search.rlhf.engine.resolve_engine`): between the least that holds the rollout's KV cache and the most
that fits beside the trainer in every phase the engine is awake in.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from search.coefficients import Coefficients
from search.model.host import STEADY
from search.rlhf.build_notes import model_build_notes
from search.rlhf.engine import ResolvedEngine, resolve_engine
from search.rlhf.job import RLHFContext, check_rlhf_strategy, rlhf_context
from search.rlhf.models import Models, models_init_cached, models_resident_sizes, place_models
from search.rlhf.scoring_phase import scoring_half
from search.rlhf.step import training_half
from search.rollout.timing import (
    offload_states_seconds,
    rollout_seconds,
    sleep_wake_seconds,
    weight_sync_seconds,
)
from search.step.assemble import Step, gpu_budget_bytes
from search.streams.init import engine_init
from search.streams.phases import Live, StepPhase, live
from search.streams.sizes import weight_tensors
from store.frameworks import framework_sleep_level
from store.records import Hardware, RLHFStrategy, Workload
from store.rollout import RolloutStrategy

ROLLOUT = "rollout"  # the phase group of the engine's phases: once per step


def trainer_hardware(hardware: Hardware, rollout: RolloutStrategy) -> Hardware:
    """The GPUs the trainer runs on: all of them when colocated, the others when the engine has its own."""
    if rollout.colocated:
        return hardware
    return replace(hardware, gpus=hardware.gpus - rollout.engine_gpus)


def offloadable_states(models: Models, rollout: RolloutStrategy) -> int:
    """GPU bytes DeepSpeed's ``offload_states`` moves to the host for the rollout: each trained model's fp32
    master weights and Adam moments (``hp_params``, ``optim_states``) and ZeRO-3's gradient partitions
    (``contiguous_grad_buffer``), where they are on the GPU; 0 without ``offload_training``. DeepSpeed refuses
    it for offloaded parameters and has no ZeRO optimizer to ask at ZeRO-0 (engine.py ``offload_states``)."""
    if not rollout.offload_training:
        return 0
    return sum(
        p.states.optimizer_states + p.persistent_gradients
        for p in models.trained
        if p.layout.zero_stage >= 1 and p.layout.offload_param == "none"
    )


def with_engine(phase: StepPhase, engine_bytes: int) -> StepPhase:
    """A trainer phase beside ``engine_bytes`` of a sleeping (or idle) engine on the same GPU."""
    if not engine_bytes:
        return phase
    moments = tuple(Live(m.parts[:-2] + (m.parts[-2] + engine_bytes, m.parts[-1]), m.transient) for m in phase.moments)
    return replace(phase, moments=moments)


def engine_phases(
    ctx: RLHFContext, models: Models, engine: ResolvedEngine, offloaded: int
) -> tuple[StepPhase, StepPhase, dict[str, float]]:
    """(generation, weight_sync, seconds by activity) of the engine's turn on the trainer's GPU."""
    w, coef, rollout = ctx.workload, ctx.coef, engine.rollout
    trainer = ctx.hardware
    memory = engine.memory
    on_gpu = memory.awake if rollout.colocated else 0
    generate_s = (
        rollout_seconds(
            w.model,
            sequences=engine.sequences,
            prompt_len=ctx.job.prompt_len,
            gen_len=ctx.job.gen_len,
            max_running=engine.max_running,
            dtype=w.dtype,
            tensor_parallel=rollout.tensor_parallel,
            enforce_eager=rollout.enforce_eager,
            hardware=trainer,
            coef=coef,
        )
        * ctx.job.generate_passes
    )
    sleep_s = sleep_wake_seconds(memory.weights, rollout.sleep_level, trainer, coef) if rollout.colocated else 0.0
    offload_s = offload_states_seconds(offloaded, trainer, coef)
    tensors = len(weight_tensors(w.model, w.dtype))
    sync_s = weight_sync_seconds(
        w.model,
        dtype=w.dtype,
        zero3=models.actor.layout.zero_stage == 3,
        colocated=rollout.colocated,
        tensor_parallel=rollout.tensor_parallel,
        tensors=tensors,
        trainer=trainer,
        coef=coef,
    )
    generation = StepPhase(
        "generation",
        ROLLOUT,
        (live(rollout_engine=on_gpu, offloaded_states=-offloaded, transient=0),),
        1.0,
        0.0,
        generate_s + sleep_s + offload_s,
        1,
        fresh=rollout.colocated,  # the trainer's cache is emptied before the engine wakes
    )
    # the engine wakes its weights (level 1: from host memory; 2: empty, filled by the sync), the trainer
    # gathers one ZeRO-3 module at a time and hands each tensor over
    waking = memory.awake if rollout.sleep_level == 0 else memory.asleep(rollout.sleep_level) + memory.weights
    gathered = models.actor.states.zero3_gathered // 2 if models.actor.layout.zero_stage == 3 else 0
    sync = StepPhase(
        "weight_sync",
        ROLLOUT,
        (
            live(
                rollout_engine=waking if rollout.colocated else 0,
                offloaded_states=-offloaded,
                zero3_gathered=gathered,
                transient=gathered,
            ),
        ),
        1.0,
        0.0,
        sync_s,
        1,
    )
    time = {"generation": generate_s, "engine_sleep": sleep_s, "offload_states": offload_s, "weight_sync": sync_s}
    return generation, sync, time


@lru_cache(maxsize=4096)
def engine_step_of(ctx: RLHFContext, s: RLHFStrategy) -> Step:
    """A (valid) strategy's step with a rollout engine; ``ctx`` is the trainer's (see :func:`trainer_hardware`).
    The engine sleeps at the level its framework puts it to (veRL: ``store.frameworks.framework_sleep_level``)."""
    assert s.rollout is not None
    level = framework_sleep_level(ctx.workload.framework, s.rollout.sleep_level, s.actor.lora_rank)
    if level != s.rollout.sleep_level:
        s = replace(s, rollout=s.rollout.with_(sleep_level=level))
    rollout = s.rollout
    assert rollout is not None
    w, coef, job = ctx.workload, ctx.coef, ctx.job
    models = place_models(ctx, s.actor, s.critic, s.reference, s.reward, s.ema)
    scoring = scoring_half(ctx, models, s.generation_batch, 1, s.micro_batch, s.grad_accum, rollout_engine=True)
    training = training_half(ctx, s.actor, s.critic, s.ema, s.micro_batch, s.grad_accum)
    resident = sum(models.resident.values())
    offloaded = offloadable_states(models, rollout) if rollout.colocated else 0
    budget = gpu_budget_bytes(ctx.hardware, coef)
    trainer_peak = resident + max(half.live for half in (scoring, training))
    engine = resolve_engine(ctx, rollout, budget, resident - offloaded, trainer_peak)
    generation, sync, engine_time = engine_phases(ctx, models, engine, offloaded)
    asleep = engine.memory.asleep(rollout.sleep_level) if rollout.colocated else 0
    trainer_phases = tuple(with_engine(phase, asleep) for half in (scoring, training) for phase in half.phases)
    time = {
        "generation": engine_time["generation"],
        "scoring": scoring.time["scoring"],
        **{key: training.time[key] for key in ("training", "communication", "offload", "optimizer", "ema")},
        "engine_sleep": engine_time["engine_sleep"],
        "offload_states": engine_time["offload_states"],
        "weight_sync": engine_time["weight_sync"],
        "overhead": scoring.time["overhead"] + training.time["overhead"],
    }
    role_time = {role: scoring.role_time[role] + training.role_time.get(role, 0.0) for role in scoring.role_time}
    role_time["actor"] += sum(engine_time.values())
    # pinned host buffers per node: DeepSpeed keeps those of offload_states once made (hp_params_pin_buffers...),
    # vLLM holds the level-1 copy of its weights while it sleeps, that is while the trainer works
    backup = engine.memory.host_backup(rollout.sleep_level) if rollout.colocated else 0
    host = models.host.plus(
        STEADY,
        {"rollout_weight_backup": ctx.hardware.gpus * backup, "offloaded_for_rollout": ctx.hardware.gpus * offloaded},
    )
    return Step(
        resident=models.resident,
        phases=(generation, *trainer_phases, sync),
        repeats={"inference": job.prompts_per_gpu // s.generation_batch, "training": w.ppo_epochs * s.grad_accum}
        | {ROLLOUT: 1},
        host=host,
        host_states=models.host_states,
        time=time,
        role_time=role_time,
        time_terms={name: seconds for name, seconds in time.items() if seconds},
        init_cached=models_init_cached(models, w.dtype),
        notes=engine.notes + model_build_notes(models, w, ctx.hardware.gpu_memory_bytes),
        resident_sizes=models_resident_sizes(ctx, models),
        engines=tuple(
            (
                f"{role}_training",
                p.states.parameters,
                p.states.optimizer_states,
                engine_init(p, w.dtype, ctx.hardware.gpu_memory_bytes, w.framework, w.model_build),
                weight_tensors(p.model, w.dtype, p.layout.lora_rank),
            )
            for role, p in (("actor", models.actor), ("critic", models.critic))
            if p is not None
        ),
        separate_gpu_bytes=0 if rollout.colocated else engine.memory.awake,
        rollout=engine.report(),
    )


def engine_step(workload: Workload, s: RLHFStrategy, hardware: Hardware, coef: Coefficients) -> Step:
    """The step of a (checked) strategy with a rollout engine, on the trainer's share of ``hardware``."""
    assert s.rollout is not None
    ctx = rlhf_context(workload, trainer_hardware(hardware, s.rollout), coef)
    check_rlhf_strategy(workload, s, ctx.job)
    return engine_step_of(ctx, s)
