"""Checkpointing and LoRA traced as such, against the composition from the full fine-tune's trace.

    .venv/bin/python benchmarks/variants_vs_composed.py [--models opt-1.3b,qwen3-8b] [--rank 16] [--markdown]

For each catalog model, bf16, sdpa, micro-batch x sequence in SHAPES, the cost model's activation bytes
(``search.model.activations.activations``) with the catalog's traced variants (``probes.trace.variants``:
HF gradient checkpointing, LoRA adapters on every linear, both) and with the variants removed, which is how
memplan predicted them before they were traced: a checkpointed layer keeps its input and its backward holds
one recomputed layer beside the full fine-tune's backward working set; LoRA keeps the full fine-tune's
activations. Columns: what the step saves for backward (all layers and outside them), and the top layer's
backward peak above it (recompute included). Reads the package data; nothing is traced here.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search.coefficients import DEFAULT_COEFFICIENTS  # noqa: E402
from search.model.activations import activations  # noqa: E402
from store.models import get_model  # noqa: E402
from store.records import ModelSpec  # noqa: E402

DEFAULT_MODELS = ("opt-1.3b", "gpt2-xl", "llama-3.1-8b", "qwen3-8b", "gemma-3-4b", "phi-4", "qwen3-30b-a3b")
SHAPES = ((4, 512), (1, 2048))
KNOBS = (("ckpt", True, False), ("lora", False, True), ("lora+ckpt", True, True))


def _composed(spec: ModelSpec) -> ModelSpec:
    """The spec without its traced variants: the step composed from the full fine-tune's terms."""
    terms = {key: {k: v for k, v in entry.items() if k != "variants"} for key, entry in spec.activation_terms.items()}
    return dataclasses.replace(spec, activation_terms=terms)


def _rows(name: str, rank: int) -> list[tuple[str, ...]]:
    spec = get_model(name)
    composed = _composed(spec)
    rows = []
    for knob, checkpointing, lora in KNOBS:
        r = rank if lora else 0
        for b, s in SHAPES:
            coef = DEFAULT_COEFFICIENTS
            traced = activations(spec, b, s, "bf16", "sdpa", checkpointing=checkpointing, coef=coef, lora_rank=r)
            old = activations(composed, b, s, "bf16", "sdpa", checkpointing=checkpointing, coef=coef, lora_rank=r)
            bwd_traced = traced.backward_working + traced.recompute
            bwd_old = old.backward_working + old.recompute
            rows.append(
                (
                    name,
                    knob,
                    f"{b}x{s}",
                    _mib(traced.saved),
                    _mib(old.saved),
                    _pct(old.saved, traced.saved),
                    _mib(bwd_traced),
                    _mib(bwd_old),
                    _pct(bwd_old, bwd_traced),
                )
            )
    return rows


def _mib(value: int) -> str:
    return f"{value / 2**20:.1f}"


def _pct(composed: int, traced: int) -> str:
    return f"{100 * (composed - traced) / traced:+.1f}%" if traced else "-"


HEADER = ("model", "knob", "b x s", "saved MiB traced", "composed", "diff",
          "layer bwd MiB traced", "composed", "diff")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Print the table (markdown with ``--markdown``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated catalog names")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (default 16)")
    parser.add_argument("--markdown", action="store_true", help="a markdown table")
    args = parser.parse_args(argv)
    rows = [row for name in args.models.split(",") for row in _rows(name.strip(), args.rank)]
    if args.markdown:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(x)) for x in column) for column in zip(HEADER, *rows, strict=True)]
        for row in (HEADER, *rows):
            print("  ".join(str(x).rjust(w) for x, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
