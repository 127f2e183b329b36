"""Activation and loss bytes traced on the meta device equal what a real CPU run of the same code holds.

Every family is cut to two decoder layers; one forward with labels and one backward run for real on the CPU
(random weights, tiny widths) under the same live-tensor tracker as the meta trace. The meta trace must say
the same bytes (within 2%: most are exact) at a shape the fit never saw, per quantity: what a layer saves for
backward, what the step saves outside the layers, the layer's forward and backward peaks, and the LM head and
loss's forward peak, what they hold into the backward and their backward peak. The fits themselves must hold
exactly on a shape not used to make them (``CHECK_SHAPE``), or the trace is refused.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_MOE, tiny_family_config

from probes.trace.activations import (
    CHECK_SHAPE,
    FIT_SHAPES,
    FitError,
    StepTrace,
    cut_model,
    fit_terms,
    gpu_kernels,
    trace_step,
)
from probes.trace.terms import trace_all_terms, trace_terms
from probes.trace.variants import LORA_CHECK_POINT, LORA_POINTS, trace_variant, variant_model
from store.activation_terms import VARIANTS, WINDOWS, evaluate, left_by, peak_of
from store.models import catalog_configs

FAMILIES = {
    "opt": {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 512, "word_embed_proj_dim": 64, "dropout": 0.1, "pad_token_id": 0},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 512,
             "bos_token_id": 1, "eos_token_id": 2},
    **{family: tiny_family_config(family) for family in ("llama", "qwen2", "qwen3", "gemma3_text", "phi3")},
    **{family: tiny_family_config(family, **extra) for family, extra in TINY_MOE.items()},
}  # fmt: skip
MOE = ("qwen3_moe", "mixtral")  # transformers' grouped expert GEMMs take 16-bit inputs only
SHAPE = (3, 96)  # not a fit shape, not the check shape
assert SHAPE not in FIT_SHAPES and SHAPE != CHECK_SHAPE


def _cases() -> list[tuple[str, str, str]]:
    cases = []
    for family, config in FAMILIES.items():
        for dtype in ("fp32", "bf16"):
            for attn in ("eager", "sdpa"):
                dropout = any(config.get(k) for k in ("dropout", "attn_pdrop")) or family == "gpt2"
                if (family in MOE and dtype == "fp32") or (attn == "sdpa" and dropout):
                    continue  # the CPU's flash kernel has no dropout: a real CPU run cannot check this one
                cases.append((family, dtype, attn))
    return cases


def _real_cpu_run(config: dict, dtype: str, attn: str) -> StepTrace:
    torch.manual_seed(0)
    model = cut_model(config, dtype, attn, device="cpu")
    with gpu_kernels(attention=attn != "eager", target="cpu"):
        return trace_step(model, *SHAPE)


def _close(traced: int, measured: int) -> bool:
    return abs(traced - measured) <= 0.02 * max(abs(measured), 1)


@pytest.mark.parametrize(("family", "dtype", "attn"), _cases(), ids=lambda v: str(v))
def test_the_meta_trace_says_what_a_real_cpu_step_holds(family: str, dtype: str, attn: str) -> None:
    config = FAMILIES[family]
    terms = trace_terms(config, dtype, attn, target="cpu", variants=False)  # the variants: below
    real = _real_cpu_run(config, dtype, attn)
    b, s = SHAPE
    pairs = {
        "layer saved": (sum(evaluate(c, b, s) for c in terms["layer_saved"]), sum(real.layer_saved)),
        "outside saved": (evaluate(terms["outside_saved"], b, s), real.outside_saved),
        "head held": (left_by(terms["windows"]["head_forward"], b, s), sum(real.windows["head_forward"])),
    }
    for window in WINDOWS:
        measured = max([0] + [sum(real.windows[window][: i + 1]) for i in range(len(real.windows[window]))])
        pairs[f"{window} peak"] = (peak_of(terms["windows"][window], b, s), measured)
    off = {name: pair for name, pair in pairs.items() if not _close(*pair)}
    assert not off, f"traced vs real CPU run, {family} {dtype} {attn}: {off}"


def test_a_fit_that_misses_the_check_shape_is_refused() -> None:
    model = cut_model(FAMILIES["llama"], "bf16", "eager")
    traces = [trace_step(model, b, s) for b, s in FIT_SHAPES]
    check = trace_step(model, *CHECK_SHAPE)
    bent = StepTrace(check.layer_saved, check.outside_saved + 512, check.windows)
    fit_terms(traces, check)  # the real one holds
    with pytest.raises(FitError, match="outside_saved"):
        fit_terms(traces, bent)


def test_eager_attention_keeps_the_scores_and_sdpa_does_not() -> None:
    """The s^2 terms: eager attention's softmax output is b x heads x s x s; flash keeps none."""
    config = catalog_configs()["llama-3.2-1b"]
    eager, sdpa = (trace_terms(config, "bf16", attn, variants=False) for attn in ("eager", "sdpa"))
    heads = config["num_attention_heads"]
    quadratic = {name: sum(c[5] for c in terms["layer_saved"]) for name, terms in (("eager", eager), ("sdpa", sdpa))}
    assert quadratic["sdpa"] == 0
    assert quadratic["eager"] >= heads * 2  # at least the bf16 probabilities of every head


