"""Which layers a hybrid model has, and the two-layer cut that keeps one of each kind (Qwen3-Next's linear and full
attention). Apart from :mod:`probes.trace.hybrid` so that :mod:`probes.trace.activations` can cut a hybrid without
importing the module that traces it."""

from __future__ import annotations

from collections import Counter
from typing import Any

LINEAR = "linear_attention"


def layer_kinds(hf_config: dict[str, Any]) -> dict[str, int] | None:
    """How many layers of each kind a hybrid config has (``layer_types`` of transformers' config object, with
    the class's default pattern where the file has none), in the order each kind first comes; None where the
    layers are not a mix of linear attention and other kinds."""
    from probes.model.shape import config_object

    types = getattr(config_object(hf_config, "trace"), "layer_types", None)
    if not isinstance(types, list) or LINEAR not in types or len(set(types)) < 2:
        return None
    return dict(Counter(str(kind) for kind in types))


def hybrid_cut(hf_config: dict[str, Any], layers: int) -> dict[str, Any] | None:
    """``hf_config`` whose cut to ``layers`` layers keeps one layer of each kind, in the order the model first
    has them (``layer_types``); None for a model that is not a hybrid. ValueError where a cut of ``layers``
    layers cannot hold every kind."""
    kinds = layer_kinds(hf_config)
    if kinds is None:
        return None
    if len(kinds) != layers:
        raise ValueError(f"a hybrid of {len(kinds)} kinds of layers ({', '.join(kinds)}): the cut holds {layers}")
    if isinstance(hf_config.get("text_config"), dict):  # a multimodal config: its text model's layers
        return {**hf_config, "text_config": {**hf_config["text_config"], "layer_types": list(kinds)}}
    return {**hf_config, "layer_types": list(kinds)}
