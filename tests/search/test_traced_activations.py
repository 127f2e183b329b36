"""The cost model reads traced activation and loss terms where a model has them, the formulas elsewhere.

Pure: the terms are the catalog's package data (``store/catalog_activations.json``, re-derived from
transformers in tests/probes/test_model_shape.py); no torch here.
"""

from __future__ import annotations

import dataclasses

import pytest

from search import DEFAULT_COEFFICIENTS, predict
from search.model.activation_sources import source
from search.model.activations import activations, layer_saved_tensors, loss_logits
from store.activation_terms import compact, evaluate, left_by, peak_of, terms_key, valid_terms
from store.gpus import get_gpu
from store.models import get_model, model_names
from store.records import Hardware, Strategy, Workload

COEF = DEFAULT_COEFFICIENTS


def test_every_catalog_model_ships_16_bit_terms_or_says_why_not() -> None:
    for name in model_names():
        spec = get_model(name)
        assert valid_terms(spec.activation_terms.get("2-eager")), name  # eager attention traces everywhere
        sdpa = spec.activation_terms.get("2-sdpa")
        assert sdpa is None and spec.model_type == "gemma2" or valid_terms(sdpa), name  # gemma 2 has no sdpa


@pytest.mark.parametrize(("dtype", "attn", "expected"), [
    ("bf16", "sdpa", "traced"), ("fp16", "flash_attention_2", "traced"), ("bf16", "eager", "traced"),
    ("fp32", "sdpa", "formula"),  # the catalog ships 16-bit terms only
])  # fmt: skip
def test_the_source_is_said_per_dtype_and_attention(dtype: str, attn: str, expected: str) -> None:
    assert source(get_model("qwen3-8b"), dtype, attn) == expected
    assert source(dataclasses.replace(get_model("qwen3-8b"), activation_terms={}), dtype, attn) == "formula"


def test_a_traced_layer_is_its_terms_evaluated() -> None:
    model = get_model("llama-3.1-8b")
    terms = model.activation_terms[terms_key("bf16", "sdpa")]
    sizes = layer_saved_tensors(model, 4, 1024, "bf16", "sdpa", COEF)
    assert sizes == tuple(evaluate(c, 4, 1024) for c in terms["layer_saved"])
    acts = activations(model, 4, 1024, "bf16", "sdpa", False, COEF)
    assert acts.saved == model.num_layers * sum(sizes) + evaluate(terms["outside_saved"], 4, 1024)
    assert acts.backward_working == peak_of(terms["windows"]["layer_backward"], 4, 1024)


def test_the_traced_loss_agrees_with_the_mechanism_the_formula_names() -> None:
    """ForCausalLMLoss: logits upcast to fp32, an fp32 log-softmax kept, two fp32 gradients in its backward:
    the formula's 12 bytes per logit, here read from the code (within 1%: the labels' shift and the loss's
    scalars are the rest)."""
    model = get_model("llama-3.2-1b")
    elements = 2 * 1024 * model.vocab_size
    traced = loss_logits(model, 2, 1024, "bf16", COEF, holds_output=False, attn_impl="sdpa")
    assert traced.backward == pytest.approx(COEF.logits_peak_bytes * elements, rel=0.01)
    assert traced.forward == pytest.approx((2 + 4 + 4) * elements, rel=0.01)  # bf16 logits, fp32 copy, log-softmax
    held = loss_logits(model, 2, 1024, "bf16", COEF, holds_output=True, attn_impl="sdpa")
    assert held.backward - traced.backward == held.held == 2 * elements


def test_a_moe_layer_saves_the_routed_tokens_of_every_expert_it_runs() -> None:
    """Qwen3-30B-A3B runs 8 of 128 experts of width 768 per token: the same 6144 of MLP width per token as the
    dense Qwen3-1.7B (hidden 2048 both), but each token's hidden state is dispatched to 8 experts, and those
    rows (b*s*8 x hidden, bf16) are kept for the experts' backward on top of what a dense layer keeps."""
    moe, dense = get_model("qwen3-30b-a3b"), get_model("qwen3-1.7b")
    assert moe.intermediate_size == dense.intermediate_size == 6144 and moe.hidden_size == dense.hidden_size
    b, s = 2, 1024
    dispatched = 2 * b * s * moe.experts_per_token * moe.hidden_size
    moe_saved = sum(layer_saved_tensors(moe, b, s, "bf16", "sdpa", COEF))
    assert moe_saved > sum(layer_saved_tensors(dense, b, s, "bf16", "sdpa", COEF)) + dispatched


def test_a_prediction_moves_with_the_traced_terms() -> None:
    hw = Hardware(gpu=get_gpu("H100-80G"), gpu_memory_bytes=80 * 2**30, cpu_memory_bytes=512 * 2**30)
    strategy = Strategy(zero_stage=2, micro_batch=4)
    traced = get_model("qwen3-8b")
    formula = dataclasses.replace(traced, activation_terms={})
    a, f = (
        predict(Workload(kind="sft", model=m, seq_len=2048, global_batch=4), strategy, hw) for m in (traced, formula)
    )
    assert a.breakdown["activations"] != f.breakdown["activations"]


def test_compacting_a_window_keeps_its_peak_and_end_at_every_shape() -> None:
    window = [[0, 0, 0, 8, 0, 0], [0, 0, 0, 4, 0, 0], [0, 0, 0, -8, 0, 0], [16, 0, 0, 0, 0, 0],
              [0, 0, 0, 0, 0, 2], [0, 0, 0, -4, 0, -2], [0, 0, 0, 1, 0, -1]]  # fmt: skip
    small = compact(window)
    assert len(small) < len(window)
    for b, s in [(1, 1), (2, 64), (8, 4096)]:
        assert peak_of(small, b, s) == peak_of(window, b, s)
        assert left_by(small, b, s) == left_by(window, b, s)
