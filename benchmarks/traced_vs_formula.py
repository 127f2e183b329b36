"""Traced activation and loss bytes against the hand-written formulas, for catalog models at a few shapes.

    .venv/bin/python benchmarks/traced_vs_formula.py [--models opt-1.3b,qwen3-8b] [--markdown]

For each model, dtype bf16, attention eager and sdpa, micro-batch x sequence in SHAPES: the bytes one decoder
layer saves for backward, what the step saves outside the layers, and the loss's forward and backward peaks
(the LM head and cross-entropy), traced from transformers' code on the meta device
(``probes.trace.activations``) and by ``search.model.activations``' formulas (Korthikanti-style, with the
named coefficients). Nothing is cached: every figure is traced now.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.trace.terms import trace_terms  # noqa: E402
from search.coefficients import DEFAULT_COEFFICIENTS  # noqa: E402
from search.model.activations import layer_activation_bytes, loss_logits  # noqa: E402
from store.activation_terms import evaluate, left_by, peak_of  # noqa: E402
from store.models import get_model  # noqa: E402

DEFAULT_MODELS = (
    "opt-1.3b",
    "gpt2-xl",
    "llama-3.1-8b",
    "qwen2.5-7b",
    "qwen3-8b",
    "gemma-3-4b",
    "phi-4",
    "qwen3-30b-a3b",
)
SHAPES = ((4, 512), (1, 2048))


def _rows(name: str) -> list[tuple[str, ...]]:
    spec = dataclasses.replace(get_model(name), activation_terms={})  # the formulas, whatever the package holds
    coef = DEFAULT_COEFFICIENTS
    rows = []
    for attn in ("eager", "sdpa"):
        started = time.perf_counter()
        terms = trace_terms(spec.hf_config, "bf16", attn)
        seconds = time.perf_counter() - started
        for b, s in SHAPES:
            d_bsh = 2 * b * s * spec.hidden_size
            layer_formula = layer_activation_bytes(spec, b, s, "bf16", attn, coef)
            layer_traced = sum(evaluate(c, b, s) for c in terms["layer_saved"])
            loss = loss_logits(spec, b, s, "bf16", coef, holds_output=False)
            w = terms["windows"]
            loss_fwd = peak_of(w["head_forward"], b, s)
            loss_bwd = left_by(w["head_forward"], b, s) + peak_of(w["head_backward"], b, s)
            outside = evaluate(terms["outside_saved"], b, s)
            rows.append(
                (name, attn, f"{b}x{s}", _mib(layer_traced), _mib(layer_formula), _pct(layer_formula, layer_traced),
                 _mib(outside), _mib(3 * d_bsh), _mib(loss_fwd), _mib(loss.forward), _pct(loss.forward, loss_fwd),
                 _mib(loss_bwd), _mib(loss.backward), _pct(loss.backward, loss_bwd), f"{seconds:.2f}")
            )  # fmt: skip
    return rows


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def _pct(formula: int, traced: int) -> str:
    return f"{(formula / traced - 1) * 100:+.1f}%" if traced else "n/a"


HEADER = (
    "model", "attn", "b x s", "layer saved (traced MiB)", "formula", "err", "outside (traced)", "formula",
    "loss fwd (traced)", "formula", "err", "loss bwd (traced)", "formula", "err", "trace s",
)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    args = parser.parse_args()
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for name in args.models.split(","):
        for row in _rows(name.strip()):
            print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
