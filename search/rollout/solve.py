"""The utilizations (vLLM's ``gpu_memory_utilization``, SGLang's ``mem_fraction_static``) that serve a rollout.

On the grid of hundredths users write: the least whose KV cache holds the rollout's sequences, each rounded up
to whole blocks (vLLM ``v1/core/kv_cache_utils.py``: a request takes ``cdiv(tokens, block_size)`` blocks;
SGLang: whole pages), and the most whose awake footprint fits beside the trainer. Both ends are exact for the
engine's own rounding (``ceil`` of the requested bytes, ``floor`` of the blocks): the scan evaluates the engine
rules at every hundredth rather than inverting them, and everything it tests is monotone in the utilization.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients
from search.rollout.engine_memory import EngineMemory
from search.rollout.engine_setup import EngineSetup
from search.rollout.engine_shape import EngineRefusal
from search.rollout.sglang_rules import sglang_memory
from search.rollout.vllm_rules import vllm_memory
from store.choices import RolloutEngine

__all__ = ["STEPS", "engine_memory", "utilization_range"]

STEPS = 100  # utilizations 0.01, 0.02, ... 1.00


@lru_cache(maxsize=4096)
def utilization_range(
    setup: EngineSetup,
    *,
    sequences: int,
    tokens_per_sequence: int,
    room_bytes: int,
    free_bytes_at_start: int | None = None,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> tuple[float, float] | None:
    """``(least, most)`` utilization of the engine ``setup``, in hundredths, or None when no utilization works.

    least (rounded up): the engine starts and its KV cache holds ``sequences`` sequences of
    ``tokens_per_sequence`` tokens at once (vLLM's ``max_model_len`` is ``tokens_per_sequence``), each in whole
    blocks of ``setup.limits.block`` tokens. most (rounded down): the engine starts and its awake bytes
    (``EngineMemory.awake``) fit in ``room_bytes``, the GPU bytes left beside the trainer. ``free_bytes_at_start``:
    free GPU memory before the engine starts (vLLM refuses above it; SGLang sizes its pool from it, so it is
    required there).
    """
    if sequences < 1 or tokens_per_sequence < 1:
        raise ValueError("sequences and tokens_per_sequence must be >= 1")
    # Refusals are a prefix (too little budget for any KV cache) and, for vLLM, a suffix (more requested than is
    # free at start-up); KV tokens and the awake bytes grow with the utilization in between. So each end is a
    # binary search over the hundredths, with the start-up check applied apart (vLLM request_memory).
    vllm_check = setup.engine == RolloutEngine.VLLM and free_bytes_at_start is not None
    memory = _engine_rule(
        setup,
        max_model_len=tokens_per_sequence,
        free_bytes_at_start=None if vllm_check else free_bytes_at_start,
        coef=coef,
    )

    def starts(m: EngineMemory) -> bool:
        return not vllm_check or free_bytes_at_start - m.context >= m.requested  # type: ignore[operator]

    block = setup.limits.block
    needed_tokens = sequences * -(-tokens_per_sequence // block) * block  # whole blocks per sequence
    least = _first(lambda k: _holds(memory(k / STEPS), needed_tokens))
    if least is None or not starts(memory(least / STEPS)):  # type: ignore[arg-type]
        return None
    lowest = _first(lambda k: memory(k / STEPS) is not None)
    assert lowest is not None

    def fits(k: int) -> bool:
        m = memory(k / STEPS)
        return m is not None and starts(m) and _fits(m, room_bytes)

    if not fits(lowest):
        return None
    most = _last(fits, lowest)
    if least > most:
        return None
    return least / STEPS, most / STEPS


def _first(holds: Callable[[int], bool]) -> int | None:
    """The least k in 1..STEPS where ``holds`` (false below it, true from it on), or None."""
    low, high = 1, STEPS + 1
    while low < high:
        mid = (low + high) // 2
        if holds(mid):
            high = mid
        else:
            low = mid + 1
    return low if low <= STEPS else None


def _last(holds: Callable[[int], bool], start: int) -> int:
    """The largest k in start..STEPS where ``holds`` (true from ``start`` up to it, false above)."""
    low, high = start, STEPS
    while low < high:
        mid = (low + high + 1) // 2
        if holds(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _holds(memory: EngineMemory | None, needed_tokens: int) -> bool:
    return memory is not None and memory.kv_tokens >= needed_tokens


def _fits(memory: EngineMemory | None, room_bytes: int) -> bool:
    return memory is not None and memory.awake <= room_bytes


def engine_memory(
    setup: EngineSetup,
    utilization: float,
    *,
    max_model_len: int | None,
    free_bytes_at_start: int | None,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> EngineMemory:
    """The bytes of the engine ``setup`` at ``utilization`` by its own rules (vLLM's ``gpu_memory_utilization``,
    SGLang's ``mem_fraction_static``; SGLang reads no ``max_model_len`` and needs ``free_bytes_at_start``).
    Raises :class:`EngineRefusal` where the engine would refuse to start."""
    if setup.engine == RolloutEngine.VLLM:
        return vllm_memory(
            setup, utilization, max_model_len=max_model_len, free_bytes_at_start=free_bytes_at_start, coef=coef
        )
    if free_bytes_at_start is None:
        raise ValueError("SGLang sizes its KV pool from the free memory at start: give free_bytes_at_start")
    return sglang_memory(setup, utilization, free_bytes_at_start=free_bytes_at_start, coef=coef)


def _engine_rule(
    setup: EngineSetup, *, max_model_len: int, free_bytes_at_start: int | None, coef: Coefficients
) -> Callable[[float], EngineMemory | None]:
    """The engine's memory at a utilization, or None where the engine refuses to start."""
    if setup.engine == RolloutEngine.SGLANG and free_bytes_at_start is None:
        raise ValueError("SGLang sizes its KV pool from the free memory at start: give free_bytes_at_start")

    def at(u: float) -> EngineMemory | None:
        try:
            return engine_memory(
                setup, u, max_model_len=max_model_len, free_bytes_at_start=free_bytes_at_start, coef=coef
            )
        except EngineRefusal:
            return None

    return at
