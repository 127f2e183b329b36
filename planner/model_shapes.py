"""Model specs for any architecture: the catalog and formulas first, then the store's shape cache, then a trace.

A local ``config.json`` whose ``model_type`` has no pure-Python formula (Qwen3, Gemma, Phi-3, Mixtral, any
MoE...) is read once from transformers' own module tree on the meta device (``probes.model_shape``, which
imports torch and transformers) and the shape is kept in the plan database under a hash of the config and
the installed torch and transformers versions. Later plans of that config read the cache and import neither.
"""

from __future__ import annotations

import sys

from store.db import open_storage
from store.model_shape import UntracedModelError, installed_versions, shape_key, spec_from_shape
from store.models import get_model
from store.records import ModelSpec


def resolve_model(name_or_path: str, readings: list[str] | None = None, db: str | None = None) -> ModelSpec:
    """The spec of a catalog name or local config; an untraced architecture is traced once and cached in
    the database ``db`` (default: ``$PLANNER_DB`` or the user's data folder). ``readings`` gains a line
    saying where a traced shape came from."""
    try:
        return get_model(name_or_path)
    except UntracedModelError as untraced:
        name, config, source = untraced.name, untraced.config, untraced.source
    versions = installed_versions()
    key = shape_key(config, versions)
    with open_storage(db) as storage:
        shape = storage.load_model_shape(key)
        cached = shape is not None and _usable(name, config, shape)
        if not cached:  # never traced, or an entry from an older memplan that lacks a field
            shape = _trace(config, source, versions)
            storage.save_model_shape(key, shape)
    assert shape is not None
    if readings is not None:
        how = "cached shape" if cached else "traced now, cached for next time"
        readings.append(
            f"model: {source} (model_type {config['model_type']}) read from transformers "
            f"{versions['transformers']}'s module tree ({how})"
        )
    return spec_from_shape(name, config, shape)


def _usable(name: str, config: dict[str, object], shape: dict[str, object]) -> bool:
    try:
        spec_from_shape(name, config, shape)
    except (ValueError, TypeError):
        return False
    return True


def _trace(config: dict[str, object], source: str, versions: dict[str, str]) -> dict[str, object]:
    from probes.activation_trace import trace_all_terms  # these import torch and transformers
    from probes.model_shape import config_object, trace_model_shape

    config_object(config, source)  # a config transformers refuses is one error line, without the progress line
    print(
        f"memplan: reading {source} (model_type {config.get('model_type')}) with transformers "
        f"{versions['transformers']} on the meta device; first use only, the shape is cached",
        file=sys.stderr,
        flush=True,
    )
    shape = trace_model_shape(config, source)
    terms = trace_all_terms(config)
    unfitted = terms.pop("unfitted", {})
    return {**shape, "activation_terms": terms, "activation_unfitted": unfitted}
