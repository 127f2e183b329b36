"""The model catalog: built-in names and local ``config.json`` files turned into ModelSpec records.

Nothing is downloaded and nothing heavy is imported: specs come from HF config dicts (the catalog's,
in ``store.model_catalog``, or a local file) through the pure-Python parameter formulas of
``store.model_params``, which match what transformers instantiates exactly.

    >>> get_model("facebook/opt-1.3b").total_params
    1315758080
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

from store.documents import parse_json
from store.errors import InputError
from store.model_catalog import CATALOG
from store.model_params import SUPPORTED_MODEL_TYPES, spec_from_hf_config
from store.records import ModelSpec

__all__ = ["SUPPORTED_MODEL_TYPES", "get_model", "model_names", "spec_from_hf_config", "with_layers"]


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
        name, config = found
        return spec_from_hf_config(name, copy.deepcopy(config))
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
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{file}: cannot read the model config ({err})") from None
    config = parse_json(text, str(file))
    if not isinstance(config, dict):
        raise InputError(f"{file}: a model config must be a JSON object, not {type(config).__name__}")
    return spec_from_hf_config(given, config, source=str(file))


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


def with_layers(spec: ModelSpec, layers: int) -> ModelSpec:
    """The same model cut to ``layers`` decoder layers (what a layer-cut probe builds and runs)."""
    if not isinstance(layers, int) or layers < 1:
        raise InputError(f"layers must be a whole number >= 1, not {layers!r}")
    config = copy.deepcopy(spec.hf_config)
    config[_LAYER_KEYS.get(spec.model_type, "num_hidden_layers")] = layers
    cut = spec_from_hf_config(spec.name, config)
    assert cut.num_layers == layers, (spec.model_type, layers)
    return cut
