"""DeepSpeed settings that both the config renderer (probes) and the cost model (search) must agree on.

Bucket sizes decide real GPU buffers, so they live here once: the exported ``ds_config.json`` carries
exactly these numbers and the memory model counts exactly these bytes. Sizes are in elements, as
DeepSpeed counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.records import ModelSpec

# ZeRO-1/2: transformers' documented ZeRO-2 example (2e8 elements); DeepSpeed's own default is 5e8,
# which costs 2 x 1 GB of fp16 buckets with overlap_comm and rarely buys speed on one node.
ZERO12_BUCKET_ELEMENTS = 200_000_000
OVERLAP_COMM = True
CONTIGUOUS_GRADIENTS = True
PIN_MEMORY = True
# ZeRO-3 steps the optimizer one sub-group at a time; DeepSpeed's default, left out of the config.
ZERO3_SUB_GROUP_SIZE = 1_000_000_000
GRADIENT_CLIPPING = 1.0
LEARNING_RATE = 1e-5
WEIGHT_DECAY = 0.0


@dataclass(frozen=True)
class Zero3Buckets:
    """ZeRO-3 knobs sized from the hidden size, as transformers' ``"auto"`` values are."""

    reduce_bucket_size: int
    prefetch_bucket_size: int
    param_persistence_threshold: int
    max_live_parameters: int
    max_reuse_distance: int


def zero3_buckets(model: ModelSpec) -> Zero3Buckets:
    """ZeRO-3 bucket sizes for ``model``: hidden^2, 0.9 hidden^2, 10 hidden (transformers' "auto")."""
    hidden = model.hidden_size
    return Zero3Buckets(
        reduce_bucket_size=hidden * hidden,
        prefetch_bucket_size=int(0.9 * hidden * hidden),
        param_persistence_threshold=10 * hidden,
        max_live_parameters=1_000_000_000,
        max_reuse_distance=1_000_000_000,
    )
