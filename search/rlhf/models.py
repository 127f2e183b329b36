"""Where the four models of an RLHF step live, and the bytes that stay resident through every phase.

Each role's model is ``Workload.model_for(role)``; trained models (actor, critic) are placed exactly as a
single trained model is (:mod:`search.model.placement`), frozen ones (reference, reward) by their block. A frozen
role the workload does not hold is None: no reference at a KL coefficient of 0 (``Workload.holds_reference``), no
reward model with rule-based rewards (``Workload.holds_reward_model``): no bytes, no scoring forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search.model.fused_head import workload_head
from search.model.host import LOADING, STEADY, HostMemory, add_parts, per_node, trained_host
from search.model.kernels import gpu_attention
from search.model.micro_batch import MicroBatchContext
from search.model.placement import (
    FrozenPlacement,
    TrainedPlacement,
    ema_bytes,
    frozen_placement,
    trained_placement,
)
from search.model.states import init_cached_bytes
from search.rlhf.job import RLHFContext
from search.rlhf.memory import experience_bytes
from search.streams.sizes import Sizes, resident_sizes, sizes_of, weight_tensors
from search.streams.workspaces import backward_workspace
from store.ds_defaults import OVERLAP_COMM
from store.frameworks import framework_buckets, framework_frozen_buckets, reference_through_actor
from store.model_build import builds_partitioned
from store.records import DTYPE_BYTES, FrozenModelStrategy, TrainedModelStrategy, Workload


@dataclass(frozen=True, eq=False)
class Models:
    """Where the step's four models live, and the bytes that stay resident through every phase."""

    actor: TrainedPlacement
    critic: TrainedPlacement | None
    reference: FrozenPlacement | None  # None: KL coefficient 0, or TRL's LoRA actor with adapters off is the reference
    reward: FrozenPlacement | None  # None: rule-based rewards, no reward model
    resident: dict[str, int]
    host: HostMemory  # host memory per node by phase and part
    host_states: int  # bytes per GPU in host memory (offloaded states, staging buffers), without slack

    @property
    def host_bytes(self) -> int:
        """Host memory per node: the larger of the steady and loading phases."""
        return self.host.bytes

    @property
    def trained(self) -> list[TrainedPlacement]:
        return [self.actor] + ([self.critic] if self.critic else [])

    @property
    def frozen(self) -> list[FrozenPlacement]:
        """The frozen models the step holds (reference, reward), in that order."""
        return [p for p in (self.reference, self.reward) if p is not None]


@lru_cache(maxsize=4096)
def trained_model(ctx: RLHFContext, role: str, layout: TrainedModelStrategy, grad_accum: int) -> TrainedPlacement:
    """The actor (LM head) or the critic (scalar head) under ``layout``. Only its gradients depend on the
    accumulation: generation, scoring and resident bytes use ``grad_accum=1``."""
    w = ctx.workload
    model = w.model_for(role)
    # a framework that builds its own DeepSpeed config runs its own buckets (OpenRLHF: store.frameworks); the
    # plan's overlap_comm reaches it (--ds.overlap_comm, launch.frameworks.openrlhf)
    buckets = framework_buckets(w.framework, layout.zero_stage, model.hidden_size, OVERLAP_COMM)
    return trained_placement(
        model,
        role == "actor",
        layout,
        w.dtype,
        world_size=ctx.hardware.world_size,
        grad_accum=grad_accum,
        coef=ctx.coef,
        ds_buckets=buckets,
    )


def role_micro_batch(ctx: RLHFContext, role: str, lora_rank: int, micro_batch: int) -> MicroBatchContext:
    """One training micro-batch of the actor (its loss built on the token log-probs: ``policy``) or the critic:
    ``micro_batch`` sequences of the step's length; TRL's GRPOTrainer scores the actor's tokens through its
    fused log-prob head (:func:`search.model.fused_head.workload_head`)."""
    w, actor = ctx.workload, role == "actor"
    head = workload_head(w, lora_rank, micro_batch, ctx.job.seq_len) if actor else None
    return MicroBatchContext(
        sequences=micro_batch,
        seq_len=ctx.job.seq_len,
        dtype=w.dtype,
        attn_impl=gpu_attention(w.attn_impl, w.dtype, ctx.hardware, w.model_for(role).head_dim),
        coef=ctx.coef,
        loss="hf" if head is None else "trl",
        head=head,
        policy=actor,
    )


@lru_cache(maxsize=1024)
def frozen_model(ctx: RLHFContext, role: str, block: FrozenModelStrategy) -> FrozenPlacement | None:
    """The reference (LM head) or the reward model (scalar head) under ``block``; None when the workload holds
    no such model (:func:`holds_role`)."""
    w = ctx.workload
    if not holds_role(w, role):
        return None
    model = w.model_for(role)
    # a framework that builds its own config for frozen models gathers ahead by its own prefetch bucket
    # (OpenRLHF's get_eval_ds_config: store.frameworks.framework_frozen_buckets)
    own = framework_frozen_buckets(w.framework, model.hidden_size)
    prefetch = None if own is None else own.prefetch_bucket_size
    return frozen_placement(model, role == "reference", block, w.dtype, ctx.hardware.world_size, prefetch)


