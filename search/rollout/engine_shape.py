"""What one GPU of an inference-engine replica holds, whichever engine: a token's KV bytes, the weights, the
working set of a forward and of the sampler, the CUDA-graph pool, under tensor parallelism.

Read from vLLM 0.19.1 (its PyPI wheel, ``vllm/_version.py`` commit ``gb1388b1fb``) and SGLang 0.5.23 (its PyPI
wheel); every rule names the file and function it follows.

- KV heads per GPU: ``max(1, num_kv_heads // tp)``, replicated when there are fewer heads than ranks (vLLM
  ``config/model.py`` ``ModelConfig.get_num_kv_heads``; SGLang ``configs/model_config.py`` ``get_num_kv_heads``).
  A page holds K and V of ``block_size`` tokens: ``2 x block_size x heads x head_size x dtype bytes`` per layer
  (vLLM ``v1/kv_cache_interface.py`` ``AttentionSpec.real_page_size_bytes``; SGLang's cell is the same per token,
  ``model_executor/pool_configurator.py`` ``DefaultPoolConfigurator._compute_cell_size``).
- MLA models (DeepSeek: ``kv_lora_rank`` in the config) keep one latent per token and layer, the same on every
  rank: vLLM returns 1 KV head when ``use_mla`` (``get_num_kv_heads``) and ``MLAAttentionSpec.real_page_size_bytes``
  counts ``block_size x 1 x head_size`` with ``head_size = kv_lora_rank + qk_rope_head_dim``.
- Sliding-window layers count as full-attention layers: vLLM's page accounting when its hybrid KV-cache manager
  is off (``v1/core/kv_cache_utils.py`` ``unify_hybrid_kv_cache_specs`` turns every ``SlidingWindowSpec`` into a
  ``FullAttentionSpec``). With the hybrid manager on, a hybrid model holds more tokens than this says. Layers
  that reuse another layer's cache (``kv_windows`` -1) keep none.
- ``kv_cache_dtype`` ``"fp8"`` (``fp8_e4m3``, ``fp8_e5m2``) stores one byte an element; ``None``/``"auto"``: the
  model's dtype (vLLM ``CacheConfig.cache_dtype``).
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

from search.coefficients import Coefficients
from search.model.activations import activations, logits_bytes
from store.records import DTYPE_BYTES, ModelSpec

# The attention vLLM and SGLang run (FlashAttention / FlashInfer): no sequence x sequence scores are kept.
ENGINE_ATTENTION = "flash_attention_2"
KV_CACHE_DTYPE_BYTES: dict[str, int] = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, **DTYPE_BYTES}


class EngineRefusal(ValueError):
    """The engine would refuse to start with these settings: its own start-up check fails (the message says
    which, in the engine's words)."""


def kv_element_bytes(dtype: str, kv_cache_dtype: str | None = None) -> int:
    """Bytes of one cached K or V element: the model's dtype unless ``kv_cache_dtype`` says otherwise."""
    if kv_cache_dtype in (None, "auto"):
        return DTYPE_BYTES[dtype]
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise ValueError(
            f"kv_cache_dtype must be auto or one of {', '.join(KV_CACHE_DTYPE_BYTES)}, not {kv_cache_dtype!r}"
        )
    return KV_CACHE_DTYPE_BYTES[kv_cache_dtype]


def is_mla(model: ModelSpec) -> bool:
    """Multi-head latent attention (DeepSeek-V2/V3): the cache keeps a compressed latent, not K and V heads."""
    return bool(model.hf_config.get("kv_lora_rank"))


def cache_layers(model: ModelSpec) -> int:
    """Layers with a KV cache of their own, every one counted as full attention (see the module docstring)."""
    if not model.kv_windows:
        return model.num_layers
    return sum(1 for window in model.kv_windows if window != -1)


def kv_heads_per_gpu(model: ModelSpec, tensor_parallel: int) -> int:
    """KV heads one rank keeps: split over the ranks, one replicated head when there are fewer heads than ranks."""
    return 1 if is_mla(model) else max(1, model.num_kv_heads // tensor_parallel)


def layer_token_bytes(model: ModelSpec, dtype: str, tensor_parallel: int, kv_cache_dtype: str | None = None) -> int:
    """Bytes one token takes in one layer's KV cache on one GPU of a replica."""
    size = kv_element_bytes(dtype, kv_cache_dtype)
    if is_mla(model):
        latent = int(model.hf_config["kv_lora_rank"]) + int(model.hf_config.get("qk_rope_head_dim", 0))
        return (model.kv_token_elements or latent) * size
    per_head = model.kv_elements_per_token // model.num_kv_heads  # K and V of one head (head_size + head_size_v)
    return kv_heads_per_gpu(model, tensor_parallel) * per_head * size


def kv_bytes_per_token(model: ModelSpec, dtype: str, tensor_parallel: int, *, kv_cache_dtype: str | None = None) -> int:
    """KV-cache bytes one token takes on ONE GPU of an engine replica, all layers, K and V, as vLLM lays it out.

    A Qwen2.5-7B shape (28 layers, 4 KV heads of 128, bf16) takes 28 x 2 x 4 x 128 x 2 = 57344 bytes at tp=1,
    half at tp=2, and a quarter at tp=8 (one replicated head a rank)."""
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be >= 1, not {tensor_parallel}")
    return cache_layers(model) * layer_token_bytes(model, dtype, tensor_parallel, kv_cache_dtype)


@lru_cache(maxsize=1024)
def weights_per_gpu(model: ModelSpec, dtype: str, tensor_parallel: int) -> int:
    """Bytes of the 16-bit weights on one rank: every matrix split over the ranks (vocabulary-parallel embedding
    and head, column/row-parallel linears), except that K and V projections are replicated with their heads
    (vLLM ``QKVParallelLinear``: ``num_kv_head_replicas``). Norms and biases are counted as split (small)."""
    d = DTYPE_BYTES[dtype]
    if tensor_parallel == 1:
        return model.total_params * d
    kv_proj = 0 if is_mla(model) else 2 * model.num_layers * model.hidden_size * model.num_kv_heads * model.head_dim
    rank_kv = kv_proj // model.num_kv_heads * kv_heads_per_gpu(model, tensor_parallel) if kv_proj else 0
    return d * (math.ceil((model.total_params - kv_proj) / tensor_parallel) + rank_kv)


def sharded(model: ModelSpec, tensor_parallel: int) -> ModelSpec:
    """One rank's share of the model for the activation formulas: attention heads and the MLP's intermediate
    width split over the ranks, hidden-size tensors whole (what a tensor-parallel forward keeps per GPU).
    Under tp > 1 the formulas apply (traced terms describe the whole model)."""
    if tensor_parallel == 1:
        return model
    return dataclasses.replace(
        model,
        num_heads=max(1, model.num_heads // tensor_parallel),
        num_kv_heads=kv_heads_per_gpu(model, tensor_parallel),
        intermediate_size=math.ceil(model.intermediate_size / tensor_parallel),
        activation_terms={},
    )


def forward_peak(model: ModelSpec, dtype: str, tensor_parallel: int, tokens: int, coef: Coefficients) -> int:
    """Activation bytes live while a no-grad forward runs ``tokens`` tokens (one batch of that many: the
    engine's flash attention keeps no scores, so the split into sequences does not matter)."""
    if tokens <= 0:
        return 0
    shard = sharded(model, tensor_parallel)
    return activations(shard, 1, tokens, dtype, ENGINE_ATTENTION, False, coef).forward_working


def sampler_peak(model: ModelSpec, dtype: str, tokens: int, rows: int, coef: Coefficients) -> int:
    """Bytes live while the sampler runs over ``rows`` rows after a forward of ``tokens`` tokens: the forward's
    hidden states, the sampled rows and their random stand-in (``_dummy_sampler_run``: ``torch.rand_like``), the
    logits over the whole vocabulary (gathered from the vocabulary-parallel head on every rank) with their fp32
    copy (``Sampler.forward``: ``logits.to(torch.float32)``), and the sampler's fp32 working copies
    (``coef.rollout_sampler_fp32_copies``)."""
    d = DTYPE_BYTES[dtype]
    hidden = d * (tokens + 2 * rows) * model.hidden_size
    logits = logits_bytes(model, rows, 1, dtype, coef)[1]  # 16-bit logits plus their fp32 upcast
    working = coef.rollout_sampler_fp32_copies * 4 * rows * model.vocab_size
    return int(hidden + logits + working)


@lru_cache(maxsize=1024)
def profile_peak(model: ModelSpec, dtype: str, tensor_parallel: int, tokens: int, rows: int, coef: Coefficients) -> int:
    """Torch's peak above the weights over a forward of ``tokens`` tokens and then the sampler over ``rows``
    rows: the larger of the two moments (the forward's working set is freed before the sampler runs)."""
    forward = forward_peak(model, dtype, tensor_parallel, tokens, coef)
    return max(forward, sampler_peak(model, dtype, tokens, rows, coef))


@lru_cache(maxsize=1024)
def graph_pool(
    model: ModelSpec, dtype: str, tensor_parallel: int, largest: int, graphs: int, coef: Coefficients
) -> int:
    """Bytes of the captured CUDA graphs: the largest graph's forward working set, which the memory pool shared
    by every graph keeps (graphs are captured largest first), plus ``coef.rollout_graph_bytes_per_capture`` for
    each further graph (vLLM ``gpu_model_runner.profile_cudagraph_memory``: first capture + (n - 1) x per graph)."""
    if graphs <= 0:
        return 0
    pool = forward_peak(model, dtype, tensor_parallel, largest, coef)
    return int(pool + (graphs - 1) * coef.rollout_graph_bytes_per_capture)


def non_torch_bytes(tensor_parallel: int, coef: Coefficients) -> int:
    """Bytes outside torch's allocator that the engine's first forward adds: kernels and workspaces, plus the
    tensor-parallel group's NCCL and custom all-reduce buffers when tp > 1."""
    comm = coef.rollout_tp_comm_bytes if tensor_parallel > 1 else 0.0
    return int(coef.rollout_non_torch_bytes + comm)


def context_bytes(own_process: bool, coef: Coefficients) -> int:
    """The engine process's CUDA context and library handles: none when it shares the trainer's process (TRL's
    colocate mode, veRL), one more context when it is a process of its own (OpenRLHF's Ray actors)."""
    return int(coef.cuda_context_bytes) if own_process else 0
