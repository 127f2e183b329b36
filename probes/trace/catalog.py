"""``python -m probes.trace.catalog --write-catalog [--shapes-only | --layer-forward-only]``: trace every catalog
model's shape and activation terms into the package data (``store/catalog_shapes.json``,
``store/catalog_activations.json``); ``--layer-forward-only`` adds only each traced setting's
``layer_forward_tensors`` (:func:`probes.trace.terms.trace_layer_forward`) to the terms already there."""

from __future__ import annotations

import json
import sys

from probes.model.shape import trace_model_shape
from probes.trace.terms import trace_all_terms, trace_layer_forward
from store.activation_terms import LAYER_FORWARD_TENSORS, TRACED_SETTINGS
from store.model_shape import CATALOG_ACTIVATIONS_PATH, CATALOG_SHAPES_PATH, CATALOG_TERM_KEYS, write_catalog_shapes
from store.models import catalog_configs

USAGE = "usage: python -m probes.trace.catalog --write-catalog [--shapes-only | --layer-forward-only]"


def add_layer_forward() -> int:
    """Each catalog model's traced settings given their ``layer_forward_tensors``, the rest kept as it is."""
    configs = catalog_configs()
    terms = json.loads(CATALOG_ACTIVATIONS_PATH.read_text())
    for name in sorted(terms):
        for key in CATALOG_TERM_KEYS:
            entry = terms[name].get(key)
            if entry is None or name not in configs:
                continue
            entry.pop(LAYER_FORWARD_TENSORS, None)
            traced = trace_layer_forward(configs[name], *TRACED_SETTINGS[key])
            if traced is not None:
                entry[LAYER_FORWARD_TENSORS] = traced
            print(f"{name} {key}: {'traced' if traced else 'not traced'}", flush=True)
    write_catalog_shapes(terms, CATALOG_ACTIVATIONS_PATH)
    print(f"wrote the layer forward tensors of {len(terms)} models to {CATALOG_ACTIVATIONS_PATH}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Trace every catalog model into the package data (the module docstring)."""

    args = sys.argv[1:] if argv is None else argv
    if args not in (
        ["--write-catalog"],
        ["--write-catalog", "--shapes-only"],
        ["--write-catalog", "--layer-forward-only"],
    ):
        print(USAGE, file=sys.stderr)
        return 2
    if "--layer-forward-only" in args:
        return add_layer_forward()
    configs = catalog_configs()
    shapes = {name: trace_model_shape(config, name) for name, config in configs.items()}
    write_catalog_shapes(shapes)
    print(f"wrote {len(shapes)} traced shapes to {CATALOG_SHAPES_PATH}")
    if "--shapes-only" not in args:
        terms = {}
        for name, config in configs.items():
            terms[name] = trace_all_terms(config, CATALOG_TERM_KEYS)
            print(f"traced {name}: {', '.join(k for k in terms[name] if k != 'unfitted') or 'nothing'}", flush=True)
        write_catalog_shapes(terms, CATALOG_ACTIVATIONS_PATH)
        print(f"wrote the activation terms of {len(terms)} models to {CATALOG_ACTIVATIONS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
