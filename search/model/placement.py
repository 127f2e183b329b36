"""Where one model of a step lives: a trained model's states and buffers, a frozen model's weights.

A trained model (the single model of sft/reward/dpo, the actor or critic of RLHF) is laid out by
:func:`search.model.states.model_states` and :func:`search.model.zero_buffers.zero_workspace`; a frozen model
(reference, reward) holds 16-bit weights only: whole, 1/N under ZeRO-3, or on the host between forwards
when offloaded (a gathered layer while they run). Cached on their (hashable) arguments: a search places
thousands of strategies that share these pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from search.coefficients import Coefficients
from search.model.activations import Activations, LossLogits, activations, loss_logits
from search.model.fused_head import trl_loss_logits
from search.model.micro_batch import MicroBatchContext
from search.model.moments import Moment, TrainingMoments, between_micro_steps, training_moments
from search.model.quantized import (
    dequant_workspace,
    quant_constants_bytes,
    quantized_base_bytes,
    zero3_frozen_elements,
)
from search.model.shapes import largest_module_params, resident_params, trainable_params
from search.model.states import ModelStates, model_states
from search.model.zero_buffers import ZeroWorkspace, zero_workspace
from store.ds_buckets import ZeroBuckets
from store.ds_defaults import buckets_of, zero3_buckets
from store.records import DTYPE_BYTES, FrozenModelStrategy, ModelSpec, TrainedModelStrategy


@dataclass(frozen=True, eq=False)
class TrainedPlacement:
    """A trained model (single, actor or critic) under its layout (one object per inputs: hashed by identity)."""

    model: ModelSpec
    lm_head: bool
    layout: TrainedModelStrategy
    trainable: int
    # parameters held (base model plus adapters); ZeRO-3 QLoRA: the elements DeepSpeed holds, packed codes
    # counted as their compute-dtype storage (search.model.quantized.zero3_frozen_elements)
    resident: int
    states: ModelStates
    work: ZeroWorkspace  # DeepSpeed's working buffers around the states, and when they exist
    buffers: int  # DeepSpeed's buffers resident for this engine, without the shared cuBLAS workspace
    grad_accum: int
    world_size: int

    @property
    def persistent_gradients(self) -> int:
        """ZeRO-3's gradient partition buffer: allocated by the optimizer at init and kept for the whole run."""
        return self.states.gradients if self.layout.zero_stage == 3 else 0

    @property
    def carried(self) -> Moment:
        """Bytes alive between this model's micro-steps beyond its resident ones (accumulated gradients,
        ZeRO-1's reduce buckets), which the other trained model's interleaved micro-steps find live."""
        return between_micro_steps(self.work)


@lru_cache(maxsize=1024)
def trained_placement(
    model: ModelSpec,
    lm_head: bool,
    layout: TrainedModelStrategy,
    dtype: str,
    world_size: int,
    grad_accum: int,
    coef: Coefficients,
    ds_buckets: ZeroBuckets | None = None,
) -> TrainedPlacement:
    """Model states and buckets of a trained model, exactly as for single-model training; ``ds_buckets``: a
    user's config's bucket settings (None: memplan's own, ``store.ds_defaults``)."""
    trainable = trainable_params(model, layout.lora_rank, lm_head=lm_head)
    resident = resident_params(model, layout.lora_rank, lm_head=lm_head)
    buckets = buckets_of(ds_buckets, model, layout.zero_stage)
    quantized = layout.quantization != "none"
    zero3_quantized = quantized and layout.zero_stage == 3
    if zero3_quantized:  # DeepSpeed partitions the packed codes as compute-dtype elements; constants stay whole
        resident = trainable + zero3_frozen_elements(model, layout.quantization, dtype, lm_head=lm_head)
    frozen_bytes = (
        quantized_base_bytes(model, layout.quantization, dtype, lm_head=lm_head)
        if quantized and not zero3_quantized
        else None
    )
    states = model_states(
        model=model,
        trainable=trainable,
        frozen=resident - trainable,
        dtype=dtype,
        zero_stage=layout.zero_stage,
        offload_optimizer=layout.offload_optimizer,
        offload_param=layout.offload_param,
        world_size=world_size,
        grad_accum=grad_accum,
        sub_group_size=buckets.sub_group_size,
        frozen_bytes=frozen_bytes,
    )
    work = zero_workspace(
        model=model,
        trainable=trainable,
        dtype=dtype,
        zero_stage=layout.zero_stage,
        offload_optimizer=layout.offload_optimizer,
        world_size=world_size,
        grad_accum=grad_accum,
        lora_rank=layout.lora_rank,
        lm_head=lm_head,
        coef=coef,
        buckets=buckets,
    )
    if quantized:  # the backward's dequantized 16-bit weight (search.model.quantized), held as a working buffer
        work = replace(work, resident=work.resident + dequant_workspace(model, dtype))
    if zero3_quantized:  # and every weight's QuantState, whole on each GPU beside the partitions
        work = replace(work, resident=work.resident + quant_constants_bytes(model, layout.quantization))
    # ZeRO-1/2's reduce buckets exist only while a backward runs: they are part of the training moments
    buffers = work.resident - int(coef.cublas_workspace_bytes)
    return TrainedPlacement(
        model=model,
        lm_head=lm_head,
        layout=layout,
        trainable=trainable,
        resident=resident,
        states=states,
        work=work,
        buffers=buffers,
        grad_accum=grad_accum,
        world_size=world_size,
    )


