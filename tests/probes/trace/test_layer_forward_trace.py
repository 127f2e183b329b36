"""The tracer's record of a decoder layer's forward, tensor by tensor (issue 46): what it makes, in order, and
when each temporary is freed; its fit over the shapes; and the catalog's term read back at any shape."""

from __future__ import annotations

from probes.trace.activations import CHECK_SHAPE, FIT_SHAPES, cut_model, gpu_kernels
from probes.trace.layer_forward import (
    fit_layer_forward,
    layer_forward_terms,
    trace_decoder_held_tensors,
    trace_layer_forward_tensors,
)
from store.activation_terms import (
    HELD_OVER_LAYERS,
    LAYER_FORWARD_TENSORS,
    held_over_layers,
    layer_forward_tensors,
    valid_terms,
)
from store.models import get_model

# OPT with dropout (transformers' modeling_opt.py), tiny widths; 16-bit so that sdpa takes the flash kernel
OPT = {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
       "vocab_size": 512, "word_embed_proj_dim": 64, "dropout": 0.1, "pad_token_id": 0}  # fmt: skip
# A Llama-style decoder (transformers' modeling_llama.py), tiny widths
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}  # fmt: skip


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
        terms = layer_forward_terms(model)
    fitted = fit_layer_forward(traces, check)
    assert terms is not None and fitted is not None
    assert {k: v for k, v in terms.items() if k != HELD_OVER_LAYERS} == fitted
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


def test_opt_decoder_holds_both_embedding_outputs_over_its_layers() -> None:
    """``OPTDecoder.forward`` keeps ``inputs_embeds`` and ``pos_embeds`` (b x s x h each) in its locals from before
    the first layer until it returns; the position ids and their mask with them. Nothing saves them."""
    b, s, h = 2, 64, 64
    model = cut_model(OPT, "bf16", "sdpa")
    with gpu_kernels():
        held = trace_decoder_held_tensors(model, b, s)
        terms = layer_forward_terms(model)
    assert [size for size in held if size == 2 * b * s * h] == [2 * b * s * h] * 2
    assert all(size == 2 * b * s * h or size <= 8 * b * s for size in held)  # int64 ids, fp32 mask
    assert terms is not None and held_over_layers({LAYER_FORWARD_TENSORS: terms}, b, s) == held
    assert held_over_layers({LAYER_FORWARD_TENSORS: terms}, *CHECK_SHAPE)[0] == 2 * CHECK_SHAPE[0] * CHECK_SHAPE[1] * h


def test_llama_decoder_holds_its_embedding_output_only() -> None:
    """A Llama decoder's first layer reads ``inputs_embeds`` as its residual and its norm saves an fp32 upcast,
    not the 16-bit tensor: the decoder's local holds it to the end; the rotary cos and sin are saved."""
    b, s, h = 2, 64, 64
    model = cut_model(LLAMA, "bf16", "sdpa")
    with gpu_kernels():
        held = trace_decoder_held_tensors(model, b, s)
    assert [size for size in held if size >= b * s * h] == [2 * b * s * h]  # the rest: position ids


def test_flash_attention_keeps_grouped_query_k_and_v_unrepeated() -> None:
    """transformers asks sdpa for ``enable_gqa`` when there is no mask (``use_gqa_in_sdpa``) and CUDA's flash
    kernel takes the K and V heads as they are (torch's ``sdp_utils.cpp``: GQA admitted for flash only): a
    16-bit Llama layer saves K and V at its 2 KV heads, not repeated to its 4 query heads."""
    b, s, heads, kv_heads, head_dim = 2, 64, 4, 2, 16
    model = cut_model(LLAMA, "bf16", "sdpa")
    with gpu_kernels():
        saved = [size for size, freed in trace_layer_forward_tensors(model, b, s) if freed < 0]
    with gpu_kernels(target="cpu"):  # torch's CPU flash kernel does not take grouped heads: K and V repeated
        repeated_saved = [size for size, freed in trace_layer_forward_tensors(model, b, s) if freed < 0]
    kv, repeated = 2 * b * s * kv_heads * head_dim, 2 * b * s * heads * head_dim
    assert saved.count(kv) - repeated_saved.count(kv) == 2  # flash's saved K and V, at the KV heads
    assert repeated_saved.count(repeated) - saved.count(repeated) == 2  # not repeated to the query heads