def test_a_setting_that_cannot_be_traced_is_named_not_guessed() -> None:
    # one setting that traces beside the two that cannot (each traceable one is a full trace: one is enough here)
    terms = trace_all_terms(FAMILIES["qwen3_moe"], ("2-eager", "4-eager", "4-sdpa"))
    assert set(terms) == {"2-eager", "unfitted"}
    assert set(terms["unfitted"]) == {"4-eager", "4-sdpa"}
    assert "BF16" in terms["unfitted"]["4-eager"]


# HF gradient checkpointing and LoRA traced as such (probes.trace.variants), against a real CPU step of
# the same model with the same knobs: dtypes and kernels spread over the families.
VARIANT_CASES = [("llama", "bf16", "sdpa"), ("opt", "fp32", "eager"), ("gpt2", "bf16", "eager"),
                 ("qwen3_moe", "bf16", "sdpa"), ("gemma3_text", "bf16", "eager"), ("phi3", "fp32", "sdpa")]  # fmt: skip
RANK = 12  # neither a fit rank nor the check rank
assert RANK not in {point[2] for point in (*LORA_POINTS, LORA_CHECK_POINT)}


# Llama with every variant, each other family with one, in turn (the suite's time is kept in check).
VARIANT_RUNS = [(*VARIANT_CASES[0], variant) for variant in VARIANTS] + [
    (*case, list(VARIANTS)[i % len(VARIANTS)]) for i, case in enumerate(VARIANT_CASES[1:])
]


@pytest.mark.parametrize(("family", "dtype", "attn", "variant"), VARIANT_RUNS, ids=lambda v: str(v))
def test_a_checkpointed_or_lora_trace_says_what_a_real_cpu_step_holds(
    family: str, dtype: str, attn: str, variant: str
) -> None:
    checkpointed, lora = VARIANTS[variant]
    config = FAMILIES[family]
    terms = trace_variant(config, dtype, attn, checkpointed, lora, target="cpu")
    rank = RANK if lora else 0
    torch.manual_seed(0)
    model = variant_model(config, dtype, attn, checkpointed, rank, device="cpu")
    with gpu_kernels(attention=attn != "eager", target="cpu"):
        real = trace_step(model, *SHAPE, checkpointed=checkpointed)
    b, s = SHAPE
    pairs = {
        "layer saved": (sum(evaluate(c, b, s, rank) for c in terms["layer_saved"]), sum(real.layer_saved)),
        "outside saved": (evaluate(terms["outside_saved"], b, s, rank), real.outside_saved),
    }
    for window, changes in real.windows.items():
        measured = max([0] + [sum(changes[: i + 1]) for i in range(len(changes))])
        pairs[f"{window} peak"] = (peak_of(terms["windows"][window], b, s, rank), measured)
    off = {name: pair for name, pair in pairs.items() if not _close(*pair)}
    assert not off, f"traced vs real CPU run, {family} {variant} {dtype} {attn}: {off}"


def test_checkpointing_keeps_one_tensor_a_layer_and_lora_keeps_each_adapters_output() -> None:
    """What each knob changes, read off the traced terms of a Llama layer (h = 64 wide, 7 adapted linears)."""
    config = FAMILIES["llama"]
    plain = trace_terms(config, "bf16", "sdpa")
    checkpointed = plain["variants"]["checkpointed"]["layer_saved"]
    # a checkpointed layer keeps its 16-bit output, the next layer's checkpoint: b x s x h x 2 bytes
    assert [evaluate(c, 1, 1) for c in checkpointed] == [2 * config["hidden_size"]]
    lora = plain["variants"]["lora"]["layer_saved"]
    per_rank = sum(c[7] for c in lora)  # bytes per token and rank: each adapter's b x s x r output
    assert per_rank == 2 * 7
    full = sum(evaluate(c, 4, 64) for c in plain["layer_saved"])
    assert sum(evaluate(c, 4, 64, 0) for c in lora) < full  # frozen weights and norms keep no inputs for themselves
