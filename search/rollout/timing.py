"""Seconds of a rollout on a vLLM or SGLang engine, of the weight sync from the trainer, and of sleep and wake.

Decoding in these engines is one step per generated token over every running sequence at once (continuous
batching): the GPU reads the engine's share of the weights and the KV cache of every running sequence, and
runs each layer's products at the rate a ``running x hidden`` GEMM reaches (:mod:`search.model.roofline`).
The host's share of a step is the engine's own scheduler, input preparation and sampling
(``engine_step_host_s``); with CUDA graphs a whole decoding step is one graph replay, with ``enforce_eager``
every kernel is launched from Python (vLLM's fused layer: ``ENGINE_LAYER_KERNELS``). Tensor parallelism splits
weights, KV heads and products over the replica's GPUs and adds two all-reduces per layer
(``vllm/model_executor/models/llama.py``: ``o_proj`` and ``down_proj`` are RowParallelLinear). The prefill is
the model's forward over the prompts (:func:`search.model.passes.forward_pass`), split over the replica.

The weight sync sends the actor's 16-bit weights to the engine after every training step: gathered under
ZeRO-3 (one all-gather of the whole model), then copied into the engine on the same GPU (CUDA IPC, OpenRLHF's
and TRL's colocated mode) or broadcast from the trainer to the engine's GPUs (NCCL, the separate placement).
Sleeping (level 1) copies the engine's weights to pinned host memory and waking copies them back; level 2
drops them (the sync refills them); both release and map the KV cache again. DeepSpeed's ``offload_states``
/ ``reload_states`` move the trainer's states over PCIe both ways.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil

from search.coefficients import Coefficients
from search.model.kernels import GENERATE_STEP_KERNELS, layer_gemms
from search.model.passes import forward_pass
from search.model.roofline import gemm_seconds, hbm_seconds, host_seconds
from search.model.shapes import kv_tokens_held
from search.model.timing import pcie_time, per_gpu_link_gbps
from store.records import DTYPE_BYTES, Hardware, ModelSpec

# vLLM's decoder layer (llama.py LlamaDecoderLayer with its fused custom ops): fused add + RMSNorm, QKV
# product, rotary, reshape_and_cache, attention, o_proj, fused add + RMSNorm, gate_up product, silu_and_mul,
# down product: 10 kernels, where transformers' eager layer launches about 39.
ENGINE_LAYER_KERNELS = 10
ALL_REDUCES_PER_LAYER = 2  # RowParallelLinear o_proj and down_proj each end in an all-reduce


def engine_weight_bytes(model: ModelSpec, dtype: str, tensor_parallel: int) -> float:
    """16-bit weight bytes one GPU of a replica reads per decoding step (its shard of the layers and head)."""
    d = DTYPE_BYTES[dtype]
    return d * (model.num_layers * model.layer_params + model.vocab_size * model.hidden_size) / tensor_parallel


@lru_cache(maxsize=4096)
def engine_decode_seconds(
    model: ModelSpec,
    *,
    running: int,
    context: float,
    dtype: str,
    tensor_parallel: int,
    enforce_eager: bool,
    hardware: Hardware,
    coef: Coefficients,
) -> float:
    """One decoding step of ``running`` sequences over ``context`` cached tokens each (on average)."""
    gpu, d, tp = hardware.gpu, DTYPE_BYTES[dtype], tensor_parallel
    kv = kv_tokens_held(model, context) * running * model.kv_elements_per_token * d / tp
    reads = hbm_seconds(engine_weight_bytes(model, dtype, tp) + kv, gpu)
    products = model.num_layers * sum(gemm_seconds(g, dtype, gpu) for g in layer_gemms(model, running, 0)) / tp
    kernels = model.num_layers * ENGINE_LAYER_KERNELS + GENERATE_STEP_KERNELS
    gpu_s = max(reads, products, kernels * gpu.kernel_floor_s)
    if tp > 1:
        gpu_s += model.num_layers * ALL_REDUCES_PER_LAYER * coef.engine_all_reduce_s
    host_s = coef.engine_step_host_s + (host_seconds(kernels, coef) if enforce_eager else 0.0)
    return max(gpu_s, host_s)


@lru_cache(maxsize=4096)
def rollout_seconds(
    model: ModelSpec,
    *,
    sequences: int,
    prompt_len: int,
    gen_len: int,
    max_running: int,
    dtype: str,
    tensor_parallel: int,
    enforce_eager: bool,
    hardware: Hardware,
    coef: Coefficients,
) -> float:
    """A replica generating ``sequences`` sequences of ``gen_len`` tokens after ``prompt_len``-token prompts,
    at most ``max_running`` at once (the KV cache's and ``max_num_seqs``' limit): waves of prefill + decode."""
    if sequences < 1 or max_running < 1:
        return 0.0
    waves = ceil(sequences / max_running)
    running = ceil(sequences / waves)
    prefill = forward_pass(model, running, prompt_len, dtype, hardware.gpu, coef, lm_head=False, loss=False)
    prefill_s = sum(prefill.gpu.values()) / tensor_parallel
    context = prompt_len + (gen_len + 1) / 2
    decode = engine_decode_seconds(
        model,
        running=running,
        context=context,
        dtype=dtype,
        tensor_parallel=tensor_parallel,
        enforce_eager=enforce_eager,
        hardware=hardware,
        coef=coef,
    )
    return waves * (prefill_s + gen_len * decode)


def weight_sync_seconds(
    model: ModelSpec,
    *,
    dtype: str,
    zero3: bool,
    colocated: bool,
    tensor_parallel: int,
    tensors: int,
    trainer: Hardware,
    coef: Coefficients,
) -> float:
    """The actor's 16-bit weights from the trainer into the engine once: ZeRO-3's all-gather, then a copy on the
    same GPU (colocated: CUDA IPC and vLLM's ``load_weights``) or a broadcast over the GPU link (separate), plus
    each tensor's own host work."""
    d = DTYPE_BYTES[dtype]
    weights = d * model.total_params
    seconds = 0.0
    if zero3 and trainer.world_size > 1:
        ring = (trainer.world_size - 1) / trainer.world_size * weights
        seconds += ring / (per_gpu_link_gbps(trainer) * 1e9 * coef.network_efficiency)
    if colocated:
        seconds += hbm_seconds(2 * weights / tensor_parallel, trainer.gpu)
    else:
        seconds += weights / (per_gpu_link_gbps(trainer) * 1e9 * coef.network_efficiency)
    return seconds + tensors * coef.engine_sync_s_per_tensor


def sleep_wake_seconds(weight_bytes: int, sleep_level: int, hardware: Hardware, coef: Coefficients) -> float:
    """One sleep and one wake of a replica's GPU: level 1 copies its weights to the host and back over PCIe;
    levels 1 and 2 release the KV cache and map it again (``engine_sleep_wake_s``); level 0 does nothing."""
    if sleep_level == 0:
        return 0.0
    copies = 2 * pcie_time(weight_bytes, hardware, coef) if sleep_level == 1 else 0.0
    return copies + coef.engine_sleep_wake_s


def offload_states_seconds(state_bytes: int, hardware: Hardware, coef: Coefficients) -> float:
    """DeepSpeed's ``offload_states`` before the rollout and ``reload_states`` after it: the states over PCIe
    both ways (pinned buffers, stage_1_and_2.py / stage3.py ``offload_states``)."""
    return 2 * pcie_time(state_bytes, hardware, coef)
