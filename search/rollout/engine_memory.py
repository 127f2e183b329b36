"""One engine replica's bytes on each of its GPUs: awake, asleep, and what sleep keeps in host memory.

Sleep follows vLLM 0.19.1 ``device_allocator/cumem.py`` ``CuMemAllocator.sleep`` (called by
``v1/worker/gpu_worker.py`` ``Worker.sleep``): only the allocations made under its memory pool leave the GPU, the
weights (tag ``"weights"``) and the KV cache (tag ``"kv_cache"``). Level 1 copies the weights to pinned host
memory (``offload_tags=("weights",)``) and discards the KV cache; level 2 discards both (only the model's
buffers are copied to host: a few MB of rotary tables, not counted). Sleep ends with ``torch.cuda.empty_cache()``,
which returns the activation peak's cached blocks. The CUDA-graph pool, the non-torch bytes and the CUDA context
stay. SGLang's ``release_memory_occupation`` (``managers/scheduler_components/weight_updater.py``) releases the
tags ``kv_cache``, ``weights`` and ``cuda_graph`` alike: its graph pool leaves too (``sleep_releases_graphs``).
"""

from __future__ import annotations

from dataclasses import dataclass

SLEEP_LEVELS: tuple[int, ...] = (0, 1, 2)


@dataclass(frozen=True)
class EngineMemory:
    """Bytes on each GPU of one vLLM or SGLang replica, from the engine's own start-up rules.

    ``requested`` is the budget the utilization asks for (vLLM: ``ceil(total x gpu_memory_utilization)``, which
    holds the weights, the activation peak, the non-torch bytes and the KV cache; SGLang: the static share
    ``mem_fraction_static x free memory before loading``, which holds the weights and the KV cache).
    ``outside`` is what the engine holds beyond that budget (the CUDA context of its own process, CUDA graphs
    outside the budget, and for SGLang the activations and non-torch bytes). The KV cache is a whole number of
    blocks, so the parts inside the budget may fall short of it by less than one block per layer.
    """

    engine: str  # "vllm" or "sglang"
    utilization: float  # the fraction asked for: gpu_memory_utilization / mem_fraction_static
    requested: int  # the budget the utilization asks for
    weights: int  # the 16-bit weights on this rank
    activation_peak: int  # torch's peak above the weights in the profile run (vLLM) or the largest prefill chunk
    non_torch: int  # outside torch's allocator: kernels, workspaces, NCCL and custom all-reduce buffers
    kv_cache: int  # bytes of the KV cache (whole blocks)
    kv_tokens: int  # tokens the KV cache holds: blocks x block size (SGLang: pages x page size)
    cuda_graphs: int  # the CUDA-graph pool; 0 with enforce_eager
    context: int  # the engine process's CUDA context; 0 when it shares the trainer's process
    outside: int  # bytes held beyond ``requested``
    sleep_releases_graphs: bool = False  # SGLang's memory saver releases the graph pool as well

    @property
    def allocated(self) -> int:
        """The bytes the parts add up to (at most ``awake``: the budget's rounding remainder is not held)."""
        parts = (self.weights, self.activation_peak, self.non_torch, self.kv_cache, self.cuda_graphs, self.context)
        return sum(parts)

    @property
    def awake(self) -> int:
        """GPU bytes while generating: the whole budget plus what lies outside it."""
        return self.requested + self.outside

    def asleep(self, level: int) -> int:
        """GPU bytes left while the engine sleeps at ``level`` (0: it does not sleep)."""
        _check_level(level)
        if level == 0:
            return self.awake
        graphs = 0 if self.sleep_releases_graphs else self.cuda_graphs
        return self.non_torch + self.context + graphs

    def host_backup(self, level: int) -> int:
        """Pinned host bytes per GPU that sleep keeps: the weights at level 1, nothing at levels 0 and 2."""
        _check_level(level)
        return self.weights if level == 1 else 0

    def freed_by_sleep(self, level: int) -> int:
        """GPU bytes that sleeping at ``level`` hands back to the trainer."""
        return self.awake - self.asleep(level)


def _check_level(level: int) -> None:
    if level not in SLEEP_LEVELS or isinstance(level, bool):
        raise ValueError(f"sleep level must be 0, 1 or 2, not {level!r}")
