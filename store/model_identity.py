"""A model's identity is its shape (its config), never the name it is called by.

Two names of one shape must give one plan, and whatever the store has cached must not change that. Here:

- :func:`identity_config`: an HF config reduced to what decides the model's tensors: without the keys that
  only label it (``architectures``, ``torch_dtype``, token ids, ``transformers_version``...), and with a key
  whose value is empty (``None``, ``False``, ``0``, ``""``, ``[]``, ``{}``) the same as an absent one;
- :func:`identity_key`: a hash of it (the store's shape cache key, with the library versions);
- :func:`catalog_twin`: the catalog model whose config is the same shape (the local copy of a catalog
  model's ``config.json`` is that model: its traced shape and activations), or the nearest one of the same
  family with what differs (:class:`Twin`);
- :func:`config_differences`: what differs between two configs, said key by key.

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from store.model_catalog import CATALOG

# Keys of a config.json that label a model or a run and make no tensor of it: tokens ids, the saved dtype,
# the writing library, the class names, the generation cache switch, the weights' initialisation.
LABEL_KEYS = frozenset(
    {
        "_name_or_path",
        "architectures",
        "auto_map",
        "bos_token_id",
        "dtype",
        "eos_token_id",
        "initializer_range",
        "output_attentions",
        "output_hidden_states",
        "pad_token_id",
        "return_dict",
        "tokenizer_class",
        "torch_dtype",
        "transformers_version",
        "use_cache",
    }
)
# Keys that set only the rotary frequencies and the longest context of a rotary model: transformers' code of
# these families (LlamaRotaryEmbedding and its copies) builds no tensor whose size they decide, so two configs
# that differ only in them save the same activations (the context limit is still each config's own).
ROTARY_ONLY_KEYS = frozenset({"max_position_embeddings", "rope_scaling", "rope_theta", "rope_parameters"})
ROTARY_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "phi3", "smollm3"})
MAX_SHOWN = 4  # differences a plan names at most
NEAREST_MAX = 6  # a catalog model differing in more keys than this is not "near"


def _empty(value: Any) -> bool:
    return value is None or value is False or value == 0 or value in ("", [], {})


def identity_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without its label keys (:data:`LABEL_KEYS`) and empty values, nested configs likewise:
    what decides the model's tensors."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in LABEL_KEYS:
            continue
        if isinstance(value, dict) and key.endswith("_config"):
            value = identity_config(value)
        if not _empty(value):
            out[key] = value
    return out


def identity_key(config: dict[str, Any], versions: dict[str, str] | None = None, version: int = 0) -> str:
    """A hash of :func:`identity_config` (with ``versions`` and ``version`` where given): one key per shape."""
    text = json.dumps(
        {"config": identity_config(config), "versions": versions or {}, "shape_version": version},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _shown(value: Any) -> str:
    text = "absent" if _empty(value) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def config_differences(here: dict[str, Any], there: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The keys whose values differ between two configs' :func:`identity_config`, with (here, there)."""
    mine, theirs = identity_config(here), identity_config(there)
    keys = sorted(set(mine) | set(theirs))
    return {key: (mine.get(key), theirs.get(key)) for key in keys if mine.get(key) != theirs.get(key)}


def describe_differences(differences: dict[str, tuple[Any, Any]], other: str) -> str:
    """``key here X, <other> Y; ...`` for the first :data:`MAX_SHOWN` differences (and how many more)."""
    shown = [f"{key} {_shown(a)} here, {_shown(b)} in {other}" for key, (a, b) in list(differences.items())[:MAX_SHOWN]]
    more = len(differences) - MAX_SHOWN
    return "; ".join(shown) + (f"; and {more} more key(s)" if more > 0 else "")


@dataclass(frozen=True)
class Twin:
    """The catalog model nearest a config: ``name`` and ``config``, the keys that differ (none: the same
    shape), and whether its traced activations hold for the config (the same shape, or a rotary family that
    differs only in :data:`ROTARY_ONLY_KEYS`)."""

    name: str
    config: dict[str, Any]
    differences: dict[str, tuple[Any, Any]]

    @property
    def same_shape(self) -> bool:
        return not self.differences

    @property
    def same_activations(self) -> bool:
        if self.same_shape:
            return True
        rotary = self.config.get("model_type") in ROTARY_FAMILIES
        return rotary and set(self.differences) <= ROTARY_ONLY_KEYS

    def describe(self) -> str:
        """One line: the same shape as the catalog model, or what differs from it."""
        if self.same_shape:
            return f"the same shape as the catalog's {self.name} (its config but for labels such as token ids)"
        return f"the catalog's nearest model, {self.name}, differs: {describe_differences(self.differences, self.name)}"


def catalog_twin(config: dict[str, Any]) -> Twin | None:
    """The catalog model of ``config``'s shape, else the catalog model of its ``model_type`` that differs in the
    fewest keys (at most :data:`NEAREST_MAX`), else None. Among equals the catalog's order decides."""
    if not isinstance(config, dict):
        return None
    best: Twin | None = None
    for name, _, catalog_config in CATALOG:
        if catalog_config.get("model_type") != config.get("model_type"):
            continue
        differences = config_differences(config, catalog_config)
        if best is None or len(differences) < len(best.differences):
            best = Twin(name, catalog_config, differences)
        if not differences:
            break
    if best is None or len(best.differences) > NEAREST_MAX:
        return None
    return best
