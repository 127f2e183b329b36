"""One rollout-engine replica as it is started: the records every engine rule and every caller share.

:class:`EngineLimits` holds the batch limits an engine starts with and its KV block; :class:`EngineSetup` the
replica itself (engine, model, dtype, tensor parallelism, GPU, graphs or eager, its own process or not, the
limits). The engine rules (:func:`search.rollout.vllm_rules.vllm_memory`,
:func:`search.rollout.sglang_rules.sglang_memory`), the utilization solver
(:func:`search.rollout.solve.utilization_range`) and the RLHF step (:mod:`search.rlhf.engine`) read the same
record, so a setting travels once instead of as a list of keywords.

The defaults follow the engines' own code: vLLM 0.19.1 ``engine/arg_utils.py`` ``EngineArgs.get_batch_defaults``
(:func:`vllm_default_batch`) and ``CacheConfig.block_size`` (16); SGLang 0.5.23's page
(1 token) and the server arguments the planner leaves at the value its launcher takes on an 80 GB GPU
(``server_args.py``: ``chunked_prefill_size``, ``cuda_graph_max_bs``); a framework's own batch where it passes one
(``store.frameworks.framework_engine_batch``: veRL).
"""

from __future__ import annotations

from dataclasses import dataclass

from store.choices import RolloutEngine
from store.frameworks import framework_engine_batch
from store.records import ModelSpec
from store.rollout import INFERENCE_ENGINES

__all__ = [
    "ENGINE_OWN_PROCESS",
    "SGLANG_CHUNKED_PREFILL",
    "SGLANG_GRAPH_MAX_BS",
    "SGLANG_PAGE_SIZE",
    "BIG_GPU_BYTES",
    "VLLM_BLOCK_SIZE",
    "EngineLimits",
    "EngineSetup",
    "engine_limits",
    "vllm_default_batch",
]

ENGINE_OWN_PROCESS = True  # OpenRLHF's engines are Ray actors: a process (and a CUDA context) of their own
VLLM_BLOCK_SIZE = 16  # vLLM's default KV block (CacheConfig.block_size)
SGLANG_PAGE_SIZE = 1  # SGLang's default page (server_args.py page_size): one token
# SGLang's server arguments the planner leaves at a value its launcher takes on an 80 GB GPU (server_args.py:
# chunked_prefill_size, cuda_graph_max_bs); the rollout's own batch decides what runs, these size the profile
SGLANG_CHUNKED_PREFILL = 8192
SGLANG_GRAPH_MAX_BS = 256
BIG_GPU_BYTES = 70 * 2**30  # engine/arg_utils.py: "device_memory >= 70 * GiB_bytes and 'a100' not in device_name"


@dataclass(frozen=True)
class EngineLimits:
    """The batch limits an engine starts with: vLLM's ``max_num_seqs`` / ``max_num_batched_tokens`` (the
    ``vllm.LLM`` defaults for the GPU), SGLang's ``cuda_graph_max_bs`` / ``chunked_prefill_size``; the KV block
    (vLLM's ``block_size``, SGLang's ``page_size``)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block: int


@dataclass(frozen=True)
class EngineSetup:
    """One vLLM or SGLang replica as it is started, on each of its ``tensor_parallel`` GPUs.

    ``enforce_eager``: vLLM's ``enforce_eager`` / SGLang's ``disable_cuda_graph`` (no CUDA graphs captured).
    ``own_process``: the engine runs in a process of its own (a CUDA context of its own). ``kv_cache_dtype``:
    vLLM's ``kv_cache_dtype`` (None: the model's dtype).
    """

    engine: str  # RolloutEngine.VLLM or RolloutEngine.SGLANG
    model: ModelSpec
    dtype: str
    tensor_parallel: int
    gpu_memory_bytes: int
    limits: EngineLimits
    enforce_eager: bool
    own_process: bool
    kv_cache_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.engine not in INFERENCE_ENGINES:
            raise ValueError(f"engine must be vllm or sglang, not {self.engine!r}")


def vllm_default_batch(gpu_memory_bytes: int, gpu_name: str = "") -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` that ``vllm.LLM`` takes when they are not given (vLLM 0.19.1
    ``engine/arg_utils.py`` ``EngineArgs.get_batch_defaults``: 16384 and 1024 on GPUs of 70 GiB or more other
    than the A100, else 8192 and 256)."""
    if gpu_memory_bytes >= BIG_GPU_BYTES and "a100" not in gpu_name.lower():
        return 16384, 1024
    return 8192, 256


def engine_limits(engine: str, gpu_memory_bytes: int, gpu_name: str, framework: str = "deepspeed") -> EngineLimits:
    """The limits of ``engine`` on this GPU (see :class:`EngineLimits`) as ``framework`` starts it: veRL passes its
    own ``max_num_batched_tokens`` and ``max_num_seqs`` (``store.frameworks.framework_engine_batch``)."""
    own = framework_engine_batch(framework, engine)
    if own is not None:
        return EngineLimits(own[1], own[0], VLLM_BLOCK_SIZE)
    if engine == RolloutEngine.VLLM:
        tokens, seqs = vllm_default_batch(gpu_memory_bytes, gpu_name)
        return EngineLimits(seqs, tokens, VLLM_BLOCK_SIZE)
    return EngineLimits(SGLANG_GRAPH_MAX_BS, SGLANG_CHUNKED_PREFILL, SGLANG_PAGE_SIZE)
