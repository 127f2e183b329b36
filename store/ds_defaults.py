"""DeepSpeed settings that both the config renderer (probes) and the cost model (search) must agree on.

Bucket sizes decide real GPU buffers, so they live here once: the exported ``ds_config.json`` carries
exactly these numbers and the memory model counts exactly these bytes. Sizes are in elements, as
DeepSpeed counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.ds_buckets import ZeroBuckets
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
    return zero3_buckets_of(model.hidden_size)


def zero3_buckets_of(hidden: int) -> Zero3Buckets:
    """ZeRO-3 bucket sizes for a model of this hidden size (see :func:`zero3_buckets`)."""
    return Zero3Buckets(
        reduce_bucket_size=hidden * hidden,
        prefetch_bucket_size=int(0.9 * hidden * hidden),
        param_persistence_threshold=10 * hidden,
        max_live_parameters=1_000_000_000,
        max_reuse_distance=1_000_000_000,
    )


def memplan_buckets(hidden_size: int, zero_stage: int) -> ZeroBuckets:
    """The buckets DeepSpeed runs memplan's exported config with, for a model of ``hidden_size``: the keys the
    config sets for ``zero_stage`` and DeepSpeed's defaults for those it leaves out."""
    if zero_stage == 3:
        zero3 = zero3_buckets_of(hidden_size)
        return ZeroBuckets(
            reduce_bucket_size=zero3.reduce_bucket_size,
            overlap_comm=OVERLAP_COMM,
            contiguous_gradients=CONTIGUOUS_GRADIENTS,
            prefetch_bucket_size=zero3.prefetch_bucket_size,
            param_persistence_threshold=zero3.param_persistence_threshold,
            max_live_parameters=zero3.max_live_parameters,
            max_reuse_distance=zero3.max_reuse_distance,
            sub_group_size=ZERO3_SUB_GROUP_SIZE,
        )
    return ZeroBuckets(
        reduce_bucket_size=ZERO12_BUCKET_ELEMENTS,
        allgather_bucket_size=ZERO12_BUCKET_ELEMENTS,
        overlap_comm=OVERLAP_COMM,
        contiguous_gradients=CONTIGUOUS_GRADIENTS,
        sub_group_size=ZERO3_SUB_GROUP_SIZE,
    )


def buckets_of(ds_buckets: ZeroBuckets | None, model: ModelSpec, zero_stage: int) -> ZeroBuckets:
    """A strategy's buckets: its own (a user's config) or, when it has none, memplan's for ``model``."""
    return ds_buckets if ds_buckets is not None else memplan_buckets(model.hidden_size, zero_stage)
