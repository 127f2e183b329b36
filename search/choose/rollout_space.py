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

from functools import lru_cache

from search.choose.candidates import Candidate
from search.choose.framework_space import framework_generations
from search.choose.rlhf_space import (
    generation_options,
    role_seconds,
)
from search.model.placement import TrainedPlacement
from search.rlhf.engine import engine_limits, engine_memory_at, replica_sequences, utilization_span
from search.rlhf.job import RLHFContext
from search.rlhf.models import trained_model
from search.rlhf.step import generation_phase
from search.rollout.engine_accepts import accepted_tensor_parallel
from search.rollout.timing import engine_weight_bytes, rollout_seconds, sleep_wake_seconds, weight_sync_seconds
from search.streams.sizes import weight_tensors
from store.errors import InputError
from store.framework_placement import generations_run
from store.records import FrozenModelStrategy, Hardware, TrainedModelStrategy, Workload
from store.rollout import ROLLOUT_ENGINES, RolloutStrategy

# what generates the rollout: DeepSpeed ("hybrid-engine": its hybrid engine or HF generate), vLLM, SGLang
ROLLOUT_FAMILIES: tuple[str, ...] = ROLLOUT_ENGINES  # store.choices.RolloutEngine


def searched_generations(
    workload: Workload, hardware: Hardware, rollouts: tuple[str, ...] = ROLLOUT_FAMILIES
) -> tuple[tuple[bool, RolloutStrategy | None], ...]:
    """The (hybrid_engine, rollout) options of the families in ``rollouts`` that the workload's framework runs,
    DeepSpeed's first."""
    unknown = sorted(set(rollouts) - set(ROLLOUT_FAMILIES))
    if unknown or not rollouts:
        raise InputError(f"rollout engines must be among {', '.join(ROLLOUT_FAMILIES)}, not {', '.join(unknown)}")
    engines = tuple(r for r in rollout_options(workload, hardware) if r.engine in rollouts)
    options = generation_options(engines, deepspeed="hybrid-engine" in rollouts)
    run = framework_generations(workload.framework, options)  # those the framework runs (framework_space)
    if run:
        return run
    if set(rollouts) == {"hybrid-engine"}:  # a stand-in: probes and suggestions weigh DeepSpeed's own generation
        return options
    runs = generations_run(workload.framework)
    # --rollout's hybrid-engine stands for DeepSpeed's own generation: its hybrid engine or generate()
    names = [f for f in ROLLOUT_FAMILIES if f in runs or (f == "hybrid-engine" and "hf-generate" in runs)]
    raise InputError(
        f"--framework {workload.framework} generates with {', '.join(runs)}: --rollout {','.join(rollouts)} plans "
        f"none of them (it takes {', '.join(names)})"
    )


