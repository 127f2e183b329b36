"""Seconds of an RLHF step's phases: generation, scoring forwards and the training of actor and critic.

Generation is prefill at the compute rate, then decoding bound by the slowest of reading every weight and
the KV cache per token (HBM bandwidth), the matmuls, and the per-token launch overhead (HF generate's,
or the hybrid engine's fused kernels'). ZeRO-3 adds gathers: once per generate call with the hybrid engine,
for every token without it (over the network across GPUs, over PCIe when the actor's weights are
offloaded). Scoring is compute-bound (``search.model.timing``); training is
:func:`search.model.training_time.training_time`, as for single-model training. Pure functions, cached on
their arguments.
"""

from __future__ import annotations

from functools import lru_cache

from search.coefficients import Coefficients
from search.model.placement import FrozenPlacement, TrainedPlacement
from search.model.shapes import forward_flops
from search.model.timing import collective_time, compute_time, pcie_time, per_gpu_link_gbps, zero_comm_bytes
from search.rlhf.memory import kv_cache_bytes
from store.records import DTYPE_BYTES, Hardware


def _gather_seconds(weight_bytes: float, offloaded: bool, hardware: Hardware, coef: Coefficients) -> float:
    """One full all-gather of ``weight_bytes`` of 16-bit weights with nothing to hide it behind (decoding),
    plus each rank's partition over PCIe when the weights live on the host."""
    n = hardware.world_size
    seconds = 0.0
    if n > 1:
        ring = (n - 1) / n * weight_bytes
        seconds += ring / (per_gpu_link_gbps(hardware) * 1e9 * coef.network_efficiency)
    if offloaded:
        seconds += weight_bytes / n / (hardware.gpu.pcie_gbps * 1e9 * coef.pcie_efficiency)
    return seconds


@lru_cache(maxsize=4096)
def generation_time(
    actor: TrainedPlacement,
    hybrid_engine: bool,
    sequences: int,
    prompt_len: int,
    gen_len: int,
    dtype: str,
    hardware: Hardware,
    coef: Coefficients,
) -> float:
    """Seconds of one generate call of ``sequences`` sequences: prefill, ``gen_len`` decoding steps, gathers."""
    model, d = actor.model, DTYPE_BYTES[dtype]
    prefill = compute_time(forward_flops(model, sequences, prompt_len), sequences * prompt_len, dtype, hardware, coef)
    weights = d * actor.resident
    # every decoding step reads all weights and the KV cache so far (context prompt + t at step t)
    context_sum = gen_len * prompt_len + gen_len * (gen_len + 1) // 2
    read = gen_len * weights + kv_cache_bytes(model, sequences, 1, dtype) * context_sum
    hbm = hardware.gpu.hbm_gbps * 1e9 * coef.hbm_efficiency
    matmul_weights = model.num_layers * model.layer_params + model.vocab_size * model.hidden_size
    attention = 4 * sequences * model.num_heads * model.head_dim * model.num_layers * context_sum
    flops = 2.0 * matmul_weights * sequences * gen_len + attention
    launches = gen_len * model.num_layers * coef.decode_s_per_layer
    if hybrid_engine:
        launches *= coef.hybrid_engine_decode_factor
    # the bandwidth term already carries decoding's low arithmetic intensity: no micro-batch fill penalty
    matmuls = flops / (hardware.gpu.tflops(dtype) * 1e12 * coef.mfu)
    decode = max(read / hbm, matmuls, launches)
    gathers = 0.0
    if actor.layout.zero_stage == 3:
        offloaded = actor.layout.offload_param != "none"
        once = _gather_seconds(weights, offloaded, hardware, coef)
        # the hybrid engine gathers the whole actor once per call; without it every module is gathered (and
        # copied into place) for the prefill and again for every token
        gathers = once if hybrid_engine else (gen_len + 1) * (once + 2 * weights / hbm)
    return prefill + decode + gathers


@lru_cache(maxsize=4096)
def forward_time(
    model_params: int,
    flops: float,
    tokens: int,
    zero_stage: int,
    offloaded: bool,
    dtype: str,
    hardware: Hardware,
    coef: Coefficients,
) -> float:
    """A no-grad forward: compute, plus ZeRO-3's gather of every weight and any PCIe fetch of them."""
    seconds = compute_time(flops, tokens, dtype, hardware, coef)
    if zero_stage == 3:
        d = DTYPE_BYTES[dtype]
        ring = zero_comm_bytes(
            zero_stage=3,
            trainable=0,
            resident=model_params,
            dtype=dtype,
            world_size=hardware.world_size,
            grad_accum=1,
            passes=1,
        )
        seconds += collective_time(ring, hardware, coef)
        if offloaded:
            seconds += pcie_time(d * model_params / hardware.world_size, hardware, coef)
    return seconds


def trained_forward_time(
    trained: TrainedPlacement, sequences: int, seq_len: int, dtype: str, hardware: Hardware, coef: Coefficients
) -> float:
    """The scoring forward of a trained model (actor log-probs, critic values)."""
    flops = forward_flops(trained.model, sequences, seq_len, lm_head=trained.lm_head)
    offloaded = trained.layout.offload_param != "none"
    return forward_time(
        trained.resident, flops, sequences * seq_len, trained.layout.zero_stage, offloaded, dtype, hardware, coef
    )


def frozen_forward_time(
    frozen: FrozenPlacement, sequences: int, seq_len: int, dtype: str, hardware: Hardware, coef: Coefficients
) -> float:
    """The scoring forward of a frozen model (reference log-probs, reward scores)."""
    flops = forward_flops(frozen.model, sequences, seq_len, lm_head=frozen.lm_head)
    offloaded = frozen.block.offload != "none"
    return forward_time(
        frozen.params, flops, sequences * seq_len, frozen.block.zero_stage, offloaded, dtype, hardware, coef
    )


def ema_time(actor: TrainedPlacement, dtype: str, hardware: Hardware, coef: Coefficients) -> float:
    """DeepSpeed-Chat's moving average after each actor step: read both 16-bit copies, write one."""
    d = DTYPE_BYTES[dtype]
    local = actor.resident // (hardware.world_size if actor.layout.zero_stage == 3 else 1)
    return 3 * d * local / (hardware.gpu.hbm_gbps * 1e9 * coef.hbm_efficiency)
