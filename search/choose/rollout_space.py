"""The rollout engines the RLHF search weighs beside DeepSpeed's own generation, and their per-model bounds.

Options (each a :class:`store.rollout.RolloutStrategy` with the utilization left for the step to solve):
vLLM and SGLang, colocated on every training GPU, tensor parallel 1 and each power of two up to the GPUs of a
node, sleep levels 0 and 2, with and without DeepSpeed's ``offload_states`` during the rollout, with CUDA
graphs and with ``enforce_eager``. Sleep level 1 is left out of the search: it frees the same GPU bytes as
level 2 and adds a host copy of the weights and two PCIe copies per step, because the weight sync refills the
engine's weights after every training step anyway (it stays a valid choice for ``planner predict``).
The separate placement is weighed with a quarter of a node's GPUs (at least one) given to the engine.

The bound walk needs a lower bound of each point's time and memory from per-model pieces
(:func:`engine_actor_seconds`): the actor's scoring and training as with DeepSpeed's generation, plus the
rollout with no waves, the weight sync and the sleep/wake cycle; its bytes bound is that of its scoring and
training moments (the engine only adds).
"""

from __future__ import annotations

from search.choose.candidates import Candidate, penalized_score
from search.choose.rlhf_space import (
    RLHFOuterPoint,
    batch_choices,
    cache_choices,
    generation_options,
    rlhf_strategy_at,
    role_seconds,
)
from search.coefficients import Coefficients
from search.model.placement import TrainedPlacement
from search.rlhf.job import RLHFContext, rlhf_context
from search.rlhf.models import trained_model
from search.rollout.engine import engine_limits, replica_sequences
from search.rollout.step import engine_step_of, trainer_hardware
from search.rollout.timing import engine_weight_bytes, rollout_seconds, sleep_wake_seconds, weight_sync_seconds
from search.step.assemble import finish_step, gpu_budget_bytes, score_step
from search.streams.sizes import weight_tensors
from store.errors import InputError
from store.records import Hardware, TrainedModelStrategy, Workload
from store.rollout import RolloutStrategy

# what generates the rollout: DeepSpeed ("hybrid-engine": its hybrid engine or HF generate), vLLM, SGLang
ROLLOUT_FAMILIES: tuple[str, ...] = ("hybrid-engine", "vllm", "sglang")


def searched_generations(
    workload: Workload, hardware: Hardware, rollouts: tuple[str, ...] = ROLLOUT_FAMILIES
) -> tuple[tuple[bool, RolloutStrategy | None], ...]:
    """The (hybrid_engine, rollout) options of the families in ``rollouts``, DeepSpeed's first."""
    unknown = sorted(set(rollouts) - set(ROLLOUT_FAMILIES))
    if unknown or not rollouts:
        raise InputError(f"rollout engines must be among {', '.join(ROLLOUT_FAMILIES)}, not {', '.join(unknown)}")
    engines = tuple(r for r in rollout_options(workload, hardware) if r.engine in rollouts)
    return generation_options(engines, deepspeed="hybrid-engine" in rollouts)


def generation_name(hybrid_engine: bool, rollout: RolloutStrategy | None) -> str:
    """A generation option's name in the search's keys and its TPE study."""
    if rollout is None:
        return "hybrid-engine" if hybrid_engine else "hf-generate"
    return rollout.describe()


SEARCHED_ENGINES: tuple[str, ...] = ("vllm", "sglang")
SEARCHED_SLEEP_LEVELS: tuple[int, ...] = (0, 2)


def tensor_parallel_choices(hardware: Hardware) -> tuple[int, ...]:
    """1 and each power of two up to the GPUs of a node that divides them."""
    sizes, tp = [], 1
    while tp <= hardware.gpus:
        if hardware.gpus % tp == 0:
            sizes.append(tp)
        tp *= 2
    return tuple(sizes)