@dataclass(frozen=True)
class MicroStep:
    """One micro-batch of a placed trained model: its activations, its logits and the moments of its training."""

    acts: Activations
    logits: LossLogits
    moments: TrainingMoments


@lru_cache(maxsize=4096)
def micro_step(placed: TrainedPlacement, batch: MicroBatchContext) -> MicroStep:
    """Forward, backward and optimizer-step moments of one micro-batch through ``placed``
    (:func:`search.model.moments.training_moments`); a model without an LM head has no logits; with TRL's fused
    log-prob head (``batch.head``, :mod:`search.model.fused_head`) the head's tensors stand for the logits."""
    s, model, b = placed.layout, placed.model, batch
    acts = activations(
        model,
        b.sequences,
        b.seq_len,
        b.dtype,
        b.attn_impl,
        checkpointing=s.gradient_checkpointing,
        coef=b.coef,
        lora_rank=s.lora_rank,
    )
    logits = (
        trl_loss_logits(b.head)
        if b.head is not None and placed.lm_head
        else loss_logits(
            model,
            b.sequences,
            b.seq_len,
            b.dtype,
            b.coef,
            holds_output=b.holds_output,
            attn_impl=b.attn_impl,
            loss=b.loss,
            checkpointing=s.gradient_checkpointing,
            lora_rank=s.lora_rank,
            policy=b.policy,
        )
        if placed.lm_head
        else LossLogits(0, 0, 0)
    )
    return MicroStep(acts, logits, training_moments(placed, b, acts, logits))


@dataclass(frozen=True, eq=False)
class FrozenPlacement:
    """A frozen model (reference or reward) under its block (one object per inputs: hashed by identity)."""

    model: ModelSpec
    lm_head: bool
    block: FrozenModelStrategy
    params: int  # parameters of the whole model
    resident: int  # 16-bit bytes on the GPU between its forwards
    gathered: int  # bytes gathered while its own forward runs (ZeRO-3: a module plus the prefetch bucket)
    host: int  # 16-bit bytes per GPU held in host memory (offloaded partition)


@lru_cache(maxsize=1024)
def frozen_placement(
    model: ModelSpec,
    lm_head: bool,
    block: FrozenModelStrategy,
    dtype: str,
    world_size: int,
    prefetch_bucket_size: int | None = None,
) -> FrozenPlacement:
    """16-bit weights whole (ZeRO-0), partitioned (ZeRO-3) or on the host (ZeRO-3 + offload). Under ZeRO-3 its
    forward gathers the live module and up to ``prefetch_bucket_size`` parameters ahead (None: memplan's config's,
    ``store.ds_defaults.zero3_buckets``; a framework that builds its own config passes its own:
    ``store.frameworks.framework_frozen_buckets``)."""
    d = DTYPE_BYTES[dtype]
    params = resident_params(model, 0, lm_head=lm_head)
    if block.zero_stage == 0:
        return FrozenPlacement(model, lm_head, block, params, d * params, 0, 0)
    prefetch = zero3_buckets(model).prefetch_bucket_size if prefetch_bucket_size is None else prefetch_bucket_size
    gathered = d * (largest_module_params(model) + prefetch)
    partition = d * params // world_size
    if block.offload != "none":
        return FrozenPlacement(model, lm_head, block, params, 0, gathered, partition)
    return FrozenPlacement(model, lm_head, block, params, partition, gathered, 0)


def ema_bytes(actor: TrainedPlacement, dtype: str, world_size: int) -> tuple[int, int]:
    """(GPU, host per GPU) bytes of DeepSpeed-Chat's ``--enable_ema`` copy: 16-bit, placed like the actor."""
    d = DTYPE_BYTES[dtype]
    layout = actor.layout
    if layout.zero_stage != 3:
        return d * actor.resident, 0
    partition = d * actor.resident // world_size
    return (0, partition) if layout.offload_param != "none" else (partition, 0)
