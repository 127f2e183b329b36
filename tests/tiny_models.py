"""Test-side builders for the records the probes read: ModelSpec, Workload, Hardware, Strategy.

``tiny_llama_spec`` describes a real (tiny) Llama causal LM: its ``hf_config`` is what
``transformers.AutoConfig.for_model("llama", **hf_config)`` turns into the model the integration tests
train, and its parameter counts are exact. ``rough_spec`` is for render-only tests, which read just
``hidden_size`` and the names. Nothing here imports torch; ``build_tiny_model`` imports transformers
lazily.
"""

from __future__ import annotations

from typing import Any

from store.gpus import GENERIC_RATES
from store.records import (
    FrozenModelStrategy,
    Hardware,
    ModelSpec,
    RLHFStrategy,
    Strategy,
    TrainedModelStrategy,
    Workload,
)

TINY_HIDDEN = 64
TINY_LAYERS = 2
TINY_HEADS = 4
TINY_INTERMEDIATE = 128
TINY_VOCAB = 128
TINY_POSITIONS = 64

GiB = 2**30


def tiny_family_config(model_type: str, vocab: int = 512, positions: int = 512, **more: Any) -> dict[str, Any]:
    """A two-layer, 64-wide HF config of a Llama-like family (llama, qwen2/3, gemma3_text, phi3, mixtral,
    qwen3_moe...): grouped-query attention with 16-wide heads, token ids inside the vocabulary."""
    return {
        "model_type": model_type,
        "hidden_size": TINY_HIDDEN,
        "intermediate_size": TINY_INTERMEDIATE,
        "num_hidden_layers": TINY_LAYERS,
        "num_attention_heads": TINY_HEADS,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": vocab,
        "max_position_embeddings": positions,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **more,
    }


