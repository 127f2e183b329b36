"""Counts derived from a model's shape: trainable parameters under LoRA, linear shapes, dropout, largest module.

Pure functions of ModelSpec; no torch.
"""

from __future__ import annotations

from store.records import ModelSpec


def linear_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) of every linear layer in one decoder block: where LoRA adapters go ("all-linear")."""
    h, i = model.hidden_size, model.intermediate_size
    q_dim = model.num_heads * model.head_dim
    kv_dim = model.num_kv_heads * model.head_dim
    attention = [(h, q_dim), (h, kv_dim), (h, kv_dim), (q_dim, h)]
    mlp = [(h, i), (h, i), (i, h)] if model.gated_mlp else [(h, i), (i, h)]
    return attention + mlp


def lora_params(model: ModelSpec, rank: int) -> int:
    """Parameters of rank-``rank`` LoRA adapters (A: in x r, B: r x out) on every block linear."""
    if rank <= 0:
        return 0
    if model.lora_in_out:  # traced: every nn.Linear of every decoder layer (fused experts take no adapters)
        return rank * model.lora_in_out
    return model.num_layers * sum(rank * (n_in + n_out) for n_in, n_out in linear_shapes(model))


def trainable_params(model: ModelSpec, lora_rank: int, *, lm_head: bool = True) -> int:
    """Parameters the optimizer updates: all of them, or only the LoRA adapters."""
    if lora_rank > 0:
        return lora_params(model, lora_rank)
    return model.total_params if lm_head else model.backbone_params + model.hidden_size


def resident_params(model: ModelSpec, lora_rank: int, *, lm_head: bool = True) -> int:
    """Parameters held on the device: the model (with or without LM head) plus any adapters."""
    base = model.total_params if lm_head else model.backbone_params + model.hidden_size
    return base + lora_params(model, lora_rank)


def largest_module_params(model: ModelSpec) -> int:
    """Parameters of the largest single module (DeepSpeed's ``largest_layer_params``).

    DeepSpeed's ZeRO-3 estimator walks ``model.modules()`` and takes the largest direct parameter count,
    which for language models is the token embedding (or an untied LM head), and for mixture-of-experts
    models with fused expert weights the experts of one layer. A traced shape holds the walk's own answer.
    """
    if model.largest_module:
        return model.largest_module
    embed_dim = int(model.hf_config.get("word_embed_proj_dim") or model.hidden_size)
    candidates = [model.vocab_size * embed_dim, model.hidden_size * model.intermediate_size]
    if model.lm_head_params:
        candidates.append(model.lm_head_params)
    return max(candidates)


def token_embedding_params(model: ModelSpec) -> int:
    """Parameters of the token embedding (vocabulary x embedding width; OPT's word_embed_proj_dim)."""
    embed_dim = int(model.hf_config.get("word_embed_proj_dim") or model.hidden_size)
    return model.vocab_size * embed_dim


def largest_trainable_tensor(model: ModelSpec, lora_rank: int, *, lm_head: bool = True) -> int:
    """Elements of the largest trainable parameter tensor: DeepSpeed takes gradient norms tensor by tensor.

    Full fine-tuning: the token embedding, an untied LM head or one MLP matrix; LoRA: the largest adapter
    matrix (rank x the wider side of a block linear).
    """
    if lora_rank > 0:
        widest = model.lora_widest or max(max(n_in, n_out) for n_in, n_out in linear_shapes(model))
        return lora_rank * widest
    candidates = [token_embedding_params(model), model.hidden_size * model.intermediate_size]
    if lm_head and model.lm_head_params:
        candidates.append(model.lm_head_params)
    return max(candidates)


def dropout_probs(model: ModelSpec) -> tuple[float, float]:
    """(attention-probability dropout, residual/hidden dropout) from the transformers config."""
    cfg = model.hf_config
    if model.model_type == "gpt2":
        return float(cfg.get("attn_pdrop", 0.1)), float(cfg.get("resid_pdrop", 0.1))
    if model.model_type == "opt":
        return float(cfg.get("attention_dropout", 0.0)), float(cfg.get("dropout", 0.1))
    return float(cfg.get("attention_dropout", 0.0)), float(cfg.get("hidden_dropout", 0.0))


def uses_rmsnorm(model: ModelSpec) -> bool:
    """Llama-style RMSNorm (fp32 upcast inside) rather than LayerNorm."""
    return model.model_type not in ("opt", "gpt2")


def kv_tokens_held(model: ModelSpec, tokens: float, *, prefill: bool = False) -> float:
    """Tokens of K and V that transformers' DynamicCache holds over all layers after ``tokens`` tokens: every
    token in a full-attention layer, the last ``W`` in a sliding-window layer (its cache keeps a view of the
    newest ``W`` tokens of each update's concatenation), none in a layer that reuses another's. Right after the
    prefill a sliding layer's view still holds the whole prompt's storage (``prefill``)."""
    if not model.kv_windows:
        return model.num_layers * tokens
    held = 0.0
    for window in model.kv_windows:
        if window == 0 or (window > 0 and prefill):
            held += tokens
        elif window > 0:
            held += min(tokens, window)
    return held


def sliding_window_layers(model: ModelSpec) -> tuple[int, int | None]:
    """(decoder layers that attend through a sliding window, the window in tokens), as transformers' configs
    lay them out: an explicit ``layer_types``; Gemma 3, every layer but each ``sliding_window_pattern``-th (6);
    Gemma 2, every other layer; Qwen2 with ``use_sliding_window``, the layers from ``max_window_layers`` on;
    Mistral and Mixtral, every layer where ``sliding_window`` is set. (0, None) for the others."""
    config, layers = model.hf_config, model.num_layers
    window = config.get("sliding_window")
    if not window:
        return 0, None
    types = config.get("layer_types")
    if types:
        return sum(1 for kind in types if kind == "sliding_attention"), int(window)
    family = model.model_type
    if family in ("gemma3", "gemma3_text"):
        pattern = int(config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6)
        return sum(1 for i in range(layers) if (i + 1) % pattern), int(window)
    if family == "gemma2":
        return sum(1 for i in range(layers) if (i + 1) % 2), int(window)
    if family in ("qwen2", "qwen3") and config.get("use_sliding_window"):
        return max(0, layers - int(config.get("max_window_layers") or layers)), int(window)
    if family in ("mistral", "mixtral"):
        return layers, int(window)
    return 0, None
