"""``python -m probes.trace.catalog --write-catalog [--shapes-only | --layer-forward-only | --layer-backward-only |
--grouped-query-only]``:
trace every catalog model's shape and activation terms into the package data (``store/catalog_shapes.json``,
``store/catalog_activations.json``); ``--layer-forward-only`` adds only each traced setting's
``layer_forward_tensors`` (:func:`probes.trace.terms.trace_layer_forward`) to the terms already there,
``--layer-backward-only`` each one's ``layer_backward_tensors`` (:func:`probes.trace.terms.trace_layer_backward`);
``--grouped-query-only`` traces again the sdpa terms of every grouped-query model (fewer K and V heads than
query heads: CUDA's flash kernel takes them unrepeated, :func:`probes.trace.activations.gpu_kernels`)."""

from __future__ import annotations

import json
import sys
from typing import Any

from probes.model.shape import trace_model_shape
from probes.trace.terms import trace_all_terms, trace_layer_backward, trace_layer_forward, trace_terms
from store.activation_terms import LAYER_BACKWARD_TENSORS, LAYER_FORWARD_TENSORS, TRACED_SETTINGS
from store.model_shape import CATALOG_ACTIVATIONS_PATH, CATALOG_SHAPES_PATH, CATALOG_TERM_KEYS, write_catalog_shapes
from store.models import catalog_configs

USAGE = (
    "usage: python -m probes.trace.catalog --write-catalog "
    "[--shapes-only | --layer-forward-only | --layer-backward-only | --grouped-query-only]"
)
SDPA_KEYS = tuple(key for key in CATALOG_TERM_KEYS if TRACED_SETTINGS[key][1] == "sdpa")


def add_layer_term(backward: bool = False) -> int:
    """Each catalog model's traced settings given their ``layer_forward_tensors`` (or with ``backward`` their
    ``layer_backward_tensors``), the rest kept as it is."""
    configs = catalog_configs()
    terms = json.loads(CATALOG_ACTIVATIONS_PATH.read_text())
    term = LAYER_BACKWARD_TENSORS if backward else LAYER_FORWARD_TENSORS
    trace = trace_layer_backward if backward else trace_layer_forward
    for name in sorted(terms):
        for key in CATALOG_TERM_KEYS:
            entry = terms[name].get(key)
            if entry is None or name not in configs:
                continue
            entry.pop(term, None)
            traced = trace(configs[name], *TRACED_SETTINGS[key])
            if traced is not None:
                entry[term] = traced
            print(f"{name} {key}: {'traced' if traced else 'not traced'}", flush=True)
    write_catalog_shapes(terms, CATALOG_ACTIVATIONS_PATH)
    print(f"wrote the {term} of {len(terms)} models to {CATALOG_ACTIVATIONS_PATH}")
    return 0


def grouped_query(hf_config: dict[str, Any]) -> bool:
    """Whether a config's attention has fewer K and V heads than query heads (a multimodal one's text model's)."""
    text = hf_config.get("text_config") or hf_config
    heads = text.get("num_attention_heads")
    return heads is not None and text.get("num_key_value_heads", heads) != heads


def retrace_grouped_query() -> int:
    """The sdpa terms of every grouped-query catalog model traced again (:data:`SDPA_KEYS`), the rest kept; a
    setting whose new trace fails keeps its old terms and is named."""
    configs = catalog_configs()
    terms = json.loads(CATALOG_ACTIVATIONS_PATH.read_text())
    for name in sorted(terms):
        if name not in configs or not grouped_query(configs[name]):
            continue
        for key in SDPA_KEYS:
            if key not in terms[name]:
                continue
            try:
                terms[name][key] = trace_terms(configs[name], *TRACED_SETTINGS[key], generation=True)
                print(f"{name} {key}: traced", flush=True)
            except Exception as err:  # as trace_all_terms: a model the meta device cannot run keeps its old terms
                print(f"{name} {key}: kept ({type(err).__name__}: {str(err)[:120]})", flush=True)
    write_catalog_shapes(terms, CATALOG_ACTIVATIONS_PATH)
    print(f"wrote the sdpa terms of the grouped-query models to {CATALOG_ACTIVATIONS_PATH}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Trace every catalog model into the package data (the module docstring)."""

    args = sys.argv[1:] if argv is None else argv
    if args not in (
        ["--write-catalog"],
        ["--write-catalog", "--shapes-only"],
        ["--write-catalog", "--layer-forward-only"],
        ["--write-catalog", "--layer-backward-only"],
        ["--write-catalog", "--grouped-query-only"],
    ):
        print(USAGE, file=sys.stderr)
        return 2
    if "--layer-forward-only" in args or "--layer-backward-only" in args:
        return add_layer_term(backward="--layer-backward-only" in args)
    if "--grouped-query-only" in args:
        return retrace_grouped_query()
    configs = catalog_configs()
    shapes = {name: trace_model_shape(config, name) for name, config in configs.items()}
    write_catalog_shapes(shapes)
    print(f"wrote {len(shapes)} traced shapes to {CATALOG_SHAPES_PATH}")
    if "--shapes-only" not in args:
        terms = {}
        for name, config in configs.items():
            terms[name] = trace_all_terms(config, CATALOG_TERM_KEYS)
            for key in CATALOG_TERM_KEYS:  # the layer backward's tensors, a catalog term only (trace_layer_backward)
                backward = trace_layer_backward(config, *TRACED_SETTINGS[key]) if key in terms[name] else None
                if backward is not None:
                    terms[name][key][LAYER_BACKWARD_TENSORS] = backward
            print(f"traced {name}: {', '.join(k for k in terms[name] if k != 'unfitted') or 'nothing'}", flush=True)
        write_catalog_shapes(terms, CATALOG_ACTIVATIONS_PATH)
        print(f"wrote the activation terms of {len(terms)} models to {CATALOG_ACTIVATIONS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
