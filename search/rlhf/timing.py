"""Seconds of an RLHF step's phases: generation, scoring forwards and the training of actor and critic.

Generation is a prefill forward, then one decoding step per generated token (:func:`search.model.passes.decode_step`:
HF generate's kernels issued by the host against the weights and KV cache read by the GPU, whichever is
longer; DeepSpeed 0.19's hybrid engine runs the same path for transformers' Cache-based decoders). ZeRO-3
adds gathers: once per generate call with the hybrid engine, for every token without it (over the network
across GPUs, over PCIe when the actor's weights are offloaded). Scoring forwards are
:func:`search.model.passes.forward_pass` with a log-softmax over the logits (actor, reference) or a value
head (critic, reward); training is :func:`search.model.training_time.training_time`, as for single-model
training. Pure functions, cached on their arguments.
"""

from __future__ import annotations

from functools import lru_cache

from search.coefficients import Coefficients
from search.model.passes import decode_step, forward_pass
from search.model.placement import FrozenPlacement, TrainedPlacement
from search.model.roofline import hbm_seconds
from search.model.timing import collective_time, pcie_time, per_gpu_link_gbps, zero_comm_bytes
from search.rlhf.job import RLHFContext
from store.records import DTYPE_BYTES, Hardware, ModelSpec


def _gather_seconds(weight_bytes: float, offloaded: bool, hardware: Hardware, coef: Coefficients) -> float:
    """One full all-gather of ``weight_bytes`` of 16-bit weights with nothing to hide it behind (decoding),
    plus each rank's partition over PCIe when the weights live on the host."""
    n = hardware.world_size
    seconds = 0.0
    if n > 1:
        ring = (n - 1) / n * weight_bytes
        seconds += ring / (per_gpu_link_gbps(hardware) * 1e9 * coef.network_efficiency)
    if offloaded:
        seconds += pcie_time(weight_bytes / n, hardware, coef)
    return seconds


@lru_cache(maxsize=4096)
def generation_time(ctx: RLHFContext, actor: TrainedPlacement, hybrid_engine: bool, sequences: int) -> float:
    """Seconds of one generate call of ``sequences`` sequences of the step's prompts: prefill, a decoding step
    per generated token, gathers."""
    prompt_len, gen_len, dtype = ctx.job.prompt_len, ctx.job.gen_len, ctx.workload.dtype
    hardware, coef = ctx.hardware, ctx.coef
    model, d = actor.model, DTYPE_BYTES[dtype]
    gpu = hardware.gpu
    # the prefill computes the logits of the last prompt token only (transformers' logits_to_keep=1)
    prefill = forward_pass(model, sequences, prompt_len, dtype, gpu, coef, lm_head=False, loss=False).seconds
    context = prompt_len + (gen_len + 1) / 2  # cached tokens a decoding step reads, on average
    decode = gen_len * decode_step(model, sequences, context, dtype, gpu, coef).seconds
    weights = d * actor.resident
    gathers = 0.0
    if actor.layout.zero_stage == 3:
        offloaded = actor.layout.offload_param != "none"
        once = _gather_seconds(weights, offloaded, hardware, coef)
        # the hybrid engine gathers the whole actor once per call; without it every module is gathered (and
        # copied into place) for the prefill and again for every token
        gathers = once if hybrid_engine else (gen_len + 1) * (once + hbm_seconds(2 * weights, gpu))
    return prefill + decode + gathers


@lru_cache(maxsize=4096)
def forward_time(
    model: ModelSpec,
    *,
    lm_head: bool,
    params: int,
    sequences: int,
    seq_len: int,
    zero_stage: int,
    offloaded: bool,
    dtype: str,
    hardware: Hardware,
    coef: Coefficients,
) -> float:
    """A no-grad scoring forward (log-softmax over the logits, or a value head), plus ZeRO-3's gather of
    every weight and any PCIe fetch of them."""
    seconds = forward_pass(model, sequences, seq_len, dtype, hardware.gpu, coef, lm_head=lm_head).seconds
    if zero_stage == 3:
        d = DTYPE_BYTES[dtype]
        ring = zero_comm_bytes(
            zero_stage=3,
            trainable=0,
            resident=params,
            dtype=dtype,
            world_size=hardware.world_size,
            grad_accum=1,
            passes=1,
        )
        seconds += collective_time(ring, hardware, coef)
        if offloaded:
            seconds += pcie_time(d * params / hardware.world_size, hardware, coef)
    return seconds


def trained_forward_time(
    trained: TrainedPlacement, sequences: int, seq_len: int, dtype: str, hardware: Hardware, coef: Coefficients
) -> float:
    """The scoring forward of a trained model (actor log-probs, critic values)."""
    offloaded = trained.layout.offload_param != "none"
    return forward_time(
        trained.model,
        lm_head=trained.lm_head,
        params=trained.resident,
        sequences=sequences,
        seq_len=seq_len,
        zero_stage=trained.layout.zero_stage,
        offloaded=offloaded,
        dtype=dtype,
        hardware=hardware,
        coef=coef,
    )


def frozen_forward_time(
    frozen: FrozenPlacement, sequences: int, seq_len: int, dtype: str, hardware: Hardware, coef: Coefficients
) -> float:
    """The scoring forward of a frozen model (reference log-probs, reward scores)."""
    offloaded = frozen.block.offload != "none"
    return forward_time(
        frozen.model,
        lm_head=frozen.lm_head,
        params=frozen.params,
        sequences=sequences,
        seq_len=seq_len,
        zero_stage=frozen.block.zero_stage,
        offloaded=offloaded,
        dtype=dtype,
        hardware=hardware,
        coef=coef,
    )


def ema_time(actor: TrainedPlacement, dtype: str, hardware: Hardware, coef: Coefficients) -> float:
    """DeepSpeed-Chat's moving average after each actor step: read both 16-bit copies, write one."""
    d = DTYPE_BYTES[dtype]
    local = actor.resident // (hardware.world_size if actor.layout.zero_stage == 3 else 1)
    return hbm_seconds(3 * d * local, hardware.gpu)


# DeepSpeed-Chat's get_advantages_and_returns (and the probe's GAE) walk the generated positions backwards in
# Python: per position an add, a subtract, a scaling, an add and the write into the advantages (5 kernels).
GAE_KERNELS_PER_POSITION = 5


def gae_seconds(gen_len: int, coef: Coefficients) -> float:
    """PPO's advantage loop over one generate call's experience: host-bound tensor ops, one position at a time."""
    return gen_len * GAE_KERNELS_PER_POSITION * coef.host_s_per_tensor_op
