"""The tracer's record of a decoder layer's forward, tensor by tensor (issue 46): what it makes, in order, and
when each temporary is freed; its fit over the shapes; and the catalog's term read back at any shape."""

from __future__ import annotations

from probes.trace.activations import CHECK_SHAPE, FIT_SHAPES, cut_model, gpu_kernels
from probes.trace.layer_forward import fit_layer_forward, layer_forward_terms, trace_layer_forward_tensors
from store.activation_terms import LAYER_FORWARD_TENSORS, layer_forward_tensors, valid_terms
from store.models import get_model

# OPT with dropout (transformers' modeling_opt.py), tiny widths; 16-bit so that sdpa takes the flash kernel
OPT = {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
       "vocab_size": 512, "word_embed_proj_dim": 64, "dropout": 0.1, "pad_token_id": 0}  # fmt: skip


def test_opt_layer_forward_makes_and_frees_as_its_code_does() -> None:
    """Per layer (no KV cache): five b x s x h temporaries (q_proj's output before the scaling, out_proj's
    before dropout, that dropout's output, fc2's before dropout and its dropout's output) and fc1's b x s x ffn
    output, freed once the ReLU that saves its own output has run; each freed after the tensor made from it."""
    b, s, h, ffn = 2, 64, 64, 128
    model = cut_model(OPT, "bf16", "sdpa")
    with gpu_kernels():
        tensors = trace_layer_forward_tensors(model, b, s)
    temporaries = [(i, size, freed) for i, (size, freed) in enumerate(tensors) if freed >= 0]
    assert sorted(size for _, size, _ in temporaries) == [2 * b * s * h] * 5 + [2 * b * s * ffn]
    for i, _, freed in temporaries:
        assert freed > i  # freed once a later tensor of the layer exists
    fc1 = next(i for i, size, _ in temporaries if size == 2 * b * s * ffn)
    assert tensors[fc1 + 1] == (2 * b * s * ffn, -1)  # the ReLU's output, saved
    assert next(freed for i, _, freed in temporaries if i == fc1) == fc1 + 1


def test_the_fit_holds_the_order_of_frees_and_the_sizes_at_a_new_shape() -> None:
    model = cut_model(OPT, "bf16", "sdpa")
    with gpu_kernels():
        traces = [trace_layer_forward_tensors(model, *shape) for shape in FIT_SHAPES]
        check = trace_layer_forward_tensors(model, *CHECK_SHAPE)
        assert layer_forward_terms(model) == fit_layer_forward(traces, check)
    fitted = fit_layer_forward(traces, check)
    assert fitted is not None
    assert layer_forward_tensors({LAYER_FORWARD_TENSORS: fitted}, *CHECK_SHAPE) == check
    shuffled = tuple((size, -1) for size, _ in check)
    assert fit_layer_forward(traces, shuffled) is None  # frees in another order at another shape: not kept


def test_the_catalog_carries_the_term_and_a_damaged_one_is_refused() -> None:
    terms = get_model("opt-1.3b").activation_terms["2-sdpa"]
    assert LAYER_FORWARD_TENSORS in terms and valid_terms(terms)
    damaged = {**terms, LAYER_FORWARD_TENSORS: {**terms[LAYER_FORWARD_TENSORS], "freed_after": [0]}}
    assert not valid_terms(damaged)
    assert layer_forward_tensors({}, 2, 64) == ()
