"""The model catalog: built-in names and local ``config.json`` files turned into ModelSpec records.

Nothing is downloaded and nothing heavy is imported. A catalog model's spec is its traced shape, shipped as
package data (``store/catalog_shapes.json``, read from transformers' module tree by ``probes.model.shape``
and re-derived by a test). A local ``config.json`` of the families with a pure-Python formula
(``store.model_params``: opt, gpt2, llama, mistral, qwen2) is counted by it, which equals the trace exactly;
any other architecture raises :class:`~store.model_shape.UntracedModelError`, which the planner answers by
tracing the config once and keeping the shape in the store's cache.

    >>> get_model("facebook/opt-1.3b").total_params
    1315758080
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from pathlib import Path
from typing import Any

from store.documents import read_document
from store.errors import InputError
from store.model_bounds import check_config_bounds
from store.model_catalog import CATALOG
from store.model_identity import catalog_twin
from store.model_params import SUPPORTED_MODEL_TYPES, spec_from_hf_config
from store.model_shape import UntracedModelError, catalog_shape, cut_traced, spec_from_shape
from store.records import ModelSpec

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "catalog_configs",
    "catalog_name",
    "cut_config",
    "get_model",
    "model_names",
    "spec_for_config",
    "spec_from_hf_config",
    "with_layers",
]


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


_BY_KEY: dict[str, tuple[str, dict[str, Any]]] = {}
for _name, _aliases, _config in CATALOG:
    for _alias in (_name, *_aliases):
        _BY_KEY[_key(_alias)] = (_name, _config)


MAX_NAME_CHARS = 4096  # PATH_MAX on Linux: no model name or path is longer


def model_names() -> list[str]:
    """Catalog names, in catalog order."""
    return [name for name, _, _ in CATALOG]


def catalog_configs() -> dict[str, dict[str, Any]]:
    """The HF config of every catalog model (fresh copies), by canonical name."""
    return {name: copy.deepcopy(config) for name, _, config in CATALOG}


def _catalog_spec(name: str, config: dict[str, Any]) -> ModelSpec:
    shape = catalog_shape(name)
    if shape is None:  # a catalog entry added without re-running `python -m probes.trace.catalog --write-catalog`
        return spec_from_hf_config(name, copy.deepcopy(config))
    return spec_from_shape(name, copy.deepcopy(config), shape)


def spec_for_config(name: str, config: dict[str, Any], source: str | None = None) -> ModelSpec:
    """The spec of an HF config dict, named ``name``. Its identity is its shape (:mod:`store.model_identity`):
    a config of a catalog model's shape is that model (its traced shape and activations, whatever the file says
    of token ids or dtype). Otherwise by formula for opt, gpt2, llama, mistral and qwen2 (with the traced
    activations of the nearest catalog model where the two differ only in rotary keys, which change no tensor's
    size); for any other ``model_type`` UntracedModelError (the planner traces it with transformers and caches
    the shape). ``identity`` of the spec says which catalog model it matched, or what differs from the nearest.
    A config beyond the bounds of :mod:`store.model_bounds` (layers, widths, experts) is an InputError first."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if isinstance(config, dict):
        check_config_bounds(config, source or name)  # before a formula or a trace grinds on 10**7 layers
    twin = catalog_twin(config) if isinstance(model_type, str) else None
    if twin is not None and twin.same_shape and catalog_shape(twin.name) is not None:
        twin_spec = _catalog_spec(twin.name, twin.config)
        return dataclasses.replace(twin_spec, name=name, hf_config=copy.deepcopy(config), identity=twin.describe())
    if isinstance(model_type, str) and model_type not in SUPPORTED_MODEL_TYPES:
        raise UntracedModelError(name, copy.deepcopy(config), source or name)
    spec = spec_from_hf_config(name, config, source=source)
    if twin is None:
        return dataclasses.replace(spec, identity=f"a {model_type} config of no catalog model's shape")
    borrowed = _catalog_spec(twin.name, twin.config) if twin.same_activations else None
    if borrowed is not None and borrowed.activation_terms and borrowed.total_params == spec.total_params:
        return dataclasses.replace(
            borrowed,
            name=name,
            hf_config=spec.hf_config,
            max_positions=spec.max_positions,
            identity=f"{twin.describe()}: keys that change no tensor's size, so {twin.name}'s traced activations hold",
        )
    return dataclasses.replace(spec, identity=twin.describe())


