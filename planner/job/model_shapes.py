"""Model specs for any architecture: the catalog and formulas first, then the store's shape cache, then a trace.

A local ``config.json`` whose ``model_type`` has no pure-Python formula (Qwen3, Gemma, Phi-3, Mixtral, any
MoE...) is read once from transformers' own module tree on the meta device (``probes.model.shape``, which
imports torch and transformers) and the shape is kept in the plan database under a hash of the config and
the installed torch and transformers versions. Its activation terms are traced per training setting (dtype
width and attention kernel, ``store.activation_terms.terms_key``) when a plan first needs that setting, and
kept in the same entry: later plans of that config and setting read the cache and import neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from planner.job.heartbeat import heartbeat
from planner.progress import stderr_note
from store.activation_terms import TRACED_KEYS, terms_key, valid_terms
from store.db import database_exists, open_storage
from store.model_shape import UntracedModelError, installed_versions, shape_key, spec_from_shape
from store.models import catalog_name, get_model
from store.records import ModelSpec

# Shapes traced inside ``shapes_saved_on_success``, by (database, cache key): saved when the block succeeds.
_PENDING: ContextVar[dict[tuple[str | None, str], dict[str, Any]] | None] = ContextVar("memplan_shapes", default=None)


@contextmanager
def shapes_saved_on_success() -> Iterator[None]:
    """Within the block, traced shapes are kept in memory and saved to their databases only when the block
    ends without an error: a command refused for any input, however late it is checked, writes no shape
    (and creates no database for one). Nested blocks belong to the outermost one."""
    if _PENDING.get() is not None:
        yield
        return
    pending: dict[tuple[str | None, str], dict[str, Any]] = {}
    token = _PENDING.set(pending)
    try:
        yield
    finally:
        _PENDING.reset(token)
    for (db, key), shape in pending.items():  # reached only when the block raised nothing
        _save_shape(db, key, shape)


def resolve_model(
    name_or_path: str,
    readings: list[str] | None = None,
    db: str | None = None,
    setting: tuple[str, str] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> ModelSpec:
    """The spec of a catalog name or local config; an untraced architecture is traced once and cached in
    the database ``db`` (default: ``$PLANNER_DB`` or the user's data folder), with the activation terms of
    ``setting`` (dtype, attention implementation; every setting when None), traced now if the cached entry
    lacks them. ``readings`` gains a line saying where a traced shape came from. A first trace says so, and
    then every interval that it is still at work (:mod:`planner.job.heartbeat`), through ``on_note`` (default:
    stderr).

    The database is read only where it exists, and written only once a shape was traced; inside
    :func:`shapes_saved_on_success` only when the whole block succeeds."""
    try:
        spec = get_model(name_or_path)
    except UntracedModelError as untraced:
        name, config, source = untraced.name, untraced.config, untraced.source
    else:
        if readings is not None:
            readings.extend(identity_readings(name_or_path, spec))
        return spec
    versions = installed_versions()
    key = shape_key(config, versions)
    pending = _PENDING.get()
    shape = (pending or {}).get((db, key)) or _load_shape(db, key)
    cached = shape is not None and _usable(name, config, shape)
    note = on_note if on_note is not None else stderr_note
    if not cached:  # never traced, or an entry from an older memplan that lacks a field
        shape = _trace(config, source, versions, note)
    assert shape is not None
    missing = _missing_keys(shape, setting)
    if missing:
        shape = _with_terms(shape, config, missing, note)
    if missing or not cached:
        if pending is None:
            _save_shape(db, key, shape)
        else:
            pending[(db, key)] = shape
    if readings is not None:
        how = "cached shape" if cached else "traced now, cached for next time"
        readings.append(
            f"model: {source} (model_type {config['model_type']}) read from transformers "
            f"{versions['transformers']}'s module tree ({how})"
        )
    return spec_from_shape(name, config, shape)


def identity_readings(given: str, spec: ModelSpec) -> list[str]:
    """What the plan says of the model's identity: the catalog model an alias names, or where a local config's
    shape stands against the catalog (``ModelSpec.identity``). One shape is one model, whatever its name."""
    canonical = catalog_name(given)
    if spec.identity:
        return [f"model: {spec.name} is {spec.identity}"]
    if canonical is not None and given.strip() != canonical:
        return [f"model: {given.strip()} is the catalog's {canonical} (another name of one config: the same plan)"]
    return []


def _load_shape(db: str | None, key: str) -> dict[str, Any] | None:
    """The cached shape under ``key`` in ``db``; None where there is none (or no database yet: none is made)."""
    if not database_exists(db):
        return None
    with open_storage(db) as storage:
        return storage.load_model_shape(key)


def _save_shape(db: str | None, key: str, shape: dict[str, Any]) -> None:
    """Keep a traced shape in the shape cache of ``db`` (created if it does not exist yet)."""
    with open_storage(db) as storage:
        storage.save_model_shape(key, shape)


def _usable(name: str, config: dict[str, object], shape: dict[str, object]) -> bool:
    try:
        spec_from_shape(name, config, shape)
    except (ValueError, TypeError):
        return False
    return True


def _missing_keys(shape: dict[str, Any], setting: tuple[str, str] | None) -> tuple[str, ...]:
    """The terms keys a plan of ``setting`` needs that the shape has neither traced nor found untraceable
    (a model class that refuses the attention is planned with eager: that key)."""
    if setting is None:
        wanted = TRACED_KEYS
    else:
        dtype, attn_impl = setting
        refused = shape.get("attn_impls") and attn_impl not in shape["attn_impls"]
        wanted = (terms_key(dtype, "eager" if refused else attn_impl),)
    traced = {key for key, terms in shape.get("activation_terms", {}).items() if valid_terms(terms)}
    have = traced | set(shape.get("activation_unfitted", {}))  # a damaged entry is traced again
    return tuple(key for key in wanted if key not in have)


def _with_terms(
    shape: dict[str, Any], config: dict[str, Any], keys: tuple[str, ...], on_note: Callable[[str], None]
) -> dict[str, Any]:
    """``shape`` with the activation terms of ``keys`` traced now (imports torch and transformers)."""
    from probes.trace.terms import trace_all_terms  # lazy on purpose: probes loads torch

    on_note(
        f"memplan: tracing the activations of {config.get('model_type')} for {', '.join(keys)} on the meta device; "
        "first use of this setting only, the terms are cached"
    )
    with heartbeat(f"tracing the activations of {config.get('model_type')}", on_note):
        terms = trace_all_terms(config, keys)
    unfitted = {**shape.get("activation_unfitted", {}), **terms.pop("unfitted", {})}
    traced = {**shape.get("activation_terms", {}), **terms}
    return {**shape, "activation_terms": traced, "activation_unfitted": unfitted}


def _trace(
    config: dict[str, object], source: str, versions: dict[str, str], on_note: Callable[[str], None]
) -> dict[str, object]:
    from probes.model.shape import config_object, trace_model_shape  # these import torch and transformers

    config_object(config, source)  # a config transformers refuses is one error line, without the progress line
    on_note(
        f"memplan: reading {source} (model_type {config.get('model_type')}) with transformers "
        f"{versions['transformers']} on the meta device; first use only, the shape is cached"
    )
    with heartbeat(f"reading {source}", on_note):
        shape = trace_model_shape(config, source)
    return {**shape, "activation_terms": {}, "activation_unfitted": {}}
