"""Generation and scoring bytes traced on the meta device equal what a real CPU run of the same code holds.

Each family is cut to two decoder layers. transformers' ``generate`` (prefill and a decoding step over its
DynamicCache, with the RLHF probe's arguments) and the probe's scoring forward with ``token_logprobs`` run for
real on the CPU (random weights, tiny widths) under the same live-tensor tracker as the meta trace; where the
meta trace answers a value generate reads (no padding, an all-ones mask...), the real run computes it. The
fitted windows must say the same bytes (within 2%) at a shape the fit never saw. And the decoding step's
window plus the KV cache must be what the real step holds with the cache in (the window leaves the cache to
the cost model's cache rule, and must not leave out anything else).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_MOE, tiny_family_config

from probes.trace.activations import CHECK_SHAPE, FIT_SHAPES, cut_model, gpu_kernels
from probes.trace.generation import GenerationTrace, trace_generation, trace_generation_terms
from probes.trace.terms import trace_terms
from store.activation_terms import GENERATION_WINDOWS, left_by, peak_of, valid_terms

OPT = {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
       "vocab_size": 512, "word_embed_proj_dim": 64, "dropout": 0.1, "pad_token_id": 1}  # fmt: skip
FAMILIES = {
    "opt": OPT,
    "llama": tiny_family_config("llama"),
    "gemma3_text": tiny_family_config("gemma3_text", sliding_window=256),  # sliding layers, as the cut keeps
    "qwen3_moe": tiny_family_config("qwen3_moe", **TINY_MOE["qwen3_moe"]),
}
CASES = [
    ("opt", "fp32", "eager"),
    ("opt", "bf16", "sdpa"),  # eval mode: no dropout, so the CPU's flash kernel can check it
    ("llama", "bf16", "eager"),
    ("llama", "fp32", "sdpa"),
    ("gemma3_text", "bf16", "sdpa"),
    ("gemma3_text", "fp32", "eager"),
    ("qwen3_moe", "bf16", "eager"),  # grouped expert GEMMs take 16-bit inputs only
]
SHAPE = (3, 96)  # not a fit shape, not the check shape
assert SHAPE not in FIT_SHAPES and SHAPE != CHECK_SHAPE


def _real_cpu_run(config: dict, dtype: str, attn: str) -> GenerationTrace:
    torch.manual_seed(0)
    model = cut_model(config, dtype, attn, device="cpu")
    with gpu_kernels(attention=attn != "eager", target="cpu"):
        return trace_generation(model, *SHAPE)


def _close(traced: int, measured: int) -> bool:
    return abs(traced - measured) <= 0.02 * max(abs(measured), 1)


def _peak(changes: tuple[int, ...]) -> int:
    return max([0] + [sum(changes[: i + 1]) for i in range(len(changes))])


@pytest.mark.parametrize(("family", "dtype", "attn"), CASES, ids=lambda v: str(v))
def test_the_meta_trace_says_what_a_real_cpu_generate_and_scoring_hold(family: str, dtype: str, attn: str) -> None:
    config = FAMILIES[family]
    with gpu_kernels(attention=attn != "eager", target="cpu"):
        terms = trace_generation_terms(cut_model(config, dtype, attn))
    real = _real_cpu_run(config, dtype, attn)
    b, s = SHAPE
    pairs = {}
    for window in GENERATION_WINDOWS:
        pairs[f"{window} peak"] = (peak_of(terms[window], b, s), _peak(real.windows[window]))
        pairs[f"{window} left"] = (left_by(terms[window], b, s), sum(real.windows[window]))
    off = {name: pair for name, pair in pairs.items() if not _close(*pair)}
    assert not off, f"traced vs real CPU run, {family} {dtype} {attn}: {off}"
    # the decoding step as recorded with its cache: the traced moment beside the cache after the step
    step = max(
        peak_of(terms["decode_step"], b, s), left_by(terms["decode_step"], b, s) + peak_of(terms["decode_head"], b, s)
    )
    # the cache rule counts the step's new token in every layer from the step's start: less than that one token over
    token = real.cache_after // (s + 1)
    assert real.cache_after > 0
    assert 0 <= step + real.cache_after - real.step_peak < token, (step, real.cache_after, real.step_peak, token)


def test_eager_decoding_holds_the_scores_over_the_cache_and_sdpa_does_not() -> None:
    """HF's eager attention makes b x heads x 1 x (cache + 1) scores and their fp32 softmax in a decoding step:
    the eager step grows with the cache faster than the sdpa one, by at least the scores of every head."""
    config = FAMILIES["llama"]
    windows = {}
    for attn in ("eager", "sdpa"):
        with gpu_kernels(attention=attn != "eager", target="cpu"):
            windows[attn] = trace_generation_terms(cut_model(config, "bf16", attn))
    b, c = 4, 1024

    def step(attn: str, tokens: int) -> int:
        w = windows[attn]
        return max(
            peak_of(w["decode_step"], b, tokens),
            left_by(w["decode_step"], b, tokens) + peak_of(w["decode_head"], b, tokens),
        )

    heads = config["num_attention_heads"]
    growth = {attn: step(attn, 2 * c) - step(attn, c) for attn in windows}
    assert growth["eager"] - growth["sdpa"] >= b * heads * c * (2 + 4)  # bf16 scores and their fp32 softmax


def test_a_generate_the_meta_device_cannot_run_leaves_the_training_terms_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import probes.trace.terms

    def unknown(model: object) -> dict:
        raise RuntimeError("generate reads a tensor's value the trace does not know")

    monkeypatch.setattr(probes.trace.terms, "trace_generation_terms", unknown)
    # trace_terms as trace_all_terms calls it for one setting (key "2-eager"), less the variants of the training
    # code, traced after generation whatever it did (half this test's CPU; test_activation_trace has them)
    terms = trace_terms(FAMILIES["llama"], "bf16", "eager", generation=True, variants=False)
    assert valid_terms(terms) and not set(GENERATION_WINDOWS) & set(terms["windows"])
    assert "does not know" in terms["generation_unfitted"]
