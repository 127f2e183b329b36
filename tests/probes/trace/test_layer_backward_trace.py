"""The tracer's record of a decoder layer's backward, tensor by tensor (issue 46): what autograd makes, in order,
and when each is freed; the weights' gradients left out (the cost model's gradients). Its fit over the shapes is
the layer forward's (``fit_layer_forward``, tests/probes/trace/test_layer_forward_trace.py); the catalog's term
read back at opt-1.3b's width: tests/search/test_layer_backward_stream.py."""

from __future__ import annotations

from probes.trace.activations import cut_model, gpu_kernels
from probes.trace.layer_backward import trace_layer_backward_tensors
from store.activation_terms import LAYER_BACKWARD_TENSORS, layer_backward_tensors, valid_terms
from store.models import get_model

# OPT with dropout (transformers' modeling_opt.py), tiny widths; 16-bit so that sdpa takes the flash kernel
OPT = {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
       "vocab_size": 512, "word_embed_proj_dim": 64, "dropout": 0.1, "pad_token_id": 0}  # fmt: skip


def test_opt_layer_backward_makes_its_input_gradients_and_frees_them_once_read() -> None:
    """fc2's input gradient and the ReLU's backward (``threshold_backward``) are b x s x ffn, each freed once
    the next op has read it; one b x s x h gradient goes to the layer below; the weights' gradients (h x h for
    the attention's projections) are not listed."""
    b, s, h, ffn = 3, 64, 64, 128
    model = cut_model(OPT, "bf16", "sdpa")
    with gpu_kernels():
        tensors = trace_layer_backward_tensors(model, b, s)
    wide = [i for i, (size, _) in enumerate(tensors) if size == 2 * b * s * ffn]
    assert len(wide) == 2 and all(tensors[i][1] == i + 1 for i in wide)
    assert [size for size, freed in tensors if freed < 0] == [2 * b * s * h]
    assert 2 * h * h not in {size for size, _ in tensors}
    assert all(freed < 0 or freed >= i for i, (_, freed) in enumerate(tensors))


def test_the_catalog_carries_the_term_and_a_damaged_one_is_refused() -> None:
    terms = get_model("opt-1.3b").activation_terms["2-sdpa"]
    assert LAYER_BACKWARD_TENSORS in terms and valid_terms(terms)
    damaged = {**terms, LAYER_BACKWARD_TENSORS: {**terms[LAYER_BACKWARD_TENSORS], "freed_after": [0]}}
    assert not valid_terms(damaged)
    assert layer_backward_tensors({}, 2, 64) == ()
