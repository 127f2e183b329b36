"""A hybrid of linear and full attention (Qwen3-Next) is traced per kind of layer (issue 32, item 6).

The combined terms of the two-layer cut (one Gated DeltaNet layer, one full-attention layer) must say what the
whole model keeps: here a four-layer Qwen3-Next (three linear-attention layers, then one full-attention layer, the
config class's default pattern) is built as transformers builds it, on the meta device, and its forward is traced
with the same live-tensor tracker; the bytes alive when its LM head starts are what the terms say.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tiny_models import QWEN3_NEXT

from probes.trace.hybrid import chunk_tokens
from probes.trace.hybrid_cut import hybrid_cut, layer_kinds
from store.activation_terms import evaluate, evaluate_all
from store.alloc_stream import ALLOC, FREE, PHASE


def _saved_by_whole_model(config: dict[str, Any], sequences: int, tokens: int) -> int:
    """Bytes alive when the LM head starts, above the weights, of the whole (uncut) model's training forward."""
    import torch
    from transformers import AutoModelForCausalLM

    from probes.measure.tracker import LiveTensorTracker
    from probes.model.sequences import unpacked_sequences
    from probes.model.shape import config_object
    from probes.trace.activations import gpu_kernels

    built = config_object(config, "test")
    built._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(copy.deepcopy(built), dtype=torch.bfloat16)
    model.train()
    tracker = LiveTensorTracker(device_types=("meta",), record_stream=True)
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda *args: tracker.mark_phase("head") and None)
    ids = torch.zeros((sequences, tokens), dtype=torch.long, device="meta")
    try:
        with gpu_kernels(), tracker, unpacked_sequences():
            tracker.track_existing(model.parameters())
            tracker.mark_phase("start")
            model(input_ids=ids, labels=ids)
    finally:
        hook.remove()
    stream = tracker.stream()
    live, sizes, at = 0, dict[int, int](), dict[str, int]()
    for op, key, size, _, _ in stream.events:
        if op == ALLOC:
            sizes[key] = size
            live += size
        elif op == FREE:
            live -= sizes.get(key, 0)
        elif op == PHASE:
            at.setdefault(stream.phases[key], live)
    return at["head"] - at["start"]


def test_the_cut_keeps_one_layer_of_each_kind() -> None:
    assert layer_kinds(QWEN3_NEXT) == {"linear_attention": 3, "full_attention": 1}
    assert hybrid_cut(QWEN3_NEXT, 2) == {**QWEN3_NEXT, "layer_types": ["linear_attention", "full_attention"]}
    assert layer_kinds({**QWEN3_NEXT, "model_type": "qwen3_moe"}) is None  # no linear attention: not a hybrid


@pytest.mark.parametrize(("layers", "chunks"), [(4, 7), (8, 6)])
def test_the_traced_terms_are_every_layer_of_its_kind(layers: int, chunks: int) -> None:
    """num_layers x layer_saved + outside_saved (what the cost model adds up) is the whole model's saved bytes:
    1 full + 3 linear layers, and 2 full + 6 linear, at shapes the fit did not use."""
    from probes.trace.terms import trace_terms

    config = {**QWEN3_NEXT, "num_hidden_layers": layers}
    terms = trace_terms(config, "bf16", "sdpa", variants=False)
    assert terms["hybrid"]["layers"] == {"linear_attention": layers * 3 // 4, "full_attention": layers // 4}
    assert "torch fallback" in terms["hybrid"]["linear_attention"]  # no flash-linear-attention here
    sequences, tokens = 2, chunks * chunk_tokens()
    predicted = layers * sum(evaluate_all(terms["layer_saved"], sequences, tokens))
    predicted += evaluate(terms["outside_saved"], sequences, tokens)
    # each kind's saved size is divided by the layer count before it is multiplied back: a byte per layer at most
    assert abs(predicted - _saved_by_whole_model(config, sequences, tokens)) <= layers
