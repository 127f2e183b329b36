"""The activation trace follows DeepSeek's MLA (issue 32, item 6).

Real transformers model classes built from small configs on the meta device, as the planner traces any local
config (``tests/planner/test_model_identity.py``: a family it cannot follow yet is named in the plan).
"""

from __future__ import annotations

from probes.trace.activations import cut_model
from probes.trace.terms import trace_terms

# DeepSeek-V3's layout at a small width: MLA (a compressed KV latent, 48-wide query/key heads, 32-wide values)
# and the first 3 of 8 layers dense, the rest routed through experts
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "num_hidden_layers": 8, "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 3,
    "kv_lora_rank": 64, "q_lora_rank": 96, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32,
    "vocab_size": 1000, "max_position_embeddings": 4096,
}  # fmt: skip


def test_mla_is_traced_with_the_kernel_a_gpu_picks() -> None:
    """MLA's values are narrower than its queries and keys, which flash attention refuses: the GPU runs the
    memory-efficient kernel, and so does the trace (before, the trace ran flash's and failed on o_proj)."""
    terms = trace_terms(DEEPSEEK_V3, "bf16", "sdpa", generation=True, variants=False)
    assert terms["layer_saved"] and "generation_unfitted" not in terms
    assert "decode_step" in terms["windows"]


def test_the_traced_deepseek_layer_is_a_routed_one() -> None:
    """Most of DeepSeek's layers run experts: the cut's traced (second) layer is one of them, not a dense one."""
    model = cut_model(DEEPSEEK_V3, "bf16", "sdpa")
    first, second = model.model.layers
    assert not hasattr(first.mlp, "experts") and hasattr(second.mlp, "experts")
