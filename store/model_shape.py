"""Traced model shapes as records: the catalog's package data, the cache key of a local config, and the spec.

A shape is the dict that ``probes.model.shape.trace_model_shape`` reads from transformers' module tree: every
:class:`~store.records.ModelSpec` field but ``name`` and ``hf_config``, plus the versions it was read with.
The catalog's shapes are traced once and shipped as ``catalog_shapes.json`` (a test re-derives them); a local
config of an architecture without a formula is traced on first use and kept in the store's shape cache under
:func:`shape_key`. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from store.errors import InputError
from store.model_identity import identity_key
from store.records import ModelSpec

SHAPE_VERSION = 5  # bump when trace_model_shape reads anything differently: cached shapes are then re-traced
CATALOG_SHAPES_PATH = Path(__file__).resolve().parent / "catalog_shapes.json"
CATALOG_ACTIVATIONS_PATH = Path(__file__).resolve().parent / "catalog_activations.json"
CATALOG_TERM_KEYS = ("2-eager", "2-sdpa")  # the catalog ships 16-bit terms; fp32 training uses the formulas
_SPEC_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(ModelSpec)
    if f.name not in ("name", "hf_config", "activation_terms", "activation_digest", "activation_unfitted", "identity")
)
_TUPLE_FIELDS = ("layer_param_counts", "expert_param_counts", "kv_windows", "attn_impls")


class UntracedModelError(InputError):
    """A local config whose architecture has no formula and no cached trace: transformers must read it first."""

    def __init__(self, name: str, config: dict[str, Any], source: str) -> None:
        super().__init__(
            f"{source}: model_type {config.get('model_type')!r} has to be traced with transformers first"
            " (the planner does this on first use)"
        )
        self.name = name
        self.config = config
        self.source = source


def installed_versions() -> dict[str, str]:
    """The installed torch and transformers versions, read from package metadata (nothing imported): what a
    shape is read with, and part of its cache key."""
    found: dict[str, str] = {}
    for package in ("torch", "transformers"):
        try:
            found[package] = metadata.version(package).split("+")[0]
        except metadata.PackageNotFoundError:
            found[package] = "absent"
    return found


def shape_key(hf_config: dict[str, Any], versions: dict[str, str]) -> str:
    """The cache key of a config's shape: a hash of its identity (``store.model_identity.identity_config``: the
    config without the keys that only label it, so one shape has one entry whatever its file says of token ids
    or dtype), the library versions and SHAPE_VERSION."""
    return identity_key(hf_config, versions, SHAPE_VERSION)


def spec_from_shape(name: str, hf_config: dict[str, Any], shape: dict[str, Any]) -> ModelSpec:
    """The ModelSpec of a traced shape; ValueError when the shape lacks a field (a damaged cache entry)."""
    missing = [key for key in _SPEC_FIELDS if key not in shape]
    if missing:
        raise ValueError(f"traced shape of {name!r} lacks {', '.join(missing)}")
    values: dict[str, Any] = {key: tuple(shape[key]) if key in _TUPLE_FIELDS else shape[key] for key in _SPEC_FIELDS}
    terms = shape.get("activation_terms") or {}
    unfitted = {str(key): str(why) for key, why in (shape.get("activation_unfitted") or {}).items()}
    return ModelSpec(
        name=name, hf_config=dict(hf_config), activation_terms=terms, activation_unfitted=unfitted, **values
    )


def cut_traced(spec: ModelSpec, layers: int, hf_config: dict[str, Any]) -> ModelSpec:
    """A traced ``spec`` cut to its first ``layers`` decoder layers (what a layer-cut probe builds)."""
    kept, experts = spec.layer_param_counts[:layers], spec.expert_param_counts[:layers]
    dropped = sum(spec.layer_param_counts) - sum(kept)
    return dataclasses.replace(
        spec,
        num_layers=layers,
        total_params=spec.total_params - dropped,
        layer_params=round(sum(kept) / layers),
        layer_param_counts=kept,
        expert_param_counts=experts,
        kv_windows=spec.kv_windows[:layers],
        expert_params=sum(experts),
        lora_in_out=spec.lora_in_out * layers // spec.num_layers,
        hf_config=hf_config,
    )


@cache
def _catalog_shapes_only() -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = json.loads(CATALOG_SHAPES_PATH.read_text(encoding="utf-8"))
    return loaded


@cache
def _catalog_term_lines() -> dict[str, str]:
    """Each model's line of ``catalog_activations.json`` (written one model a line), not yet parsed: a plan
    parses the terms of its own models only."""
    if not CATALOG_ACTIVATIONS_PATH.is_file():
        return {}
    lines: dict[str, str] = {}
    for line in CATALOG_ACTIVATIONS_PATH.read_text(encoding="utf-8").splitlines()[1:-1]:
        name, _, rest = line.partition(": ")
        lines[json.loads(name)] = rest.rstrip(",")
    return lines


def catalog_shape(name: str) -> dict[str, Any] | None:
    """The traced shape of one catalog model (package data) with its traced activation terms
    (``activation_terms``, and ``activation_unfitted``: the settings the trace could not fit, and why)."""
    shape = _catalog_shapes_only().get(name)
    if shape is None:
        return None
    line = _catalog_term_lines().get(name)
    traced = dict(json.loads(line)) if line else {}
    return {**shape, "activation_unfitted": traced.pop("unfitted", {}), "activation_terms": traced}


def catalog_shapes() -> dict[str, dict[str, Any]]:
    """The traced shapes of every catalog model, by canonical name, as :func:`catalog_shape` gives them."""
    return {name: shape for name in _catalog_shapes_only() if (shape := catalog_shape(name)) is not None}


def write_catalog_shapes(shapes: dict[str, dict[str, Any]], path: Path = CATALOG_SHAPES_PATH) -> None:
    """Write the catalog's traced shapes (or, to CATALOG_ACTIVATIONS_PATH, their activation terms) to ``path``
    atomically (a temp file renamed over it), one model a line."""
    lines = [f"{json.dumps(name)}: {json.dumps(shapes[name], sort_keys=True)}" for name in sorted(shapes)]
    text = "{\n" + ",\n".join(lines) + "\n}\n"  # one model a line: diffs show which model changed
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _catalog_shapes_only.cache_clear()
    _catalog_term_lines.cache_clear()
