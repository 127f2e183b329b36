"""The caching allocator's settings (``PYTORCH_CUDA_ALLOC_CONF``) and its size rules.

Ported from PyTorch's sources (read, not copied): ``c10/cuda/CUDACachingAllocator.cpp`` at commit
001074d25084fdb87a799823e395a50f5ec044d3 for the rules, the ``AcceleratorAllocatorConfig`` parser of
``c10/core/AllocatorConfig.cpp`` and ``c10/cuda/CUDAAllocatorConfig.cpp`` (01f9ef32eae5) for the settings,
checked against the headers that torch 2.13.0 (cf30153c4c13) installs (``c10/core/AllocatorConfig.h``,
``c10/cuda/CUDAAllocatorConfig.h``): those add ``large_segment_size_mb`` (default 20 MiB, the old
``kLargeBuffer``), ``max_non_split_rounding_mb`` (default: the large segment size) and
``per_process_memory_fraction``; every default reproduces the rules of the .cpp read above.

Simplifications: a number must be plain decimal digits (``std::stoull`` would also read ``"12abc"`` as 12
or wrap ``"-1"``); ``backend:cudaMallocAsync`` is refused, since that backend has none of these rules;
the pinned-memory, lock and ``throw_on_cudamalloc_oom`` keys are accepted and have no effect here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from search.allocator.tokens import Tokens

MB = 1 << 20
MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size is rounded to at least this
SMALL_SIZE = MB  # kSmallSize: the largest request served by the small pool
SMALL_BUFFER = 2 * MB  # kSmallBuffer: small-pool segments (and small expandable pages)
LARGE_BUFFER = 20 * MB  # kLargeBuffer: the default large segment (and large expandable page)
MIN_LARGE_ALLOC = 10 * MB  # kMinLargeAlloc: requests below it get a whole large segment
ROUND_LARGE = 2 * MB  # kRoundLarge: larger requests get a segment of their size rounded to this
SIZE_MAX = (1 << 64) - 1  # std::numeric_limits<size_t>::max(): "no max_split_size"
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB, one slot per power of two
NO_ROUNDUP: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS

_BOOL_KEYS = frozenset(
    {
        "release_lock_on_cudamalloc",
        "release_lock_on_hipmalloc",
        "pinned_use_cuda_host_register",
        "pinned_use_hip_host_register",
        "graph_capture_record_stream_reuse",
        "pinned_free_catch_all",
        "throw_on_cudamalloc_oom",
        "pinned_use_background_threads",
    }
)
_MB_KEYS = {  # keys given in MiB -> the AllocatorConfig field (bytes)
    "max_split_size_mb": "max_split_size",
    "max_non_split_rounding_mb": "max_non_split_rounding_size",
    "large_segment_size_mb": "large_segment_size",
}
_NUMBER_KEYS = frozenset({"pinned_num_register_threads", "pinned_reserve_segment_size_mb"})


@dataclass(frozen=True)
class AllocatorConfig:
    """The settings the caching allocator's rules read (``AcceleratorAllocatorConfig``).

    ``max_split_size`` is in bytes, ``None`` for unlimited (torch's ``SIZE_MAX``). ``roundup_power2_divisions``
    is the source's table of 16 division counts, one per power-of-two interval of request sizes from 1 MiB
    (index 0 also covers smaller sizes) to 64 GiB and above; 0 or 1 means plain 512-byte rounding. An int
    is accepted and fills the table (the ``roundup_power2_divisions:4`` form). ``garbage_collection_threshold``
    of 0 means off. ``per_process_memory_fraction`` models ``torch.cuda.set_per_process_memory_fraction``:
    ``None`` means never set (then no memory cap and no garbage collection, as in the source).
    """

    max_split_size: int | None = None
    roundup_power2_divisions: tuple[int, ...] = NO_ROUNDUP
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    max_non_split_rounding_size: int = LARGE_BUFFER
    large_segment_size: int = LARGE_BUFFER
    per_process_memory_fraction: float | None = None

    def __post_init__(self) -> None:
        divisions: object = self.roundup_power2_divisions
        if isinstance(divisions, int):
            object.__setattr__(self, "roundup_power2_divisions", (divisions,) * ROUNDUP_INTERVALS)
        elif len(self.roundup_power2_divisions) != ROUNDUP_INTERVALS:
            raise ValueError(f"roundup_power2_divisions needs {ROUNDUP_INTERVALS} entries (1 MiB .. 64 GiB)")
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise ValueError("garbage_collection_threshold must be in [0, 1) (0 = off)")
        fraction = self.per_process_memory_fraction
        if fraction is not None and not 0.0 <= fraction <= 1.0:
            raise ValueError("per_process_memory_fraction must be in [0, 1]")

    def divisions(self, size: int) -> int:
        """Division count for ``size`` bytes (``AcceleratorAllocatorConfig::roundup_power2_divisions(size)``)."""
        index = max(size.bit_length() - 1 - 20, 0)  # interval 0 starts at 1 MiB = 2**20
        return self.roundup_power2_divisions[min(index, ROUNDUP_INTERVALS - 1)]

    @property
    def split_limit(self) -> int:
        """``max_split_size`` as the source compares it: ``SIZE_MAX`` when unlimited."""
        return SIZE_MAX if self.max_split_size is None else self.max_split_size


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round ``size`` up to the next of ``divisions`` equal steps between two powers of two.

    Follows ``roundup_power2_next_division``: a power of two stays; the step is the power-of-two floor
    shifted right by floor(log2(divisions)); 1200 with 4 divisions gives 1280.
    """
    if size & (size - 1) == 0:
        return size
    if divisions < 2:
        raise ValueError("Only 2 or more divisions are supported")
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def round_size(size: int, config: AllocatorConfig | None = None) -> int:
    """The block size a request of ``size`` bytes gets (``round_size``).

    Below 512 bytes: 512. With more than one division set for the size's interval and ``size`` above
    512 x divisions: :func:`roundup_power2_next_division`. Otherwise a multiple of 512.
    """
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    divisions = config.divisions(size) if config is not None else 0
    if divisions > 1 and size > MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def allocation_size(size: int, config: AllocatorConfig | None = None) -> int:
    """The segment a cudaMalloc gets for a rounded request of ``size`` bytes (``get_allocation_size``).

    Small pool (<= 1 MiB): 2 MiB. Below 10 MiB: one large segment (20 MiB unless ``large_segment_size``
    says otherwise). Otherwise ``size`` rounded up to 2 MiB.
    """
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return config.large_segment_size if config is not None else LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _parse_divisions(tokens: Tokens, i: int) -> tuple[int, tuple[int, ...]]:
    """``roundup_power2_divisions``: one power of two, or ``[MB:div, ..., >:div]``.

    Follows ``parseRoundUpPower2Divisions``: a boundary of B MiB sets slot floor(log2 B) (clamped to 0..15);
    the first entry also fills every slot below it; ``>`` fills the slots after the last boundary.
    """
    key = "roundup_power2_divisions"
    tokens.expect(i + 1, ":")
    i += 2
    if tokens.at(i, f"a value for {key}") != "[":
        value = tokens.number(i, key)
        if not _is_power_of_two(value):
            raise tokens.fail(f"{key} must be a power of 2, got {value}")
        return i, (value,) * ROUNDUP_INTERVALS
    table = list(NO_ROUNDUP)
    first, last_index = True, 0
    while tokens.at(i + 1, "']'") != "]":
        i += 1
        boundary = tokens.items[i]
        tokens.expect(i + 1, ":")
        value = tokens.number(i + 2, key)
        i += 2
        if value and not _is_power_of_two(value):
            raise tokens.fail(f"{key} entries must be a power of 2 or 0, got {value}")
        if boundary == ">":
            table[last_index + 1 :] = [value] * (ROUNDUP_INTERVALS - last_index - 1)
        else:
            start = tokens.number(i - 2, f"{key} interval")
            if not _is_power_of_two(start):
                raise tokens.fail(f"{key} intervals must be powers of 2 (MiB), got {start}")
            index = min(start.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                table[:index] = [value] * index
                first = False
            table[index] = value
            last_index = index
        if tokens.at(i + 1, "']'") != "]":
            tokens.expect(i + 1, ",")
            i += 1
    return i + 1, tuple(table)


def _with(config: AllocatorConfig, name: str, value: Any) -> AllocatorConfig:
    return replace(config, **{name: value})


def parse_alloc_conf(text: str) -> AllocatorConfig:
    """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` string, as ``AcceleratorAllocatorConfig::parseArgs`` and the CUDA
    hook ``CUDAAllocatorConfig::parseArgs`` do; raises ValueError naming the first problem.

    Example: ``"max_split_size_mb:128,expandable_segments:True,garbage_collection_threshold:0.6,"
    "roundup_power2_divisions:[256:1,512:2,>:4]"``. Bounds as in the source: ``large_segment_size_mb`` > 10,
    ``max_split_size_mb`` and ``max_non_split_rounding_mb`` >= the large segment size in MiB,
    ``garbage_collection_threshold`` in (0, 1).
    """
    tokens = Tokens(text)
    config = AllocatorConfig()
    i, n = 0, len(tokens.items)
    while i < n:
        key = tokens.items[i]
        if key in _MB_KEYS:
            tokens.expect(i + 1, ":")
            i += 2
            mb = tokens.number(i, key)
            least = MIN_LARGE_ALLOC // MB + 1 if key == "large_segment_size_mb" else config.large_segment_size // MB
            if mb < least:
                raise tokens.fail(f"{key} must be >= {least}, got {mb}")
            config = _with(config, _MB_KEYS[key], min(mb, SIZE_MAX // MB) * MB)
        elif key in ("garbage_collection_threshold", "per_process_memory_fraction"):
            tokens.expect(i + 1, ":")
            i += 2
            value = tokens.real(i, key)
            inside = 0.0 < value < 1.0 if key == "garbage_collection_threshold" else 0.0 <= value <= 1.0
            if not inside:
                raise tokens.fail(f"{key} out of range, got {value}")
            config = _with(config, key, value)
        elif key == "roundup_power2_divisions":
            i, table = _parse_divisions(tokens, i)
            config = replace(config, roundup_power2_divisions=table)
        elif key == "expandable_segments" or key in _BOOL_KEYS:
            tokens.expect(i + 1, ":")
            i += 2
            flag = tokens.boolean(i, key)
            if key == "expandable_segments":
                config = replace(config, expandable_segments=flag)
        elif key in _NUMBER_KEYS:
            tokens.expect(i + 1, ":")
            i += 2
            tokens.number(i, key)
        elif key == "backend":
            tokens.expect(i + 1, ":")
            i += 2
            backend = tokens.at(i, "a value for backend")
            if backend != "native":
                raise tokens.fail(f"backend {backend!r} is not the native caching allocator modelled here")
        else:
            raise tokens.fail(f"unrecognized key {key!r}")
        if i + 1 < n:
            tokens.expect(i + 1, ",")
            i += 1
        i += 1
    return config