def catalog_name(name: str) -> str | None:
    """The catalog's own name of ``name`` when ``name`` is one of its names or aliases, else None."""
    found = _BY_KEY.get(_key(name)) if isinstance(name, str) else None
    return found[0] if found is not None else None


def get_model(name_or_path: str) -> ModelSpec:
    """The ModelSpec for a catalog name or alias (case-insensitive; HF repo ids such as
    ``meta-llama/Llama-2-7b-hf`` work) or for a local ``config.json`` / a folder holding one.

    A local config's spec is named by the path as given. Unknown names and unreadable or unsupported
    configs raise InputError with one line that says what is wrong (and suggests close names).
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise InputError(f"model name is empty; give a catalog name ({', '.join(model_names())}) or a config.json")
    shown = name_or_path if len(name_or_path) <= 80 else name_or_path[:77] + "..."
    if len(name_or_path) > MAX_NAME_CHARS:
        raise InputError(f"model {shown!r}: {len(name_or_path)} characters is too long for a model name or path")
    found = _BY_KEY.get(_key(name_or_path))
    path = _local_path(name_or_path, shown)
    if path.is_file() or (path / "config.json").is_file():
        return _from_path(name_or_path, path)
    if found is not None:
        return _catalog_spec(*found)
    if path.is_dir():
        raise InputError(f"{name_or_path}: folder has no config.json (expected a Hugging Face model folder)")
    raise InputError(_unknown_message(name_or_path))


def _local_path(given: str, shown: str) -> Path:
    """``given`` as a local path (``~`` expanded); a path the file system cannot even look up is not one."""
    try:
        path = Path(given).expanduser()
        path.is_file()  # names too long for the file system raise here
    except RuntimeError:  # ~user of a user that does not exist
        raise InputError(f"model {shown!r}: cannot expand the ~ of that path (no such user)") from None
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or err
        raise InputError(f"model {shown!r}: not a usable path ({type(err).__name__}: {reason})") from None
    return path


def _from_path(given: str, path: Path) -> ModelSpec:
    file = path if path.is_file() else path / "config.json"
    config = read_document(file, "")  # messages start with the file
    if not isinstance(config, dict):
        raise InputError(f"{file}: a model config must be a JSON object, not {type(config).__name__}")
    return spec_for_config(given, config, source=str(file))


def _unknown_message(name: str) -> str:
    close = difflib.get_close_matches(_key(name), list(_BY_KEY), n=6, cutoff=0.5)
    suggestions = list(dict.fromkeys(_BY_KEY[key][0] for key in close))[:3]
    hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
    shown = name if len(name) <= 80 else name[:77] + "..."
    return (
        f"unknown model {shown!r} (not a catalog name, nor a config.json file or model folder){hint} "
        f"Known: {', '.join(model_names())}"
    )


_LAYER_KEYS = {"gpt2": "n_layer"}


def cut_config(config: dict[str, Any], model_type: str, layers: int) -> dict[str, Any]:
    """A copy of an HF config with ``layers`` decoder layers (GPT-2's ``n_layer``; a multimodal config's
    text model, whose ``text_config`` holds the count)."""
    cut = copy.deepcopy(config)
    target = cut["text_config"] if isinstance(cut.get("text_config"), dict) else cut
    key = _LAYER_KEYS.get(model_type, "num_hidden_layers")
    if model_type == "gpt2" and "num_hidden_layers" in target and "n_layer" not in target:
        key = "num_hidden_layers"
    target[key] = layers
    return cut


def with_layers(spec: ModelSpec, layers: int) -> ModelSpec:
    """The same model cut to ``layers`` decoder layers (what a layer-cut probe builds and runs)."""
    if not isinstance(layers, int) or layers < 1:
        raise InputError(f"layers must be a whole number >= 1, not {layers!r}")
    config = cut_config(spec.hf_config, spec.model_type, layers)
    if spec.shape_source == "traced":
        if layers > spec.num_layers:
            raise InputError(f"{spec.name} has {spec.num_layers} decoder layers; cannot grow it to {layers}")
        return cut_traced(spec, layers, config)
    cut = spec_from_hf_config(spec.name, config)
    assert cut.num_layers == layers, (spec.model_type, layers)
    return cut
