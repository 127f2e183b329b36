"""Sliding-window layers under sdpa: which layers they are (as transformers' own configs lay them out) and the
attention FLOPs their explicit mask costs once the sequence reaches the window (issue 34, large vocabularies:
Gemma-3 1B at 1024 tokens)."""

from __future__ import annotations

import pytest

from search import DEFAULT_COEFFICIENTS as COEF
from search.model.kernels import attention_flops, layers_attention_flops
from search.model.passes import forward_pass
from search.model.shapes import sliding_window_layers
from store.gpus import get_gpu
from store.models import catalog_configs, get_model

transformers = pytest.importorskip("transformers")


def _transformers_layer_types(config: dict) -> list[str] | None:
    values = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    made = transformers.AutoConfig.for_model(config["model_type"], **values)
    text = getattr(made, "text_config", None) or made
    return getattr(text, "layer_types", None)


@pytest.mark.parametrize(
    "name", [n for n, c in catalog_configs().items() if c.get("sliding_window") or c.get("layer_types")]
)
def test_the_sliding_layers_are_the_ones_transformers_lays_out(name: str) -> None:
    model = get_model(name)
    types = _transformers_layer_types({"model_type": model.model_type, **model.hf_config})
    sliding, window = sliding_window_layers(model)
    if types is None:  # a family whose attention reads sliding_window in every layer (Mistral)
        assert sliding in (0, model.num_layers)
        return
    expected = sum(1 for kind in types if kind == "sliding_attention")
    assert sliding == expected, (name, sliding, expected)
    assert window == (model.hf_config.get("sliding_window") if sliding else None)


def test_a_model_without_a_window_has_no_sliding_layers() -> None:
    assert sliding_window_layers(get_model("llama-3.1-8b")) == (0, None)


def test_masked_sliding_layers_compute_every_block_once_the_sequence_reaches_the_window() -> None:
    gemma = get_model("gemma-3-1b")
    sliding, window = sliding_window_layers(gemma)
    assert window is not None and 0 < sliding < gemma.num_layers
    half = attention_flops(gemma, 8, window * 2)
    assert layers_attention_flops(gemma, 8, window * 2) == (gemma.num_layers + sliding) * half
    short = window // 2  # below the window transformers passes is_causal: flash skips the masked half everywhere
    assert layers_attention_flops(gemma, 8, short) == gemma.num_layers * attention_flops(gemma, 8, short)


def test_the_forward_pays_for_the_masked_blocks() -> None:
    """Past the window the attention time grows by the masked layers' second half on top of the s^2 growth."""
    gemma = get_model("gemma-3-1b")
    sliding, window = sliding_window_layers(gemma)
    assert window is not None
    gpu = get_gpu("H100-80G")
    short, long = window // 2, window * 2
    at_short = forward_pass(gemma, 8, short, "bf16", gpu, COEF).gpu["attention"]
    at_long = forward_pass(gemma, 8, long, "bf16", gpu, COEF).gpu["attention"]
    growth = (long / short) ** 2 * (gemma.num_layers + sliding) / gemma.num_layers
    assert at_long == pytest.approx(at_short * growth)
