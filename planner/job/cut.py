"""A workload cut to a probe's depth: every model with fewer decoder layers."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from store.models import with_layers
from store.records import Workload


def cut_workload(workload: Workload, layers: int | None) -> Workload:
    """The workload with every model cut to ``layers`` decoder layers (None: as is)."""
    if layers is None:
        return workload
    cut: dict[str, Any] = {"model": with_layers(workload.model, min(layers, workload.model.num_layers))}
    for role in ("ref_model", "critic_model", "reward_model"):
        spec = getattr(workload, role)
        if spec is not None:
            cut[role] = with_layers(spec, min(layers, spec.num_layers))
    return replace(workload, **cut)