TINY_MOE = {
    "qwen3_moe": {"moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}


def tiny_llama_hf_config() -> dict[str, Any]:
    """The transformers LlamaConfig kwargs of the tiny model (random weights, never downloaded)."""
    return {
        "hidden_size": TINY_HIDDEN,
        "intermediate_size": TINY_INTERMEDIATE,
        "num_hidden_layers": TINY_LAYERS,
        "num_attention_heads": TINY_HEADS,
        "num_key_value_heads": TINY_HEADS,
        "vocab_size": TINY_VOCAB,
        "max_position_embeddings": TINY_POSITIONS,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
    }


def tiny_llama_spec() -> ModelSpec:
    """ModelSpec of the tiny Llama with exact counts (q, k, v, o; gate, up, down; two RMSNorms)."""
    h, i, v = TINY_HIDDEN, TINY_INTERMEDIATE, TINY_VOCAB
    layer = 4 * h * h + 3 * h * i + 2 * h
    embedding = v * h
    lm_head = v * h
    return ModelSpec(
        name="tiny-llama",
        model_type="llama",
        hidden_size=h,
        num_layers=TINY_LAYERS,
        num_heads=TINY_HEADS,
        num_kv_heads=TINY_HEADS,
        head_dim=h // TINY_HEADS,
        intermediate_size=i,
        vocab_size=v,
        max_positions=TINY_POSITIONS,
        tie_word_embeddings=False,
        gated_mlp=True,
        dropout=0.0,
        total_params=embedding + TINY_LAYERS * layer + h + lm_head,
        layer_params=layer,
        embedding_params=embedding,
        lm_head_params=lm_head,
        hf_config=tiny_llama_hf_config(),
    )


def rough_spec(name: str = "rough-1b", hidden_size: int = 2048) -> ModelSpec:
    """A ModelSpec with plausible but rough counts: enough for config rendering, not for sizing."""
    layers = 24
    layer = 12 * hidden_size * hidden_size
    embedding = 50_000 * hidden_size
    return ModelSpec(
        name=name,
        model_type="opt",
        hidden_size=hidden_size,
        num_layers=layers,
        num_heads=hidden_size // 64,
        num_kv_heads=hidden_size // 64,
        head_dim=64,
        intermediate_size=4 * hidden_size,
        vocab_size=50_000,
        max_positions=2048,
        tie_word_embeddings=True,
        gated_mlp=False,
        dropout=0.1,
        total_params=embedding + layers * layer,
        layer_params=layer,
        embedding_params=embedding,
        lm_head_params=0,
    )


def make_workload(
    model: ModelSpec | None = None, dtype: str = "bf16", seq_len: int = 16, global_batch: int = 2
) -> Workload:
    """An SFT workload on ``model`` (the tiny Llama by default)."""
    return Workload(
        kind="sft", model=model or tiny_llama_spec(), seq_len=seq_len, global_batch=global_batch, dtype=dtype
    )


def make_hardware(gpus: int = 1, nodes: int = 1, nvme_path: str | None = None) -> Hardware:
    """``nodes`` x ``gpus`` generic 24 GiB GPUs."""
    return Hardware(gpu=GENERIC_RATES, gpu_memory_bytes=24 * GiB, gpus=gpus, nodes=nodes, nvme_path=nvme_path)


def make_strategy(**changes: Any) -> Strategy:
    """A Strategy with the given fields; the rest keep the record's defaults."""
    return Strategy(**changes)


def build_tiny_model(spec: ModelSpec | None = None) -> Any:
    """Instantiate the causal LM of ``spec.hf_config`` with random weights (transformers, imported here)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = spec or tiny_llama_spec()
    config = AutoConfig.for_model(spec.model_type, **spec.hf_config)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


# --- RLHF helpers: a second causal LM (tiny OPT), a smaller critic/reward backbone, RLHF records ---------
# (critic and reward models are built by the probes' own ``probes.model.build.build_value_model``)


def tiny_opt_hf_config() -> dict[str, Any]:
    """The transformers OPTConfig kwargs of a tiny OPT (pre-norm, tied LM head, no dropout)."""
    return {
        "hidden_size": TINY_HIDDEN,
        "ffn_dim": TINY_INTERMEDIATE,
        "num_hidden_layers": TINY_LAYERS,
        "num_attention_heads": TINY_HEADS,
        "vocab_size": TINY_VOCAB,
        "max_position_embeddings": TINY_POSITIONS,
        "word_embed_proj_dim": TINY_HIDDEN,
        "do_layer_norm_before": True,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "layerdrop": 0.0,
        "pad_token_id": 1,
        "bos_token_id": 2,
        "eos_token_id": 2,
    }


def tiny_opt_spec() -> ModelSpec:
    """ModelSpec of the tiny OPT with exact counts (biased q, k, v, out, fc1, fc2; two LayerNorms a layer)."""
    h, f, v, p = TINY_HIDDEN, TINY_INTERMEDIATE, TINY_VOCAB, TINY_POSITIONS
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    embedding = v * h + (p + 2) * h  # OPT's learned positions are offset by 2
    return ModelSpec(
        name="tiny-opt",
        model_type="opt",
        hidden_size=h,
        num_layers=TINY_LAYERS,
        num_heads=TINY_HEADS,
        num_kv_heads=TINY_HEADS,
        head_dim=h // TINY_HEADS,
        intermediate_size=f,
        vocab_size=v,
        max_positions=p,
        tie_word_embeddings=True,
        gated_mlp=False,
        dropout=0.0,
        total_params=embedding + TINY_LAYERS * layer + 2 * h,
        layer_params=layer,
        embedding_params=embedding,
        lm_head_params=0,
        hf_config=tiny_opt_hf_config(),
    )


def tiny_critic_spec(hidden: int = 32, layers: int = 1, heads: int = 2, intermediate: int = 64) -> ModelSpec:
    """A smaller Llama (same vocabulary as the tiny actor) for critic and reward backbones; exact counts."""
    v = TINY_VOCAB
    layer = 4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden
    hf_config = {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "vocab_size": v,
        "max_position_embeddings": TINY_POSITIONS,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
    }
    return ModelSpec(
        name=f"tiny-critic-h{hidden}",
        model_type="llama",
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=intermediate,
        vocab_size=v,
        max_positions=TINY_POSITIONS,
        tie_word_embeddings=False,
        gated_mlp=True,
        dropout=0.0,
        total_params=v * hidden + layers * layer + hidden + v * hidden,
        layer_params=layer,
        embedding_params=v * hidden,
        lm_head_params=v * hidden,
        hf_config=hf_config,
    )


def make_rlhf_workload(
    kind: str = "ppo",
    model: ModelSpec | None = None,
    critic_model: ModelSpec | None = None,
    dtype: str = "bf16",
    prompt_len: int = 8,
    gen_len: int = 4,
    global_batch: int = 2,
    ppo_epochs: int = 1,
    samples_per_prompt: int = 1,
) -> Workload:
    """An RLHF workload: actor and reference ``model`` (tiny Llama), critic and reward ``critic_model``."""
    model = model or tiny_llama_spec()
    critic_model = critic_model or tiny_critic_spec()
    return Workload(
        kind=kind,
        model=model,
        seq_len=prompt_len + gen_len,
        global_batch=global_batch,
        dtype=dtype,
        ref_model=model,
        critic_model=critic_model if kind == "ppo" else None,
        reward_model=critic_model,
        prompt_len=prompt_len,
        gen_len=gen_len,
        ppo_epochs=ppo_epochs,
        samples_per_prompt=samples_per_prompt,
    )


def make_rlhf_strategy(
    actor: dict[str, Any] | None = None,
    critic: dict[str, Any] | None = None,
    reference: dict[str, Any] | None = None,
    reward: dict[str, Any] | None = None,
    with_critic: bool = True,
    **changes: Any,
) -> RLHFStrategy:
    """An RLHFStrategy from per-model block dictionaries (defaults where left out) and step-wide knobs."""
    return RLHFStrategy(
        actor=TrainedModelStrategy(**(actor or {})),
        critic=TrainedModelStrategy(**(critic or {})) if with_critic else None,
        reference=FrozenModelStrategy(**(reference or {})),
        reward=FrozenModelStrategy(**(reward or {})),
        **changes,
    )


# Qwen3-Next at a small width: linear (Gated DeltaNet) and full attention layers (every 4th), routed experts
QWEN3_NEXT = {
    "model_type": "qwen3_next", "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "num_experts": 4, "num_experts_per_tok": 2, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32, "vocab_size": 1000,
}  # fmt: skip