def partitioned(workload: Workload, model_bytes: int, device_bytes: int) -> bool:
    """Whether the program builds a ZeRO-3 model of ``model_bytes`` partitioned (:func:`builds_partitioned`)."""
    return builds_partitioned(
        workload.framework, model_bytes=model_bytes, device_bytes=device_bytes, model_build=workload.model_build
    )


def holds_role(workload: Workload, role: str) -> bool:
    """Whether the step loads the frozen model of ``role``: the reference unless the KL coefficient is 0, the
    reward model unless the rewards come from rules (``Workload.role_models``)."""
    if role == "reference":
        return workload.holds_reference
    if role == "reward":
        return workload.holds_reward_model
    return True


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
    if reference_through_actor(w.framework, w.kind, w.holds_reference, actor_layout.lora_rank):
        reference = None  # TRL: the LoRA actor with its adapters off is the reference (search.rlhf.scoring)
    trained = [actor] + ([critic] if critic else [])
    ema_gpu, ema_host = ema_bytes(actor, dtype, n) if ema else (0, 0)
    resident = {
        "parameters": sum(p.states.parameters for p in trained),
        "optimizer_states": sum(p.states.optimizer_states for p in trained),
        "gradients": sum(p.persistent_gradients for p in trained),  # ZeRO-3's partitions, kept from init on
        **({"reference_model": reference.resident} if reference is not None else {}),
        **({"reward_model": reward.resident} if reward is not None else {}),
        "ema": ema_gpu,
        "experience": experience_bytes(ctx.job.sequences_per_gpu, ctx.job.seq_len, dtype),
        "buffers": int(coef.cublas_workspace_bytes) + sum(p.buffers for p in trained),
        **backward_workspace(coef),
    }
    # Host per node (search.model.host): offloaded states with DeepSpeed's pinned buffers and the estimators'
    # slack, offloaded frozen weights and EMA copy through training; or, when larger, every local rank loading
    # one model's 16-bit copy before training (one model at a time): its partition where the program builds it
    # under zero.Init (store.model_build; search.rlhf.build_notes cites the frozen models' builds), else whole.
    g, device = ctx.hardware.gpus, ctx.hardware.gpu_memory_bytes
    steady = add_parts(*(trained_host(p, coef) for p in trained))
    frozen = [p for p in (reference, reward) if p is not None]
    frozen_host = sum(p.host for p in frozen)
    steady.update(frozen_models=frozen_host, ema=ema_host)
    loading = max(
        [
            d * p.resident // (n if p.layout.zero_stage == 3 and partitioned(w, d * p.resident, device) else 1)
            for p in trained
        ]
        + [
            d * p.params // (n if p.block.zero_stage == 3 and partitioned(w, d * p.params, device) else 1)
            for p in frozen
        ]
    )
    host = HostMemory({STEADY: per_node(steady, g), LOADING: {"model_loading": loading * g}})
    host_states = sum(p.states.host + p.work.host for p in trained) + frozen_host + ema_host
    return Models(actor, critic, reference, reward, resident, host, host_states)


@lru_cache(maxsize=4096)
def models_resident_sizes(ctx: RLHFContext, models: Models) -> Sizes:
    """The tensor sizes of the step's resident parts: the trained models' weights (flat under ZeRO-1/2
    without LoRA), their fp32 states as flat partitions, the frozen models' weights tensor by tensor."""
    dtype = ctx.workload.dtype
    weights: tuple[int, ...] = ()
    states: tuple[int, ...] = ()
    for p in models.trained:
        s = p.layout
        weights += resident_sizes(p.model, dtype, s.lora_rank, flat=s.zero_stage in (1, 2) and not s.lora_rank)
        states += (p.states.optimizer_states // 3,) * 3
    frozen = {
        f"{role}_model": weight_tensors(p.model, dtype)
        for role, p in (("reference", models.reference), ("reward", models.reward))
        if p is not None
    }
    return sizes_of(parameters=weights, optimizer_states=states, **frozen)


def trained_init_cached(p: TrainedPlacement, dtype: str) -> int:
    """What one trained model's engine init leaves cached (:func:`search.model.states.init_cached_bytes`)."""
    s = p.layout
    return init_cached_bytes(
        trainable=p.trainable, resident=p.resident, dtype=dtype, zero_stage=s.zero_stage, offload_param=s.offload_param
    )


def models_init_cached(models: Models, dtype: str) -> int:
    """The step's init-cached bytes: the second engine's init reuses the first's freed blocks of the same
    sizes, so the larger of the trained models' stays."""
    return max(trained_init_cached(p, dtype) for p in models.trained)
