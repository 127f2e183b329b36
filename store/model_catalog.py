"""The built-in models: HF config dicts written from the published ``config.json`` of each repo.

Only shape-relevant and behaviour-relevant keys are kept (no ``architectures``, ``torch_dtype`` or
tokenizer ids beyond bos/eos/pad). Each entry is ``(canonical name, aliases, config)``; aliases are
matched case-insensitively and include the Hugging Face repo id.
"""

from __future__ import annotations

from typing import Any

Entry = tuple[str, tuple[str, ...], dict[str, Any]]


def _opt(hidden: int, layers: int, heads: int, **changes: Any) -> dict[str, Any]:
    # facebook/opt-*: pre-LN except opt-350m; ffn 4x hidden; learned positions (2048 + 2 rows).
    return {
        "model_type": "opt",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "ffn_dim": 4 * hidden,
        "word_embed_proj_dim": hidden,
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
        "do_layer_norm_before": True,
        "activation_function": "relu",
        "dropout": 0.1,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "layerdrop": 0.0,
        "init_std": 0.02,
        "enable_bias": True,
        "layer_norm_elementwise_affine": True,
        "tie_word_embeddings": True,
        "pad_token_id": 1,
        "bos_token_id": 2,
        "eos_token_id": 2,
        **changes,
    }


def _gpt2(n_embd: int, n_layer: int, n_head: int) -> dict[str, Any]:
    # openai-community/gpt2*: Conv1D blocks, 1024 learned positions, dropout 0.1 everywhere.
    return {
        "model_type": "gpt2",
        "n_embd": n_embd,
        "n_layer": n_layer,
        "n_head": n_head,
        "n_ctx": 1024,
        "n_positions": 1024,
        "vocab_size": 50257,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
    }


def _decoder(
    model_type: str, *, hidden: int, inter: int, layers: int, heads: int, kv: int, **more: Any
) -> dict[str, Any]:
    # The Llama-like families (llama, mistral, qwen2): RMSNorm, SwiGLU, rotary positions, GQA.
    return {
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        **more,
    }


