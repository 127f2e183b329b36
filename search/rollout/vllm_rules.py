"""vLLM's start-up memory algorithm, step by step, as it sizes one replica's KV cache on each GPU.

Read from vLLM 0.19.1 (the PyPI wheel; ``vllm/_version.py``: 0.19.1, commit id ``gb1388b1fb``). The rules:

1. Requested = ``ceil(total x gpu_memory_utilization)``, and vLLM refuses to start when the free memory at its
   start (measured after its own CUDA context and NCCL set-up) is below it: ``v1/worker/utils.py``
   ``request_memory``, called from ``v1/worker/gpu_worker.py`` ``Worker.init_device``. What the colocated trainer
   holds therefore decides only whether vLLM starts, never how big its KV cache is.
2. KV bytes = requested - (weights + torch's peak increase in the profile run + non-torch increase):
   ``Worker.determine_available_memory`` with ``utils/mem_utils.py`` ``memory_profiling``
   (``non_kv_cache_memory = non_torch_increase + torch_peak_increase + weights_memory``).
3. The profile run (``v1/worker/gpu_model_runner.py`` ``GPUModelRunner.profile_run``) is a forward of
   ``max_num_batched_tokens`` dummy tokens spread over ``min(max_num_seqs, tokens)`` requests
   (``_dummy_run``), then the sampler over those rows (``_dummy_sampler_run``): memplan's forward working set and
   logits bytes (:mod:`search.rollout.engine_shape`).
4. CUDA graphs are OUTSIDE the budget in 0.19.1: ``determine_available_memory`` profiles them
   (``profile_cudagraph_memory``) but subtracts the estimate only under ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``,
   off by default (``envs.py``); vLLM's own log says it becomes the default later (v0.21 logs say "default since
   v0.21.0"): ``graphs_in_budget=True`` models those versions. ``enforce_eager`` captures none.
5. Capture sizes (``config/vllm.py`` ``VllmConfig._set_cudagraph_sizes``): the largest is
   ``min(2 x max_num_seqs, 512, max_num_batched_tokens)``; sizes 1, 2, 4, multiples of 8 below 256, multiples
   of 16 from 256. The default mode FULL_AND_PIECEWISE (optimization level O2) captures a piecewise graph at every
   size and a full decode graph at every size up to ``max_num_seqs`` (``v1/cudagraph_dispatcher.py``
   ``CudagraphDispatcher.initialize_cudagraph_keys``).
6. Blocks = ``kv_bytes // page_size // layers``, floored and never negative (``v1/core/kv_cache_utils.py``
   ``get_num_blocks`` via ``get_kv_cache_config_from_groups``); tokens = blocks x ``block_size`` (16 by default).
7. vLLM refuses when the KV budget is not positive ("No available memory for the cache blocks") or cannot hold
   one ``max_model_len`` sequence, ``cdiv(max_model_len, block_size)`` pages a layer
   (``kv_cache_utils._check_enough_kv_cache_memory``; ``FullAttentionSpec.max_memory_usage_bytes``).
8. Defaults of ``vllm.LLM`` (what OpenRLHF, TRL and veRL construct): 16384 batched tokens and 1024 sequences on
   GPUs of 70 GiB or more other than the A100, else 8192 and 256 (``engine/arg_utils.py``
   ``EngineArgs.get_batch_defaults``; :func:`search.rollout.engine_setup.vllm_default_batch`), and
   ``max_num_batched_tokens <= max_num_seqs x max_model_len``.
"""

from __future__ import annotations

import math

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients
from search.rollout.engine_memory import EngineMemory
from search.rollout.engine_setup import EngineSetup, vllm_default_batch
from search.rollout.engine_shape import (
    EngineRefusal,
    cache_layers,
    context_bytes,
    graph_pool,
    layer_token_bytes,
    non_torch_bytes,
    profile_peak,
    weights_per_gpu,
)
from store.choices import RolloutEngine

__all__ = ["MAX_CAPTURE_SIZE", "vllm_capture_sizes", "vllm_default_batch", "vllm_graph_count", "vllm_memory"]

MAX_CAPTURE_SIZE = 512  # config/vllm.py _set_cudagraph_sizes: min(max_num_seqs * 2, 512)


def vllm_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """The batch sizes vLLM captures CUDA graphs for, ascending (``VllmConfig._set_cudagraph_sizes``)."""
    largest = min(max_num_seqs * 2, MAX_CAPTURE_SIZE, max_num_batched_tokens)
    sizes = [i for i in (1, 2, 4) if i <= largest]
    if largest >= 8:
        sizes += range(8, min(largest + 1, 256), 8)
    if largest >= 256:
        sizes += range(256, largest + 1, 16)
    return tuple(sorted(set(sizes)))


