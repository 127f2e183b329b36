"""The single-model strategy space: which knobs exist for a workload on given hardware.

The space splits in two. Outer knobs (ZeRO stage, offload, checkpointing, LoRA rank) choose the memory
layout and the kind of compute; the Optuna study explores them. Inner knobs (micro-batch with its
accumulation, ``empty_cache`` policy, allocator) scale what that layout holds; for each outer point the
fastest inner choice that fits is found exactly (a few dozen cheap predictions).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from search.batches import micro_batches, per_gpu_batch
from store.loss_chunks import LOSSES
from store.records import Hardware, Strategy, Workload
from store.workload_kinds import traits


@dataclass(frozen=True)
class OuterPoint:
    """One choice of the outer knobs."""

    zero_stage: int
    offload_optimizer: str
    offload_param: str
    gradient_checkpointing: bool
    lora_rank: int
    quantization: str = "none"  # QLoRA's base weights (store.quantization): with LoRA only; ZeRO-3: nf4 only


def offload_targets(hardware: Hardware) -> tuple[str, ...]:
    """Offload devices available: NVMe only when the user named a path for it."""
    return ("none", "cpu", "nvme") if hardware.nvme_path else ("none", "cpu")


Inner = tuple[int, int, str, str, str]  # micro_batch, grad_accum, empty_cache, allocator, loss


def inner_choices(workload: Workload, hardware: Hardware) -> list[Inner]:
    """(micro_batch, grad_accum, empty_cache, allocator, loss) worth distinguishing, simplest first. A chunked
    loss is offered for sft (its loss is the causal LM's cross-entropy over the logits; the preference losses
    of dpo read log-probabilities through other code, and a reward model has no vocabulary head)."""
    per_gpu = per_gpu_batch(workload, hardware)
    implies = traits(workload.kind)
    policies = ["never", "every-step", "after-phase"]
    if implies.reference_forward:
        policies.insert(1, "after-inference")  # the reference forward is an inference phase
    if workload.framework in ("hf", "trl"):
        # TrainingArguments.torch_empty_cache_steps (transformers 5.23 trainer.py training_step) is the one place
        # the Trainer, and TRL's trainers that subclass it, call empty_cache: every N optimizer steps
        policies = ["never", "every-step"]
    losses = LOSSES if implies.causal_lm_loss else ("hf",)
    if workload.framework == "trl":
        losses = ("hf",)  # TRL's fused log-prob head is its loss; its trainers refuse Liger's (sft_trainer.py)
    return [
        (micro, per_gpu // micro, policy, allocator, loss)
        for loss in losses
        for micro in reversed(micro_batches(workload, hardware))
        for allocator in ("default", "expandable-segments")
        for policy in policies
    ]


def quantizations_of(lora_rank: int, zero_stage: int, searched: tuple[str, ...]) -> tuple[str, ...]:
    """The base-weight quantizations of ``searched`` valid at a LoRA rank and ZeRO stage: QLoRA needs LoRA, and
    under ZeRO-3 only nf4 is planned (``store.records.quantization_problems``)."""
    return tuple(q for q in searched if q == "none" or (lora_rank > 0 and (zero_stage != 3 or q == "nf4")))


def outer_points(
    workload: Workload, hardware: Hardware, lora_ranks: tuple[int, ...], quantizations: tuple[str, ...] = ("none",)
) -> Iterator[OuterPoint]:
    """Every valid outer point, in a fixed order (the exhaustive enumeration tests compare against).
    ``quantizations``: the base weights searched ("none": 16-bit; QLoRA's "nf4" only where a caller asks, a
    different training recipe that the planner falls back to when no 16-bit plan fits)."""
    per_gpu_batch(workload, hardware)  # the batch must split over the GPUs
    targets = offload_targets(hardware)
    for lora_rank in lora_ranks:
        for zero_stage in (0, 1, 2, 3):
            # ZeRO-1/2 treat nvme like cpu (stage_1_and_2.py only checks device != none): cpu only there.
            for offload_optimizer in targets if zero_stage == 3 else ("none", "cpu") if zero_stage else ("none",):
                for offload_param in targets if zero_stage == 3 and offload_optimizer != "none" else ("none",):
                    for checkpointing in (False, True):
                        for quantization in quantizations_of(lora_rank, zero_stage, quantizations):
                            yield OuterPoint(
                                zero_stage, offload_optimizer, offload_param, checkpointing, lora_rank, quantization
                            )


def strategy_at(point: OuterPoint, inner: Inner) -> Strategy:
    """The full strategy of an outer point with one inner choice."""
    micro_batch, grad_accum, empty_cache, allocator, loss = inner
    return Strategy(
        zero_stage=point.zero_stage,
        offload_optimizer=point.offload_optimizer,
        offload_param=point.offload_param,
        gradient_checkpointing=point.gradient_checkpointing,
        lora_rank=point.lora_rank,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        empty_cache=empty_cache,
        allocator=allocator,
        loss=loss,
        quantization=point.quantization,
    )


def all_strategies(
    workload: Workload, hardware: Hardware, lora_ranks: tuple[int, ...], quantizations: tuple[str, ...] = ("none",)
) -> Iterator[Strategy]:
    """The whole space, outer x inner: what an exhaustive search would try."""
    for point in outer_points(workload, hardware, lora_ranks, quantizations):
        for inner in inner_choices(workload, hardware):
            yield strategy_at(point, inner)
