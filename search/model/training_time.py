"""Seconds of one optimizer step of a trained model: micro-steps, ZeRO collectives, offload traffic, Adam.

One accounting for the single model of sft/reward/dpo and for the actor and critic of RLHF. Compute is
``search.model.timing.compute_time`` of the forward and backward FLOPs (full recompute adds a forward); the
collectives, PCIe/NVMe traffic and the GPU or CPU Adam step follow the layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search.coefficients import Coefficients
from search.model.placement import TrainedPlacement
from search.model.shapes import forward_flops, lora_params
from search.model.timing import (
    collective_time,
    compute_time,
    cpu_adam_time,
    gpu_adam_time,
    nvme_time,
    pcie_time,
    zero_comm_bytes,
)
from store.records import DTYPE_BYTES, Hardware


@dataclass(frozen=True)
class TrainingSeconds:
    """Seconds of one optimizer step of one trained model (callers multiply by RLHF's ``ppo_epochs``)."""

    forward: float  # one micro-step's forward
    backward: float  # one micro-step's backward, with the recompute of checkpointed layers
    communication: float  # ZeRO's collectives over the whole optimizer step
    offload: float  # PCIe (and NVMe) traffic of offloaded gradients, states and parameters
    optimizer: float  # the Adam step, on the GPU or the CPU
    grad_accum: int

    @property
    def compute(self) -> float:
        """Forward and backward of every micro-step."""
        return self.grad_accum * (self.forward + self.backward)

    @property
    def total(self) -> float:
        return self.compute + self.communication + self.offload + self.optimizer


@lru_cache(maxsize=4096)
def training_time(
    trained: TrainedPlacement,
    micro_batch: int,
    grad_accum: int,
    seq_len: int,
    dtype: str,
    hardware: Hardware,
    coef: Coefficients,
) -> TrainingSeconds:
    """Seconds of one optimizer step of ``grad_accum`` micro-steps of ``micro_batch`` sequences each."""
    s, model = trained.layout, trained.model
    n, d = hardware.world_size, DTYPE_BYTES[dtype]
    tokens = micro_batch * seq_len
    flops_fwd = forward_flops(model, micro_batch, seq_len, lm_head=trained.lm_head)
    # full fine-tune: activation and weight gradients; LoRA: activation gradients and the adapters only
    flops_bwd = flops_fwd + 4.0 * lora_params(model, s.lora_rank) * tokens if s.lora_rank else 2.0 * flops_fwd
    recompute = flops_fwd if s.gradient_checkpointing else 0.0
    forward = compute_time(flops_fwd, tokens, dtype, hardware, coef)
    backward = compute_time(flops_bwd + recompute, tokens, dtype, hardware, coef)
    passes = 3 if s.gradient_checkpointing else 2
    comm = collective_time(
        zero_comm_bytes(
            zero_stage=s.zero_stage,
            trainable=trained.trainable,
            resident=trained.resident,
            dtype=dtype,
            world_size=n,
            grad_accum=grad_accum,
            passes=passes,
        ),
        hardware,
        coef,
    )
    offload = 0.0
    t = trained.trainable
    if s.offload_optimizer != "none":
        grads_down = 4 * t / n * (grad_accum if s.zero_stage >= 2 else 1)
        offload += pcie_time(grads_down + 4 * t / n, hardware, coef)
        if s.offload_optimizer == "nvme" and s.zero_stage == 3:
            offload += nvme_time(2 * 16 * t / n * hardware.gpus, coef)
    if s.offload_param != "none":
        fetched = passes * d * trained.resident / n * grad_accum
        offload += pcie_time(fetched, hardware, coef)
        if s.offload_param == "nvme":
            offload += nvme_time(fetched * hardware.gpus, coef)
    if s.offload_optimizer != "none":
        optimizer = cpu_adam_time(t // n, hardware, coef)
    else:
        optimizer = gpu_adam_time(t if s.zero_stage == 0 else t // n, hardware, coef)
    return TrainingSeconds(forward, backward, comm, offload, optimizer, grad_accum)
