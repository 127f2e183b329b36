"""The KV cache a generation holds, per layer as transformers' own DynamicCache keeps it (sliding windows)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_family_config

from probes.model_shape import config_object, spec_of_config
from search.rlhf.memory import kv_cache_bytes
from store.models import get_model

# Gemma 3's pattern: five sliding-window layers (window 8 here) to one full-attention layer
GEMMA3 = tiny_family_config("gemma3_text", num_hidden_layers=6, sliding_window=8)


def _cache_bytes(cache: object) -> int:
    storages = {}
    for layer in cache.layers:  # type: ignore[attr-defined]
        for tensor in (layer.keys, layer.values):
            if tensor is not None and tensor.numel():
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@pytest.mark.parametrize(("prompt", "generated"), [(32, 10), (4, 2), (6, 12)])
def test_the_cache_holds_what_the_sliding_windows_say(prompt: int, generated: int) -> None:
    from transformers import DynamicCache

    spec = spec_of_config("tiny-gemma3", GEMMA3)
    assert spec.kv_windows == (8, 8, 8, 8, 8, 0)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = config_object(GEMMA3, "tiny-gemma3")
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config).eval()
    cache = DynamicCache(config=model.config)
    ids = torch.randint(3, 500, (2, prompt))
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        after_prefill = _cache_bytes(cache)
        for _ in range(generated):
            model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
    held = _cache_bytes(cache)
    assert after_prefill == kv_cache_bytes(spec, 2, prompt, "fp32", windows=True, prefill=True)
    assert held == kv_cache_bytes(spec, 2, prompt + generated, "fp32", windows=True)


def test_gemma_3_keeps_far_less_kv_than_a_full_cache_over_long_generations() -> None:
    gemma = get_model("gemma-3-4b")  # 29 of 34 layers slide over 1024 tokens
    full = kv_cache_bytes(gemma, 8, 8192, "bf16")
    windowed = kv_cache_bytes(gemma, 8, 8192, "bf16", windows=True)
    assert windowed == full * (5 * 8192 + 29 * 1024) // (34 * 8192)
    assert kv_cache_bytes(get_model("llama-3.1-8b"), 8, 8192, "bf16", windows=True) == kv_cache_bytes(
        get_model("llama-3.1-8b"), 8, 8192, "bf16"
    )
