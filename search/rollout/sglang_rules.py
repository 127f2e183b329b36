"""SGLang's start-up memory algorithm, as it sizes one replica's KV pool on each GPU.

Read from SGLang 0.5.23 (the PyPI wheel). The rules:

1. Before loading the model each rank measures its free GPU memory ``B`` (``distributed/bootstrap.py``
   ``measure_pre_model_load_memory``, the minimum over the ranks; older releases named it
   ``total_gpu_memory`` in ``ModelRunner.profile_max_num_token``). After loading, the KV pool gets
   ``rest = free after loading - B x (1 - mem_fraction_static)``
   (``mem_cache/kv_cache_configurator.py`` ``KVCacheConfigurator._profile_available_bytes``), i.e.
   ``mem_fraction_static x B - weights``: the budget scales with what the colocated trainer leaves free when
   the engine starts, unlike vLLM's (``total x gpu_memory_utilization``, whatever others hold). ``rest <= 0``
   is refused ("Loaded weights leave no GPU memory for the KV cache").
2. Tokens = ``rest // cell_size``, floored to whole pages (``page_size`` 1 by default), with
   ``cell_size = kv heads per rank x (head_dim + v_head_dim) x layers x element size``
   (``model_executor/pool_configurator.py`` ``DefaultPoolConfigurator.calculate_pool_sizes`` and
   ``_compute_cell_size``): the same bytes a token as vLLM's pages.
3. Activations, CUDA graphs and non-torch buffers are not profiled: they live in the ``B x (1 - fraction)``
   left over. The default fraction (``arg_groups/memory_hook.py``) is ``(gpu - reserved) / gpu`` with
   ``reserved = 512 MiB + 1.5 MiB x max(chunked_prefill_size, 2048) + tp x pp / 8 GiB + 2 MiB x decode max_bs``
   (+ prefill-graph terms), at least 10 GiB on GPUs above 60 GiB; memplan asks for it explicitly instead.
4. Decode CUDA graphs at batch sizes 1, 2, 4, 8, 12, 16-256 by 8, 272-496 by 16, 512 up by 32, and the largest
   (``arg_groups/cuda_graph_hook.py`` ``generate_decode_cuda_graph_batch_sizes``); ``disable_cuda_graph``
   (``enforce_eager`` here) captures none. The post-capture KV resize (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``)
   is off by default and off under ``enable_memory_saver``, which RLHF frameworks use to sleep the engine.
"""

from __future__ import annotations

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients
from search.rollout.engine_memory import EngineMemory
from search.rollout.engine_setup import EngineSetup
from search.rollout.engine_shape import (
    EngineRefusal,
    context_bytes,
    forward_peak,
    graph_pool,
    kv_bytes_per_token,
    non_torch_bytes,
    sampler_peak,
    weights_per_gpu,
)
from store.choices import RolloutEngine

__all__ = ["sglang_capture_sizes", "sglang_memory"]


def sglang_capture_sizes(max_bs: int) -> tuple[int, ...]:
    """Decode batch sizes SGLang captures CUDA graphs for (no speculative decoding), ascending."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    kept = [size for size in sizes if size <= max_bs]
    if max_bs not in kept:
        kept.append(max_bs)
    return tuple(kept)


def sglang_memory(
    setup: EngineSetup,
    mem_fraction_static: float,
    *,
    free_bytes_at_start: int,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> EngineMemory:
    """One SGLang replica's bytes on each of its GPUs at ``mem_fraction_static``.

    ``free_bytes_at_start``: the GPU memory free before the engine starts (what the trainer and others leave);
    the engine's own CUDA context comes off it before SGLang measures. ``setup.enforce_eager`` is SGLang's
    ``disable_cuda_graph``; ``setup.limits`` holds ``cuda_graph_max_bs`` (``max_num_seqs``),
    ``chunked_prefill_size`` (``max_num_batched_tokens``) and ``page_size`` (``block``). The activation peak is a
    prefill chunk of ``chunked_prefill_size`` tokens and the sampler over ``cuda_graph_max_bs`` rows. Raises
    :class:`EngineRefusal` where SGLang would refuse to start.
    """
    if setup.engine != RolloutEngine.SGLANG:
        raise ValueError(f"sglang_memory sizes an SGLang engine, not {setup.engine!r}")
    limits = setup.limits  # chunked_prefill_size, cuda_graph_max_bs, page_size: see the docstring
    if not 0.0 < mem_fraction_static <= 1.0:
        raise ValueError(f"mem_fraction_static must be in (0, 1], not {mem_fraction_static!r}")
    if not 0 <= free_bytes_at_start <= setup.gpu_memory_bytes:
        raise ValueError("free_bytes_at_start must be between 0 and the GPU's memory")
    if min(limits.max_num_batched_tokens, limits.max_num_seqs, limits.block, setup.tensor_parallel) < 1:
        raise ValueError("chunked_prefill_size, cuda_graph_max_bs, page_size and tensor_parallel must be >= 1")
    context = context_bytes(setup.own_process, coef)
    before_load = free_bytes_at_start - context  # B, measured after the engine's CUDA context
    weights = weights_per_gpu(setup.model, setup.dtype, setup.tensor_parallel)
    slack = before_load * (1 - mem_fraction_static)
    rest = int((before_load - weights) - slack)  # _profile_available_bytes
    if rest <= 0:
        raise EngineRefusal(
            f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={mem_fraction_static}"
        )
    cell = kv_bytes_per_token(setup.model, setup.dtype, setup.tensor_parallel, kv_cache_dtype=setup.kv_cache_dtype)
    tokens = rest // cell // limits.block * limits.block  # calculate_pool_sizes
    activation = max(
        forward_peak(setup.model, setup.dtype, setup.tensor_parallel, limits.max_num_batched_tokens, coef),
        sampler_peak(setup.model, setup.dtype, limits.max_num_batched_tokens, limits.max_num_seqs, coef),
    )
    non_torch = non_torch_bytes(setup.tensor_parallel, coef)
    graphs = 0
    if not setup.enforce_eager:
        sizes = sglang_capture_sizes(limits.max_num_seqs)
        graphs = graph_pool(setup.model, setup.dtype, setup.tensor_parallel, sizes[-1], len(sizes), coef)
    static = before_load - int(slack)  # weights + KV pool: the fraction's share of B
    return EngineMemory(
        engine="sglang",
        utilization=mem_fraction_static,
        requested=static,
        weights=weights,
        activation_peak=activation,
        non_torch=non_torch,
        kv_cache=tokens * cell,
        kv_tokens=tokens,
        cuda_graphs=graphs,
        context=context,
        outside=activation + non_torch + graphs + context,
        sleep_releases_graphs=True,
    )