def _llama2(hidden: int, inter: int, layers: int, heads: int, kv: int) -> dict[str, Any]:
    # meta-llama/Llama-2-*-hf: 32k vocab, 4k context, untied head; 70b uses GQA (8 kv heads).
    return _decoder(
        "llama",
        hidden=hidden,
        inter=inter,
        layers=layers,
        heads=heads,
        kv=kv,
        vocab_size=32000,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        attention_bias=False,
        mlp_bias=False,
        pretraining_tp=1,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def _llama3(hidden: int, inter: int, layers: int, heads: int, factor: float, **more: Any) -> dict[str, Any]:
    # Llama 3.1 / 3.2: 128k vocab, 128k context through llama3 rope scaling of an 8k original.
    rope = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    return _decoder(
        "llama",
        hidden=hidden,
        inter=inter,
        layers=layers,
        heads=heads,
        kv=8,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=rope,
        attention_bias=False,
        mlp_bias=False,
        pretraining_tp=1,
        bos_token_id=128000,
        eos_token_id=128001,
        **more,
    )


def _mistral(vocab: int, rope_theta: float, sliding_window: int | None) -> dict[str, Any]:
    return _decoder(
        "mistral",
        hidden=4096,
        inter=14336,
        layers=32,
        heads=32,
        kv=8,
        vocab_size=vocab,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=rope_theta,
        sliding_window=sliding_window,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def _qwen25(
    hidden: int, inter: int, layers: int, heads: int, kv: int, positions: int, window_layers: int = 0
) -> dict[str, Any]:
    # Qwen/Qwen2.5-* base models: q/k/v biases; the small ones (<= 3B) tie the head to a 151936 vocab,
    # 7B and up have an untied head over 152064 rows. Sliding window is off.
    small = hidden <= 2048
    return _decoder(
        "qwen2",
        hidden=hidden,
        inter=inter,
        layers=layers,
        heads=heads,
        kv=kv,
        vocab_size=151936 if small else 152064,
        max_position_embeddings=positions,
        rms_norm_eps=1e-6 if hidden <= 3584 else 1e-5,
        rope_theta=1000000.0,
        use_sliding_window=False,
        sliding_window=positions,
        max_window_layers=window_layers or layers,
        tie_word_embeddings=small,
        bos_token_id=151643,
        eos_token_id=151643,
    )


def _qwen3(hidden: int, inter: int, layers: int, heads: int, tie: bool) -> dict[str, Any]:
    # Qwen/Qwen3-* dense: q/k RMSNorm, 128-wide heads, 8 kv heads, 40960 positions; <= 4B tie the head.
    return _decoder(
        "qwen3",
        hidden=hidden,
        inter=inter,
        layers=layers,
        heads=heads,
        kv=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        attention_bias=False,
        tie_word_embeddings=tie,
        bos_token_id=151643,
        eos_token_id=151645,
    )


def _qwen3_moe(hidden: int, expert_inter: int, layers: int, heads: int) -> dict[str, Any]:
    # Qwen/Qwen3-*-A*B: every layer is sparse, 128 routed experts, 8 per token, 4 kv heads, no shared expert.
    return _decoder(
        "qwen3_moe",
        hidden=hidden,
        inter=3 * expert_inter * 2,
        layers=layers,
        heads=heads,
        kv=4,
        head_dim=128,
        moe_intermediate_size=expert_inter,
        num_experts=128,
        num_experts_per_tok=8,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        vocab_size=151936,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
    )


def _gemma(
    model_type: str, hidden: int, inter: int, layers: int, heads: int, kv: int, head_dim: int, **more: Any
) -> dict[str, Any]:
    # google/gemma-2-* and the text models of gemma-3-*: tied head, GeGLU (tanh GELU), sandwich norms.
    return _decoder(
        model_type,
        hidden=hidden,
        inter=inter,
        layers=layers,
        heads=heads,
        kv=kv,
        head_dim=head_dim,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        **more,
    )


def _gemma3(hidden: int, inter: int, layers: int, heads: int, kv: int, head_dim: int) -> dict[str, Any]:
    return _gemma(
        "gemma3_text",
        hidden=hidden,
        inter=inter,
        layers=layers,
        heads=heads,
        kv=kv,
        head_dim=head_dim,
        vocab_size=262144 if hidden <= 1152 else 262208,
        max_position_embeddings=131072 if hidden > 1152 else 32768,
        sliding_window=512 if hidden <= 1152 else 1024,
        query_pre_attn_scalar=256 if head_dim == 256 else 168,
    )


def _phi3(
    hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, positions: int, **more: Any
) -> dict[str, Any]:
    # microsoft/Phi-3.5 and Phi-4: fused qkv_proj and gate_up_proj linears, untied head unless said.
    return _decoder(
        "phi3",
        hidden=hidden,
        inter=inter,
        layers=layers,
        heads=heads,
        kv=kv,
        vocab_size=vocab,
        max_position_embeddings=positions,
        rms_norm_eps=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        **more,
    )


def _smollm2(hidden: int, inter: int, layers: int, heads: int, kv: int) -> dict[str, Any]:
    # HuggingFaceTB/SmolLM2-*: Llama blocks, 49152 vocab, tied head, 8k context.
    return _decoder(
        "llama",
        hidden=hidden,
        inter=inter,
        layers=layers,
        heads=heads,
        kv=kv,
        vocab_size=49152,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )


CATALOG: tuple[Entry, ...] = (
    ("opt-125m", ("facebook/opt-125m",), _opt(768, 12, 12)),
    # opt-350m: post-LN (no final layer norm) and 512-wide token embeddings projected to 1024.
    (
        "opt-350m",
        ("facebook/opt-350m",),
        _opt(1024, 24, 16, word_embed_proj_dim=512, do_layer_norm_before=False),
    ),
    ("opt-1.3b", ("facebook/opt-1.3b",), _opt(2048, 24, 32)),
    ("opt-2.7b", ("facebook/opt-2.7b",), _opt(2560, 32, 32)),
    ("opt-6.7b", ("facebook/opt-6.7b",), _opt(4096, 32, 32)),
    ("opt-13b", ("facebook/opt-13b",), _opt(5120, 40, 40)),
    ("opt-30b", ("facebook/opt-30b",), _opt(7168, 48, 56)),
    ("opt-66b", ("facebook/opt-66b",), _opt(9216, 64, 72)),
    ("gpt2", ("gpt2-small", "openai-community/gpt2"), _gpt2(768, 12, 12)),
    ("gpt2-medium", ("openai-community/gpt2-medium",), _gpt2(1024, 24, 16)),
    ("gpt2-large", ("openai-community/gpt2-large",), _gpt2(1280, 36, 20)),
    ("gpt2-xl", ("openai-community/gpt2-xl",), _gpt2(1600, 48, 25)),
    (
        "llama-2-7b",
        ("llama2-7b", "llama-2-7b-hf", "meta-llama/Llama-2-7b-hf"),
        _llama2(4096, 11008, 32, 32, 32),
    ),
    (
        "llama-2-13b",
        ("llama2-13b", "llama-2-13b-hf", "meta-llama/Llama-2-13b-hf"),
        _llama2(5120, 13824, 40, 40, 40),
    ),
    (
        "llama-2-70b",
        ("llama2-70b", "llama-2-70b-hf", "meta-llama/Llama-2-70b-hf"),
        _llama2(8192, 28672, 80, 64, 8),
    ),
    # Llama 3.2 small models tie the head and give head_dim explicitly; "llama-3-1b"/"-3b" point here.
    (
        "llama-3.2-1b",
        ("llama-3-1b", "llama3.2-1b", "meta-llama/Llama-3.2-1B"),
        _llama3(2048, 8192, 16, 32, 32.0, head_dim=64, tie_word_embeddings=True),
    ),
    (
        "llama-3.2-3b",
        ("llama-3-3b", "llama3.2-3b", "meta-llama/Llama-3.2-3B"),
        _llama3(3072, 8192, 28, 24, 32.0, head_dim=128, tie_word_embeddings=True),
    ),
    # Llama 3 and 3.1 share shapes (3.0 had 8k context, no rope scaling): the 3.0 names alias 3.1.
    (
        "llama-3.1-8b",
        (
            "llama-3-8b",
            "llama3-8b",
            "llama3.1-8b",
            "meta-llama/Llama-3.1-8B",
            "meta-llama/Meta-Llama-3.1-8B",
            "meta-llama/Meta-Llama-3-8B",
        ),
        _llama3(4096, 14336, 32, 32, 8.0, tie_word_embeddings=False),
    ),
    (
        "llama-3.1-70b",
        (
            "llama-3-70b",
            "llama3-70b",
            "llama3.1-70b",
            "meta-llama/Llama-3.1-70B",
            "meta-llama/Meta-Llama-3.1-70B",
            "meta-llama/Meta-Llama-3-70B",
        ),
        _llama3(8192, 28672, 80, 64, 8.0, tie_word_embeddings=False),
    ),
    # "mistral-7b" is v0.1 (32000 vocab, 4096 sliding window); v0.3 (32768 vocab, no window) is separate.
    ("mistral-7b", ("mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1"), _mistral(32000, 10000.0, 4096)),
    ("mistral-7b-v0.3", ("mistralai/Mistral-7B-v0.3",), _mistral(32768, 1000000.0, None)),
    ("qwen2.5-0.5b", ("Qwen/Qwen2.5-0.5B",), _qwen25(896, 4864, 24, 14, 2, 32768)),
    ("qwen2.5-1.5b", ("Qwen/Qwen2.5-1.5B",), _qwen25(1536, 8960, 28, 12, 2, 131072, 21)),
    ("qwen2.5-3b", ("Qwen/Qwen2.5-3B",), _qwen25(2048, 11008, 36, 16, 2, 32768)),
    ("qwen2.5-7b", ("Qwen/Qwen2.5-7B",), _qwen25(3584, 18944, 28, 28, 4, 131072)),
    ("qwen2.5-14b", ("Qwen/Qwen2.5-14B",), _qwen25(5120, 13824, 48, 40, 8, 131072)),
    ("qwen2.5-32b", ("Qwen/Qwen2.5-32B",), _qwen25(5120, 27648, 64, 40, 8, 131072)),
    ("qwen2.5-72b", ("Qwen/Qwen2.5-72B",), _qwen25(8192, 29568, 80, 64, 8, 131072)),
    # Llama 3.3 70B has the 3.1 70B shape.
    (
        "llama-3.3-70b",
        ("llama3.3-70b", "meta-llama/Llama-3.3-70B-Instruct"),
        _llama3(8192, 28672, 80, 64, 8.0, tie_word_embeddings=False),
    ),
    ("qwen3-0.6b", ("Qwen/Qwen3-0.6B",), _qwen3(1024, 3072, 28, 16, True)),
    ("qwen3-1.7b", ("Qwen/Qwen3-1.7B",), _qwen3(2048, 6144, 28, 16, True)),
    ("qwen3-4b", ("Qwen/Qwen3-4B",), _qwen3(2560, 9728, 36, 32, True)),
    ("qwen3-8b", ("Qwen/Qwen3-8B",), _qwen3(4096, 12288, 36, 32, False)),
    ("qwen3-14b", ("Qwen/Qwen3-14B",), _qwen3(5120, 17408, 40, 40, False)),
    ("qwen3-32b", ("Qwen/Qwen3-32B",), _qwen3(5120, 25600, 64, 64, False)),
    ("qwen3-30b-a3b", ("Qwen/Qwen3-30B-A3B",), _qwen3_moe(2048, 768, 48, 32)),
    ("qwen3-235b-a22b", ("Qwen/Qwen3-235B-A22B",), _qwen3_moe(4096, 1536, 94, 64)),
    (
        "gemma-2-2b",
        ("google/gemma-2-2b",),
        _gemma("gemma2", 2304, 9216, 26, 8, 4, 256, vocab_size=256000, max_position_embeddings=8192),
    ),
    (
        "gemma-2-9b",
        ("google/gemma-2-9b",),
        _gemma("gemma2", 3584, 14336, 42, 16, 8, 256, vocab_size=256000, max_position_embeddings=8192),
    ),
    (
        "gemma-2-27b",
        ("google/gemma-2-27b",),
        _gemma("gemma2", 4608, 36864, 46, 32, 16, 128, vocab_size=256000, max_position_embeddings=8192),
    ),
    # Gemma 3: the 1B is text only; 4B and up are the text model of the multimodal checkpoint.
    ("gemma-3-1b", ("google/gemma-3-1b-pt",), _gemma3(1152, 6912, 26, 4, 1, 256)),
    ("gemma-3-4b", ("google/gemma-3-4b-pt",), _gemma3(2560, 10240, 34, 8, 4, 256)),
    ("gemma-3-12b", ("google/gemma-3-12b-pt",), _gemma3(3840, 15360, 48, 16, 8, 256)),
    ("gemma-3-27b", ("google/gemma-3-27b-pt",), _gemma3(5376, 21504, 62, 32, 16, 128)),
    (
        "phi-3.5-mini",
        ("microsoft/Phi-3.5-mini-instruct",),
        _phi3(3072, 8192, 32, 32, 32, 32064, 131072, tie_word_embeddings=False),
    ),
    ("phi-4", ("microsoft/phi-4",), _phi3(5120, 17920, 40, 40, 10, 100352, 16384, tie_word_embeddings=False)),
    (
        "phi-4-mini",
        ("microsoft/Phi-4-mini-instruct",),
        _phi3(3072, 8192, 32, 24, 8, 200064, 131072, tie_word_embeddings=True, partial_rotary_factor=0.75),
    ),
    (
        "mixtral-8x7b",
        ("mistralai/Mixtral-8x7B-v0.1",),
        _decoder(
            "mixtral",
            hidden=4096,
            inter=14336,
            layers=32,
            heads=32,
            kv=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            vocab_size=32000,
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            sliding_window=None,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # DeepSeek-R1 distills: Qwen2.5-Math / Qwen2.5 and Llama 3.1 / 3.3 shapes.
    (
        "deepseek-r1-distill-qwen-1.5b",
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",),
        _qwen25(1536, 8960, 28, 12, 2, 131072) | {"tie_word_embeddings": False},
    ),
    (
        "deepseek-r1-distill-qwen-7b",
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",),
        _qwen25(3584, 18944, 28, 28, 4, 131072),
    ),
    (
        "deepseek-r1-distill-qwen-14b",
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",),
        _qwen25(5120, 13824, 48, 40, 8, 131072),
    ),
    (
        "deepseek-r1-distill-qwen-32b",
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",),
        _qwen25(5120, 27648, 64, 40, 8, 131072),
    ),
    (
        "deepseek-r1-distill-llama-8b",
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B",),
        _llama3(4096, 14336, 32, 32, 8.0, tie_word_embeddings=False),
    ),
    (
        "deepseek-r1-distill-llama-70b",
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B",),
        _llama3(8192, 28672, 80, 64, 8.0, tie_word_embeddings=False),
    ),
    ("smollm2-135m", ("HuggingFaceTB/SmolLM2-135M",), _smollm2(576, 1536, 30, 9, 3)),
    ("smollm2-360m", ("HuggingFaceTB/SmolLM2-360M",), _smollm2(960, 2560, 32, 15, 5)),
    ("smollm2-1.7b", ("HuggingFaceTB/SmolLM2-1.7B",), _smollm2(2048, 8192, 24, 32, 32)),
    (
        "smollm3-3b",
        ("HuggingFaceTB/SmolLM3-3B",),
        _decoder(
            "smollm3",
            hidden=2048,
            inter=11008,
            layers=36,
            heads=16,
            kv=4,
            vocab_size=128256,
            max_position_embeddings=65536,
            rms_norm_eps=1e-6,
            rope_theta=5000000.0,
            tie_word_embeddings=True,
            no_rope_layer_interval=4,
            bos_token_id=128000,
            eos_token_id=128012,
        ),
    ),
)