def rollout_options(workload: Workload, hardware: Hardware) -> tuple[RolloutStrategy, ...]:
    """Every engine option the search weighs for this workload and hardware (see the module docstring)."""
    options = []
    for engine in SEARCHED_ENGINES:
        for tp in tensor_parallel_choices(hardware):
            for sleep in SEARCHED_SLEEP_LEVELS:
                for offload in (False, True):
                    for eager in (False, True):
                        options.append(RolloutStrategy(engine, "colocate", 0, tp, None, sleep, offload, eager))
        engine_gpus = max(1, hardware.gpus // 4)
        trainer_gpus = hardware.gpus - engine_gpus
        if trainer_gpus >= 1 and workload.global_batch % (trainer_gpus * hardware.nodes) == 0:
            for tp in tensor_parallel_choices(hardware):
                if engine_gpus % tp == 0:
                    options.append(RolloutStrategy(engine, "separate", engine_gpus, tp, None, 0, False, False))
    return tuple(options)


def engine_actor_seconds(
    ctx: RLHFContext,
    block: TrainedModelStrategy,
    rollout: RolloutStrategy,
    batches: tuple[int, int, int],
) -> float:
    """A lower bound of the actor's seconds per step with a rollout engine: its scoring and training (as with
    HF generate, less that generation), the rollout with every sequence running at once, the weight sync and
    the sleep/wake cycle (no offload_states: that depends on the critic too, and only adds)."""
    w, job, coef, hw = ctx.workload, ctx.job, ctx.coef, ctx.hardware
    placed: TrainedPlacement = trained_model(ctx, "actor", block, 1)
    from search.rlhf.step import generation_phase

    without_generation = role_seconds(ctx, "actor", block, False, False, batches)
    without_generation -= generation_phase(ctx, placed, False, batches[0]).time_s
    sequences = replica_sequences(ctx, rollout)
    running = min(sequences, engine_limits(rollout.engine, hw.gpu_memory_bytes, hw.gpu.name).max_num_seqs)
    tp = rollout.tensor_parallel
    generate = job.generate_passes * rollout_seconds(
        w.model, sequences, job.prompt_len, job.gen_len, running, w.dtype, tp, rollout.enforce_eager, hw, coef
    )
    weights = int(engine_weight_bytes(w.model, w.dtype, tp))
    sleep = sleep_wake_seconds(weights, rollout.sleep_level, hw, coef) if rollout.colocated else 0.0
    tensors = len(weight_tensors(w.model, w.dtype))
    sync = weight_sync_seconds(w.model, w.dtype, block.zero_stage == 3, rollout.colocated, tp, tensors, hw, coef)
    return max(0.0, without_generation) + generate + sleep + sync


def best_inner_engine(point: RLHFOuterPoint, workload: Workload, hardware: Hardware, coef: Coefficients) -> Candidate:
    """``best_inner_rlhf`` for a point whose rollout runs on an engine: every split and cache choice, exactly
    (the engine's share of the GPU depends on the whole split). The candidate's strategy carries the solved
    ``gpu_memory_utilization``."""
    assert point.rollout is not None
    trainer = trainer_hardware(hardware, point.rollout)
    ctx = rlhf_context(workload, trainer, coef)
    budget, host_budget = gpu_budget_bytes(trainer, coef), trainer.cpu_memory_bytes
    best: tuple[float, int, int] | None = None
    chosen = None
    for i, batches in enumerate(batch_choices(workload, trainer)):
        strategy = rlhf_strategy_at(point, batches)
        step = engine_step_of(ctx, strategy)
        for j, (policy, allocator) in enumerate(cache_choices()):
            reserved, seconds = score_step(step, policy, allocator, coef)
            score = penalized_score(seconds, reserved, budget, step.host_bytes, host_budget)
            if best is None or (score, i, j) < best:
                best, chosen = (score, i, j), (strategy, step, policy, allocator)
    assert chosen is not None
    strategy, step, policy, allocator = chosen
    prediction = finish_step(step, policy, allocator, trainer, coef)
    solved = point.rollout.with_(gpu_memory_utilization=prediction.rollout["gpu_memory_utilization"])
    return Candidate(strategy.with_(empty_cache=policy, allocator=allocator, rollout=solved), prediction)
