"""``python -m probes.trace.catalog --write-catalog [--shapes-only]``: trace every catalog model's shape and
activation terms into the package data (``store/catalog_shapes.json``, ``store/catalog_activations.json``)."""

from __future__ import annotations

import sys

from probes.model.shape import trace_model_shape
from probes.trace.terms import trace_all_terms
from store.model_shape import CATALOG_ACTIVATIONS_PATH, CATALOG_SHAPES_PATH, CATALOG_TERM_KEYS, write_catalog_shapes
from store.models import catalog_configs


def main(argv: list[str] | None = None) -> int:
    """Trace every catalog model into the package data (the module docstring)."""

    args = sys.argv[1:] if argv is None else argv
    if args not in (["--write-catalog"], ["--write-catalog", "--shapes-only"]):
        print("usage: python -m probes.trace.catalog --write-catalog [--shapes-only]", file=sys.stderr)
        return 2
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
