"""ZeRO-3 over several ranks: the parameters that stay gathered from their forward to their backward.

On one rank ZeRO-3 gathers nothing (the partition is the whole parameter). On N > 1 ranks each module's
parameters are all-gathered into full tensors before its forward and, once the step's trace is complete,
released after it only if they are not used again soon: ``partitioned_param_coordinator.py``
(``__params_to_release``) walks the trace from the module on and keeps every parameter it meets again
before ``stage3_max_reuse_distance`` elements of parameters have been traversed. The trace is the forward
in module order, then the backward in reverse (with gradient checkpointing, each layer's recompute before
its backward). So a module whose next use lies within the distance stays gathered across the turn from
forward to backward: the parameters of the last modules, up to about half the distance (a third with
recompute, each later layer being traversed three times), are all live at the end of the forward and the
start of the backward.

The modules, at decoder-layer granularity, in forward order: the embeddings, each decoder layer, the LM
head (an untied one; a tied head uses the embedding, which is then used last in the forward). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.model.shapes import token_embedding_params
from store.records import ModelSpec


@dataclass(frozen=True)
class Zero3Reuse:
    """Parameters (elements) kept gathered across the forward-backward turn: those of the modules up to the
    last decoder layer (live from the last layer's forward through its backward), and all of them (live at
    the loss: the LM head too)."""

    through_layers: int
    total: int


def zero3_reuse(
    model: ModelSpec, lm_head: bool, gradient_checkpointing: bool, world_size: int, distance: int
) -> Zero3Reuse:
    """What DeepSpeed's reuse distance (``stage3_max_reuse_distance``, parameters) keeps gathered for ``model``
    (none on one rank; see the module)."""
    if world_size <= 1:
        return Zero3Reuse(0, 0)
    embedding = token_embedding_params(model)
    layers = list(model.layer_param_counts) or [model.layer_params] * model.num_layers
    head = model.lm_head_params if lm_head else 0
    tied = lm_head and not model.lm_head_params
    # forward order; a tied embedding's last forward use is the LM head's
    items = ([] if tied else [embedding]) + layers + [embedding if tied else head]
    uses = 3 if gradient_checkpointing else 2  # later modules met before the module's own backward
    kept = [False] * len(items)
    later = 0
    for index in range(len(items) - 1, -1, -1):
        kept[index] = uses * later < distance
        later += items[index]
    total = sum(size for size, keep in zip(items, kept, strict=True) if keep)
    return Zero3Reuse(through_layers=total - (items[-1] if kept[-1] else 0), total=total)
