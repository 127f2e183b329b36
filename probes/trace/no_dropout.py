"""``python -m probes.trace.no_dropout --write``: trace the catalog models whose dropout lives in
``torch.nn.Dropout`` modules (``store.module_dropout.MODULE_DROPOUT_KEYS``) again with those probabilities at 0,
as TRL's ``disable_dropout_in_model`` runs them, into ``store/catalog_activations_no_dropout.json``."""

from __future__ import annotations

import sys
from typing import Any

from probes.trace.terms import trace_all_terms
from store.model_shape import CATALOG_TERM_KEYS, write_catalog_shapes
from store.models import catalog_configs
from store.module_dropout import NO_DROPOUT_ACTIVATIONS_PATH, module_dropout_keys, without_module_dropout_config


def no_dropout_configs() -> dict[str, dict[str, Any]]:
    """The catalog configs that hold dropout in modules, with it at 0, by catalog name."""
    configs = catalog_configs()
    return {
        name: without_module_dropout_config(config)
        for name, config in configs.items()
        if module_dropout_keys(str(config.get("model_type")))
    }


def main(argv: list[str] | None = None) -> int:
    """Trace and write (the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["--write"]:
        print("usage: python -m probes.trace.no_dropout --write", file=sys.stderr)
        return 2
    terms = {}
    for name, config in no_dropout_configs().items():
        terms[name] = trace_all_terms(config, CATALOG_TERM_KEYS)
        print(f"traced {name} without module dropout: {', '.join(k for k in terms[name] if k != 'unfitted')}")
    write_catalog_shapes(terms, NO_DROPOUT_ACTIVATIONS_PATH)
    print(f"wrote {len(terms)} models to {NO_DROPOUT_ACTIVATIONS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