def vllm_graph_count(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Graphs of the default FULL_AND_PIECEWISE mode: a piecewise graph per capture size and a full decode
    graph per capture size up to ``max_num_seqs`` (``CudagraphDispatcher.initialize_cudagraph_keys``)."""
    sizes = vllm_capture_sizes(max_num_seqs, max_num_batched_tokens)
    return len(sizes) + sum(1 for size in sizes if size <= max_num_seqs)


def vllm_memory(
    setup: EngineSetup,
    utilization: float,
    *,
    max_model_len: int | None = None,
    free_bytes_at_start: int | None = None,
    graphs_in_budget: bool = False,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> EngineMemory:
    """One vLLM replica's bytes on each of its GPUs at ``gpu_memory_utilization`` = ``utilization``.

    ``setup`` is the replica as started (``setup.limits``: ``max_num_seqs``, ``max_num_batched_tokens`` and the
    KV ``block_size``). ``max_model_len`` defaults to the model's context (vLLM reads ``max_position_embeddings``);
    an RLHF rollout sets it to prompt + generation. ``free_bytes_at_start``, when given, is the GPU memory free
    before the engine starts (what the trainer and others leave): vLLM refuses below the requested bytes. Raises
    :class:`EngineRefusal` where vLLM would refuse to start (see the module docstring for the rules).
    """
    if setup.engine != RolloutEngine.VLLM:
        raise ValueError(f"vllm_memory sizes a vLLM engine, not {setup.engine!r}")
    limits = setup.limits
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], not {utilization!r}")
    if min(limits.max_num_seqs, limits.max_num_batched_tokens, limits.block, setup.tensor_parallel) < 1:
        raise ValueError("max_num_seqs, max_num_batched_tokens, block_size and tensor_parallel must be >= 1")
    context = context_bytes(setup.own_process, coef)
    requested = math.ceil(setup.gpu_memory_bytes * utilization)  # request_memory
    if free_bytes_at_start is not None and free_bytes_at_start - context < requested:
        raise EngineRefusal(
            f"Free memory on device ({(free_bytes_at_start - context) / 2**30:.2f}/"
            f"{setup.gpu_memory_bytes / 2**30:.2f} GiB) on startup is less than desired GPU memory utilization "
            f"({utilization}, {requested / 2**30:.2f} GiB)"
        )
    weights = weights_per_gpu(setup.model, setup.dtype, setup.tensor_parallel)
    # _dummy_run: num_reqs = min(num_tokens, max_num_reqs)
    rows = min(limits.max_num_seqs, limits.max_num_batched_tokens)
    activation = profile_peak(
        setup.model, setup.dtype, setup.tensor_parallel, limits.max_num_batched_tokens, rows, coef
    )
    non_torch = non_torch_bytes(setup.tensor_parallel, coef)
    graphs = 0
    if not setup.enforce_eager:
        largest = vllm_capture_sizes(limits.max_num_seqs, limits.max_num_batched_tokens)[-1]
        count = vllm_graph_count(limits.max_num_seqs, limits.max_num_batched_tokens)
        graphs = graph_pool(setup.model, setup.dtype, setup.tensor_parallel, largest, count, coef)
    available = requested - (weights + activation + non_torch) - (graphs if graphs_in_budget else 0)
    if available <= 0:
        raise EngineRefusal(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
            f"the engine (budget {requested / 2**30:.2f} GiB, weights {weights / 2**30:.2f} GiB, activation peak "
            f"{activation / 2**30:.2f} GiB)"
        )
    layers = cache_layers(setup.model)
    # one layer's page
    page = limits.block * layer_token_bytes(setup.model, setup.dtype, setup.tensor_parallel, setup.kv_cache_dtype)
    model_len = max_model_len if max_model_len is not None else setup.model.max_positions
    needed = -(-model_len // limits.block) * page * layers  # max_memory_usage_bytes summed over the layers
    if needed > available:
        raise EngineRefusal(
            f"To serve at least one request with the models's max seq len ({model_len}), "
            f"({needed / 2**30:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({available / 2**30:.2f} GiB)"
        )
    blocks = max(available // page // layers, 0)  # get_num_blocks
    return EngineMemory(
        engine="vllm",
        utilization=utilization,
        requested=requested,
        weights=weights,
        activation_peak=activation,
        non_torch=non_torch,
        kv_cache=blocks * page * layers,
        kv_tokens=blocks * limits.block,
        cuda_graphs=graphs,
        context=context,
        outside=context + (0 if graphs_in_budget else graphs),
    )
