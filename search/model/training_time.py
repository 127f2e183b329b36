"""Seconds of one optimizer step of a trained model: micro-steps, ZeRO collectives, offload traffic, Adam.

One accounting for the single model of sft/reward/dpo and for the actor and critic of RLHF, from
mechanisms (:mod:`search.model.roofline`): each micro-step's forward and backward take the longer of the
GPU's work and the host's kernel issuing, the backward adds the recompute of checkpointed layers and
DeepSpeed's per-gradient hooks (and, with optimizer offload, the gradients' copy to the host over PCIe); under
ZeRO-3 both passes add its module hooks and the backward its gradient hooks (:mod:`search.model.zero3_time`); the
optimizer step is the fused Adam's HBM traffic against DeepSpeed's per-tensor step loop, or CPU Adam over
host memory and the 16-bit parameters' copy back; gradient accumulation repeats forward and backward only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from search.coefficients import Coefficients
from search.model.passes import (
    backward_pass,
    chunked_loss_extra,
    forward_pass,
    fused_head_extra,
    trainable_tensors,
)
from search.model.placement import TrainedPlacement
from search.model.quantized import dequant_seconds, forward_dequantizes
from search.model.roofline import PassSeconds, add_terms, hbm_seconds, host_seconds
from search.model.timing import collective_time, nvme_time, pcie_time, zero_comm_bytes
from search.model.zero3_time import zero3_offload, zero3_passes
from store.records import DTYPE_BYTES, GPUSpec, Hardware


@dataclass(frozen=True)
class TrainingSeconds:
    """Seconds of one optimizer step of one trained model (callers multiply by RLHF's ``ppo_epochs``)."""

    forward: float  # one micro-step's forward
    backward: float  # one micro-step's backward, with the recompute, DeepSpeed's hooks and offload copies
    communication: float  # ZeRO's collectives over the whole optimizer step
    offload: float  # NVMe traffic and parameter-offload fetches (PCIe gradient copies are in the backward)
    optimizer: float  # the Adam step, on the GPU or the CPU, with the parameters' copy back
    grad_accum: int
    terms: dict[str, float] = field(default_factory=dict)  # the whole step's seconds by mechanism

    @property
    def compute(self) -> float:
        """Forward and backward of every micro-step."""
        return self.grad_accum * (self.forward + self.backward)

    @property
    def total(self) -> float:
        return self.compute + self.communication + self.offload + self.optimizer


@lru_cache(maxsize=4096)
def _model_passes(
    trained: TrainedPlacement, micro_batch: int, seq_len: int, dtype: str, gpu: GPUSpec, coef: Coefficients, loss: str
) -> tuple[PassSeconds, PassSeconds]:
    """The forward and backward of one micro-step of the model itself: its kernels, the checkpointed recompute
    and hooks, QLoRA's dequantization, and the chunked or fused loss head (before DeepSpeed's own work)."""
    s, model = trained.layout, trained.model
    rank = s.lora_rank
    fwd = forward_pass(model, micro_batch, seq_len, dtype, gpu, coef, lora_rank=rank, lm_head=trained.lm_head)
    bwd = backward_pass(model, micro_batch, seq_len, dtype, gpu, coef, lora_rank=rank, lm_head=trained.lm_head)
    if s.gradient_checkpointing:  # the checkpointed layers run their forward again inside the backward
        bwd = bwd + forward_pass(
            model, micro_batch, seq_len, dtype, gpu, coef, lora_rank=rank, lm_head=trained.lm_head, loss=False
        )
        # torch's checkpoint machinery around every layer: host work in units of the forward's own
        issue = fwd.host["host_launch"]
        fwd = fwd + PassSeconds(host={"checkpoint_hooks": coef.checkpoint_forward_overhead * issue})
        bwd = bwd + PassSeconds(host={"checkpoint_hooks": coef.checkpoint_backward_overhead * issue})
    if s.quantization != "none":  # the input gradient dequantizes every block linear (search.model.quantized)
        dequant = dequant_seconds(model, s.quantization, dtype, gpu, coef)
        bwd = bwd + dequant
        if forward_dequantizes(s.quantization, micro_batch * seq_len):  # and so does a forward past the fused rows
            fwd = fwd + dequant
            if s.gradient_checkpointing:  # the recompute's forward
                bwd = bwd + dequant
    if loss == "chunked" and trained.lm_head:
        bwd = bwd + chunked_loss_extra(model, micro_batch, seq_len, dtype, gpu, coef, rank)
    if loss == "trl" and trained.lm_head:
        bwd = bwd + fused_head_extra(model, micro_batch, seq_len, dtype, gpu, rank)
    return fwd, bwd


def _offload_seconds(
    trained: TrainedPlacement, dtype: str, grad_accum: int, passes: int, hardware: Hardware, coef: Coefficients
) -> float:
    """Seconds a step moves offloaded states: ZeRO-Infinity's optimizer states to and from NVMe, and the 16-bit
    parameters fetched from the host (and NVMe) on each of the step's ``passes`` over them."""
    s, t, n, d = trained.layout, trained.trainable, hardware.world_size, DTYPE_BYTES[dtype]
    offload = 0.0
    if s.offload_optimizer == "nvme" and s.zero_stage == 3:
        offload += nvme_time(2 * 16 * t / n * hardware.gpus, coef)
    if s.offload_param != "none":
        fetched = passes * d * trained.resident / n * grad_accum
        offload += pcie_time(fetched, hardware, coef)
        if s.offload_param == "nvme":
            offload += nvme_time(fetched * hardware.gpus, coef)
    return offload


def training_time(
    trained: TrainedPlacement,
    micro_batch: int,
    grad_accum: int,
    seq_len: int,
    dtype: str,
    hardware: Hardware,
    coef: Coefficients,
    loss: str = "hf",
) -> TrainingSeconds:
    """Seconds of one optimizer step of ``grad_accum`` micro-steps of ``micro_batch`` sequences each
    (``loss``: the strategy's loss knob, ``"hf"`` or ``"chunked"``, or ``"trl"``: TRL's fused head)."""
    s, model, gpu = trained.layout, trained.model, hardware.gpu
    n, d = hardware.world_size, DTYPE_BYTES[dtype]
    t = trained.trainable
    rank = s.lora_rank
    fwd, bwd = _model_passes(trained, micro_batch, seq_len, dtype, gpu, coef, loss)
    tensors = trainable_tensors(model, rank, lm_head=trained.lm_head)
    if s.zero_stage == 3:  # ZeRO-3's module and gradient hooks, counted on a real engine (search.model.zero3_time)
        zero3 = zero3_passes(
            model,
            dtype,
            gpu,
            coef,
            lora_rank=rank,
            lm_head=trained.lm_head,
            checkpointing=s.gradient_checkpointing,
            offload_optimizer=s.offload_optimizer != "none",
            trainable=t,
        )
        fwd, bwd = fwd + zero3.forward, bwd + zero3.backward
    else:  # ZeRO-0/1/2's per-gradient hook (stage_1_and_2.py)
        bwd = bwd + PassSeconds(
            host={"deepspeed_per_tensor": host_seconds(tensors * coef.ds_hook_kernels_per_grad, coef)}
        )
    offload_opt = s.offload_optimizer != "none"
    if offload_opt:  # fp32 gradients of the partition to the host (ZeRO-1 only at the boundary)
        down = 4 * t / n / (1 if s.zero_stage >= 2 else grad_accum)
        bwd = bwd + PassSeconds(serial={"pcie": pcie_time(down, hardware, coef)})
    passes = 3 if s.gradient_checkpointing else 2
    comm = collective_time(
        zero_comm_bytes(
            zero_stage=s.zero_stage,
            trainable=t,
            resident=trained.resident,
            dtype=dtype,
            world_size=n,
            grad_accum=grad_accum,
            passes=passes,
        ),
        hardware,
        coef,
        overlapped=trained.work.comm_overlapped,
    )
    offload = _offload_seconds(trained, dtype, grad_accum, passes, hardware, coef)
    step_loop = PassSeconds(
        host={"deepspeed_per_tensor": host_seconds(tensors * coef.ds_step_kernels_per_tensor, coef)}
    )
    local = t if s.zero_stage == 0 else t // n
    if offload_opt:
        adam = PassSeconds(
            serial={"cpu_adam": local * hardware.gpus * coef.cpu_adam_bytes_per_param / (coef.host_memory_gbps * 1e9)}
        )
        if s.zero_stage == 3:  # stage3.py's own copies, its upload from pageable memory (search.model.zero3_time)
            roundtrip, conversion = zero3_offload(local, dtype, hardware, coef)
            bwd, adam = bwd + roundtrip, adam + conversion
        else:  # the 16-bit partition from the pinned buffer CPU Adam's cast wrote (stage_1_and_2.py step)
            adam = adam + PassSeconds(serial={"pcie": pcie_time(d * local, hardware, coef)})
    else:
        adam = PassSeconds(gpu={"optimizer_hbm": hbm_seconds(local * coef.gpu_adam_bytes_per_param, gpu)})
    step = step_loop + adam
    terms: dict[str, float] = {}
    add_terms(terms, fwd.terms, grad_accum)
    add_terms(terms, bwd.terms, grad_accum)
    add_terms(terms, step.terms)
    add_terms(terms, {"collectives": comm, "offload_fetch": offload})
    return TrainingSeconds(fwd.seconds, bwd.seconds, comm, offload, step.seconds, grad_accum, terms)