def preference(candidate: Candidate) -> tuple[float, bool, int]:
    """The RLHF order of preference: the score, then (equal times) vLLM before SGLang, then less peak reserved."""
    rollout = getattr(candidate.strategy, "rollout", None)
    return (candidate.score, rollout is not None and rollout.engine == "sglang", candidate.rank_key[1])


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
    """The engine placements the search walks as outer points: each engine colocated at each tensor-parallel
    size the engine accepts for the model (:mod:`search.rollout.engine_accepts`), and on a quarter of each node's
    GPUs; their knobs (sleep level, offload_training, enforce_eager) are
    resolved per point (:func:`knob_variants`)."""
    options = []
    for engine in SEARCHED_ENGINES:
        sizes = accepted_tensor_parallel(engine, workload.model, tensor_parallel_choices(hardware))
        for tp in sizes:
            options.append(
                RolloutStrategy(
                    engine=engine,
                    placement="colocate",
                    engine_gpus=0,
                    tensor_parallel=tp,
                    gpu_memory_utilization=None,
                    sleep_level=2,
                    offload_training=True,
                    enforce_eager=False,
                )
            )
        engine_gpus = max(1, hardware.gpus // 4)
        trainer_gpus = hardware.gpus - engine_gpus
        if trainer_gpus >= 1 and workload.global_batch % (trainer_gpus * hardware.nodes) == 0:
            for tp in sizes:
                if engine_gpus % tp == 0:
                    options.append(
                        RolloutStrategy(
                            engine=engine,
                            placement="separate",
                            engine_gpus=engine_gpus,
                            tensor_parallel=tp,
                            gpu_memory_utilization=None,
                            sleep_level=0,
                            offload_training=False,
                            enforce_eager=False,
                        )
                    )
    return tuple(options)


def knob_variants(rollout: RolloutStrategy) -> tuple[RolloutStrategy, ...]:
    """The knobs the search tries for one engine placement, simplest first: colocated, sleep level 0 (the engine
    keeps its bytes through training) and 2, each with CUDA graphs and with enforce_eager, and at level 2 with and
    without DeepSpeed's offload_states; on GPUs of its own, graphs or not. offload_states beside an engine that
    never sleeps is left out: training then holds the engine and every trainer state at once, more than the
    rollout does, so moving states for the rollout lowers no peak and costs PCIe time."""
    if not rollout.colocated:
        return tuple(rollout.with_(enforce_eager=eager) for eager in (False, True))
    return tuple(
        rollout.with_(sleep_level=sleep, offload_training=offload, enforce_eager=eager)
        for sleep in SEARCHED_SLEEP_LEVELS
        for offload in ((False,) if sleep == 0 else (False, True))
        for eager in (False, True)
    )


@lru_cache(maxsize=256)
def fastest_knobs(rollout: RolloutStrategy) -> RolloutStrategy:
    """The variant no other is faster than: awake throughout, nothing moved, CUDA graphs."""
    if not rollout.colocated:
        return rollout.with_(enforce_eager=False)
    return rollout.with_(sleep_level=0, offload_training=False, enforce_eager=False)


@lru_cache(maxsize=256)
def smallest_knobs(rollout: RolloutStrategy) -> RolloutStrategy:
    """The variant no other holds less GPU memory than during the rollout: states moved, no graph pool."""
    if not rollout.colocated:
        return rollout.with_(enforce_eager=True)
    return rollout.with_(sleep_level=2, offload_training=True, enforce_eager=True)


@lru_cache(maxsize=4096)
def engine_seconds(ctx: RLHFContext, rollout: RolloutStrategy, zero3: bool) -> float:
    """The engine's seconds per step with memory unlimited: the rollout with every sequence running at once,
    sleep and wake, and the weight sync (what the search's bounds add for the engine)."""
    w, job, coef, hw = ctx.workload, ctx.job, ctx.coef, ctx.hardware
    tp = rollout.tensor_parallel
    sequences = replica_sequences(ctx, rollout)
    running = min(sequences, engine_limits(rollout.engine, hw.gpu_memory_bytes, hw.gpu.name, w.framework).max_num_seqs)
    generate = job.generate_passes * rollout_seconds(
        w.model,
        sequences=sequences,
        prompt_len=job.prompt_len,
        gen_len=job.gen_len,
        max_running=running,
        dtype=w.dtype,
        tensor_parallel=tp,
        enforce_eager=rollout.enforce_eager,
        hardware=hw,
        coef=coef,
    )
    weights = int(engine_weight_bytes(w.model, w.dtype, tp))
    sleep = sleep_wake_seconds(weights, rollout.sleep_level, hw, coef) if rollout.colocated else 0.0
    tensors = len(weight_tensors(w.model, w.dtype))
    sync = weight_sync_seconds(
        w.model,
        dtype=w.dtype,
        zero3=zero3,
        colocated=rollout.colocated,
        tensor_parallel=tp,
        tensors=tensors,
        trainer=hw,
        coef=coef,
    )
    return generate + sleep + sync


def engine_actor_seconds(
    ctx: RLHFContext,
    block: TrainedModelStrategy,
    rollout: RolloutStrategy,
    batches: tuple[int, int, int],
) -> float:
    """A lower bound of the actor's seconds per step with a rollout engine: its scoring and training (as with
    HF generate, less that generation), the rollout with every sequence running at once, the weight sync and
    the sleep/wake cycle (no offload_states: that depends on the critic too, and only adds)."""
    placed: TrainedPlacement = trained_model(ctx, "actor", block, 1)
    without_generation = role_seconds(ctx, "actor", block, False, False, batches)
    without_generation -= generation_phase(ctx, placed, False, batches[0]).time_s
    return max(0.0, without_generation) + engine_seconds(ctx, rollout, block.zero_stage == 3)


def engine_floor_bytes(ctx: RLHFContext, rollout: RolloutStrategy) -> int:
    """The least GPU bytes the engine holds awake: at the least utilization that holds the rollout's KV cache,
    started on an empty GPU (what it leaves the trainer only lowers the most it may take). 0 on GPUs of its own."""
    if not rollout.colocated:
        return 0
    return _engine_floor(ctx, rollout)


@lru_cache(maxsize=1024)
def _engine_floor(ctx: RLHFContext, rollout: RolloutStrategy) -> int:
    w, hw = ctx.workload, ctx.hardware
    limits = engine_limits(rollout.engine, hw.gpu_memory_bytes, hw.gpu.name, w.framework)
    running = min(replica_sequences(ctx, rollout), limits.max_num_seqs)
    fitting = utilization_span(ctx, rollout, running, 2**62, hw.gpu_memory_bytes)
    if fitting is None:
        return 2**62  # it cannot hold the rollout on this GPU at all
    memory = engine_memory_at(
        rollout,
        model=w.model,
        dtype=w.dtype,
        gpu_memory_bytes=hw.gpu_memory_bytes,
        utilization=fitting[0],
        limits=limits,
        max_model_len=ctx.job.seq_len,
        free_bytes_at_start=hw.gpu_memory_bytes,
        coef=ctx.coef,
    )
    return memory.awake if memory is not None else 2**62


@lru_cache(maxsize=4096)
def offloadable_bound(ctx: RLHFContext, role: str, block: TrainedModelStrategy | FrozenModelStrategy) -> int:
    """The most DeepSpeed's offload_states can move off the GPU for the rollout from one model (see
    :func:`search.rlhf.engine_step.offloadable_states`): a trained model's optimizer states and ZeRO-3 gradients."""
    if role in ("reference", "reward") or not isinstance(block, TrainedModelStrategy):
        return 0
    p = trained_model(ctx, role, block, 1)
    return p.states.optimizer_states + p.persistent_gradients
