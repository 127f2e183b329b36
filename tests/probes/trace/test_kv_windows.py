"""The KV cache a generation holds, per layer as transformers' own DynamicCache keeps it (sliding windows)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_family_config

from probes.model.shape import config_object, spec_of_config
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


def test_an_mla_model_caches_its_compressed_latent_not_every_head() -> None:
    """DeepSeek-V3's attention caches kv_lora_rank + qk_rope_head_dim elements per token and layer (a real CPU
    DynamicCache says so); 2 x kv_heads x head_dim would count every head's K and V."""
    from transformers import AutoModelForCausalLM, DynamicCache

    config = {"model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
              "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": 128, "first_k_dense_replace": 1, "q_lora_rank": 16,
              "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 1,
              "topk_group": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
    spec = spec_of_config("tiny-deepseek-v3", config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_object(config, "tiny-deepseek-v3")).eval()
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.randint(3, 100, (2, 12)), past_key_values=cache, use_cache=True)
    assert spec.kv_elements_per_token == 32 + 8
    assert _cache_bytes(cache) == kv_cache_bytes(spec, 2, 12, "fp32", windows=True, prefill=True)
