"""The settings of a plan that live outside its DeepSpeed config, kept in a file beside the exported one.

``planner export`` of a single-model plan writes ``ds_config.json`` (DeepSpeed's keys only, accepted by
DeepSpeed as is) and beside it ``ds_config.memplan.json``: the strategy's knobs that are not DeepSpeed keys
(gradient checkpointing, the LoRA rank, ``empty_cache``, the allocator, the loss, QLoRA's quantization). ``planner check
ds_config.json`` reads that file back, so that checking a plan's own export needs none of them again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from store.documents import read_document
from store.errors import InputError
from store.records import Strategy

SIDECAR_SUFFIX = ".memplan.json"
SIDECAR_VERSION = "1"
# The single-model strategy's knobs that are not DeepSpeed keys, and the check option that names each.
OUTSIDE_KNOBS: dict[str, str] = {
    "gradient_checkpointing": "--grad-ckpt/--no-grad-ckpt",
    "lora_rank": "--lora-rank",
    "empty_cache": "--empty-cache",
    "allocator": "--allocator",
    "loss": "loss",
    "quantization": "--quantization",  # QLoRA's base weights: the model is loaded quantized, outside DeepSpeed
}


def sidecar_path(config: Path) -> Path:
    """The settings file beside a DeepSpeed config: ``ds_config.json`` -> ``ds_config.memplan.json``."""
    return config.with_name(config.stem + SIDECAR_SUFFIX)


def sidecar_document(strategy: dict[str, Any], *, plan_id: str | None, config: Path, model: str) -> dict[str, Any]:
    """What ``planner export`` writes beside ``config`` for a single-model plan's strategy document."""
    defaults = Strategy()
    return {
        "about": f"memplan: the plan's settings outside the DeepSpeed config {config.name}; planner check reads them",
        "schema_version": SIDECAR_VERSION,
        "plan_id": plan_id,
        "config": config.name,
        "model": model,
        "settings": {name: strategy.get(name, getattr(defaults, name)) for name in OUTSIDE_KNOBS},
    }


def read_sidecar(config: Path) -> tuple[dict[str, Any], str] | None:
    """(settings, where they came from) of the settings file beside ``config``; None where there is none.

    A file that is there but malformed is an InputError naming it.
    """
    path = sidecar_path(config)
    try:
        if not path.is_file():
            return None
    except (OSError, ValueError):  # a name the file system refuses (too long): there is no such file
        return None
    document = read_document(path, "")
    settings = document.get("settings") if isinstance(document, dict) else None
    if not isinstance(settings, dict):
        raise InputError(f"{path}: expected a JSON object with a settings object (as planner export writes it)")
    unknown = sorted(set(settings) - set(OUTSIDE_KNOBS))
    if unknown:
        raise InputError(f"{path}: settings has unknown keys {', '.join(unknown)}; known: {', '.join(OUTSIDE_KNOBS)}")
    try:
        Strategy(**settings)
    except (InputError, TypeError) as err:
        raise InputError(f"{path}: {err}") from None
    plan_id = document.get("plan_id")
    where = path.name + (f" of plan {plan_id}" if isinstance(plan_id, str) and plan_id else "")
    return dict(settings), where


def merged_settings(given: dict[str, Any], exported: tuple[dict[str, Any], str] | None) -> dict[str, Any]:
    """The outside knobs a check runs with: each given one (not None), else the export's; a given knob that
    contradicts the export's own is an InputError."""
    if exported is None:
        return dict(given)
    settings, where = exported
    merged = dict(given)
    for name, value in settings.items():
        mine = given.get(name)
        if mine is None:
            merged[name] = value
        elif mine != value or isinstance(mine, bool) != isinstance(value, bool):
            raise InputError(
                f"{OUTSIDE_KNOBS[name]} ({name} {_shown(mine)}) contradicts {where}, which has {name} "
                f"{_shown(value)}: leave it out, or remove that file to check another setting"
            )
    return merged


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
