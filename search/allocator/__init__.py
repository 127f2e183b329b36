"""A pure-Python port of torch's CUDA caching allocator rules, to replay allocation streams exactly.

- :mod:`search.allocator.config`: ``PYTORCH_CUDA_ALLOC_CONF`` settings and the size rules.
- :mod:`search.allocator.blocks`: blocks, pools, expandable segments' pages, statistics.
- :mod:`search.allocator.core`, :mod:`search.allocator.expandable`, :mod:`search.allocator.caching`: the
  allocator (``DeviceCachingAllocator``), layered block rules -> expandable segments -> malloc/free.
- :mod:`search.allocator.replaying`: :func:`replay`, an :class:`store.alloc_stream.AllocStream` through the
  allocator, phase by phase.

No torch import: the rules are ported from ``c10/cuda/CUDACachingAllocator.cpp`` (commit 001074d25084).
"""

from search.allocator.blocks import AllocatorStats, Stat
from search.allocator.caching import AllocatorOOM, CachingAllocator
from search.allocator.config import AllocatorConfig, allocation_size, parse_alloc_conf, round_size
from search.allocator.replaying import PhaseReplay, ReplayResult, replay

__all__ = [
    "AllocatorConfig",
    "AllocatorOOM",
    "AllocatorStats",
    "CachingAllocator",
    "PhaseReplay",
    "ReplayResult",
    "Stat",
    "allocation_size",
    "parse_alloc_conf",
    "replay",
    "round_size",
]
