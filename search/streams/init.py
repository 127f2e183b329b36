"""What a trained model's DeepSpeed engine asks torch's allocator for while it starts, and at its first step.

The resident bytes of a model (:mod:`search.model.states`) are not made in one go: the allocator sees the
copies DeepSpeed makes and drops on the way, and those leave blocks cached. From DeepSpeed's code
(``runtime/zero/stage_1_and_2.py``, ``runtime/fp16/fused_optimizer.py``, ``runtime/zero/stage3.py``):

- The engine moves the built model to the device tensor by tensor (``originals``).
- ZeRO-1/2: ``flatten_dense_tensors_aligned`` makes one flat 16-bit buffer, and ``_update_model_bit16_weights``
  points every ``p.data`` into it, freeing the originals. The fp32 master partition is
  ``partition.detach().clone().to(fp32)``: a 16-bit clone (``before_master``) exists while the fp32 copy is
  made. ``initialize_optimizer_states`` then sets a zero fp32 gradient of the partition and drops it
  (``after_master``).
- ZeRO-0 with a 16-bit dtype: FP16_Optimizer (the engine's wrapper for bf16 too, unless the gradient
  accumulation dtype differs) flattens clones of every weight (freed with the originals), makes the fp32
  master as ``flat.clone().float()`` (a 16-bit clone again), and its ``initialize_optimizer_states`` sets a
  zero fp32 gradient and steps the optimizer once: Adam's states are made at init (``at_init``).
- ZeRO-3: partitioning frees every original weight; the fp32 partition is made from the 16-bit one.
- Adam's ``exp_avg`` and ``exp_avg_sq`` (8 bytes per trainable parameter of the partition) are made by the
  first ``optimizer.step()`` (``lazy``), not at init, except under FP16_Optimizer: on the device after that
  step's gradients.

With the optimizer offloaded, the fp32 master, its gradient and Adam's states live on the host; ZeRO-1/2 still
make the 16-bit clone of the partition on the device before the fp32 copy goes to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.model.placement import TrainedPlacement
from search.model.states import init_cached_bytes
from store.records import DTYPE_BYTES


@dataclass(frozen=True)
class EngineInit:
    """One trained engine's allocations at init and at its first step, beyond its resident bytes."""

    originals: int  # the weights as loaded, freed once DeepSpeed holds its own copies
    before_master: int  # the 16-bit clone alive while the fp32 master copy is made
    after_master: tuple[int, ...]  # made and dropped once the master exists (the zero fp32 gradient)
    lazy: int  # Adam's states, made at the first optimizer step (part of the resident optimizer states)
    at_init: int = 0  # Adam's states made at init instead, while the zero fp32 gradient exists


def engine_init(placed: TrainedPlacement, dtype: str) -> EngineInit:
    """The init and first-step allocations of ``placed`` (see the module docstring)."""
    s = placed.layout
    d = DTYPE_BYTES[dtype]
    t, n = placed.trainable, placed.world_size
    originals = init_cached_bytes(
        trainable=t, resident=placed.resident, dtype=dtype, zero_stage=s.zero_stage, offload_param=s.offload_param
    )
    mixed = dtype != "fp32"
    partition = t if s.zero_stage == 0 else t // n
    if s.offload_optimizer != "none" or placed.states.optimizer_states == 0:
        # ZeRO-1/2 clone the 16-bit partition on the device before moving the fp32 copy to the host
        clone = d * partition if s.zero_stage in (1, 2) and s.offload_optimizer != "none" else 0
        return EngineInit(originals, clone, (), 0)
    lazy = 8 * partition
    if s.zero_stage == 0 and mixed:
        # FP16_Optimizer (bf16 too): its initialize_optimizer_states sets a zero fp32 gradient and runs the
        # optimizer once, so Adam's states exist from init
        return EngineInit(originals, d * partition, (4 * partition,), 0, lazy)
    if s.zero_stage == 0:
        return EngineInit(originals, 0, (), lazy)
    if s.zero_stage in (1, 2):
        return EngineInit(originals, d * partition, (4 * partition,), lazy)
    return EngineInit(originals, 0, (), lazy)
