"""The tensor-parallel sizes a rollout engine accepts for a model: each rule one of the engine's own checks, which
stop the engine at start (a ValueError or an AssertionError while it builds the model).

vLLM 0.19.1 (the PyPI wheel read by :mod:`search.rollout.vllm_rules`):

1. Attention heads: ``vllm/config/model.py`` ``ModelConfig.verify_with_parallel_config`` raises "Total number of
   attention heads (H) must be divisible by tensor parallel size (T)" unless ``num_attention_heads % T == 0``.
2. KV heads: ``vllm/model_executor/layers/linear.py`` ``QKVParallelLinear.__init__``: with ``T >= kv_heads`` each
   rank holds one KV head, replicated ``divide(T, kv_heads)`` times, else ``divide(kv_heads, T)`` heads a rank;
   ``divide`` (``vllm/distributed/utils.py``, ``ensure_divisibility``) asserts the division is exact.
3. MLP width: ``MergedColumnParallelLinear.__init__`` asserts ``output_size % tp_size == 0`` for gate and up
   (``intermediate_size``), and ``RowParallelLinear`` divides the down projection's input the same way.
4. Vocabulary: ``vllm/model_executor/layers/vocab_parallel_embedding.py`` pads the vocabulary to a multiple of
   ``DEFAULT_VOCAB_PADDING_SIZE`` (64) before ``divide``-ing it over the ranks, so any T dividing 64 is accepted.

SGLang 0.5.23: its models build the same layers (``python/sglang/srt/layers/linear.py``: ``QKVParallelLinear``,
``MergedColumnParallelLinear`` with the same ``divide`` and assertion; ``vocab_parallel_embedding.py`` padding to
64), and each attention module asserts the head rules itself, e.g. ``python/sglang/srt/models/qwen2.py``
``Qwen2Attention.__init__``: ``assert self.total_num_heads % tp_size == 0``, then ``assert
self.total_num_kv_heads % tp_size == 0`` when ``total_num_kv_heads >= tp_size``, else ``assert tp_size %
self.total_num_kv_heads == 0`` (``llama.py`` and the other dense models alike).

Mixture-of-experts models are held to the attention rules; their expert width (``moe_intermediate_size``) is
checked where the config names it, as the fused-MoE layer splits it over the ranks the same way.
"""

from __future__ import annotations

from store.records import ModelSpec

VOCAB_PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE (vLLM and SGLang vocab_parallel_embedding.py)
ENGINE_LABELS: dict[str, str] = {"vllm": "vLLM", "sglang": "SGLang"}


def _padded_vocab(vocab_size: int) -> int:
    return -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING  # pad_vocab_size


def tensor_parallel_refusal(engine: str, model: ModelSpec, tensor_parallel: int) -> str | None:
    """Why ``engine`` ("vllm" or "sglang") refuses ``model`` at ``tensor_parallel`` GPUs a replica, in the
    engine's own words where it has them; None when it accepts it. The two engines share the rules (see the
    module docstring); the message names the engine and the check."""
    label, tp = ENGINE_LABELS.get(engine, engine), tensor_parallel
    if tp < 1:
        return f"{label} needs a tensor-parallel size of at least 1, not {tp}"
    if tp == 1:
        return None
    heads, kv_heads = model.num_heads, model.num_kv_heads
    if heads % tp:
        return (
            f"{label} refuses tensor parallel {tp} for {model.name}: Total number of attention heads ({heads}) must be "
            f"divisible by tensor parallel size ({tp}) (ModelConfig.verify_with_parallel_config)"
        )
    if kv_heads > 0 and ((kv_heads % tp) if kv_heads >= tp else (tp % kv_heads)):
        return (
            f"{label} refuses tensor parallel {tp} for {model.name}: its {kv_heads} KV heads are neither split evenly "
            f"over {tp} GPUs nor replicated a whole number of times (QKVParallelLinear)"
        )
    widths = {"intermediate_size": model.intermediate_size} if not model.num_experts else {}
    moe_width = model.hf_config.get("moe_intermediate_size") if model.num_experts else None
    if isinstance(moe_width, int) and moe_width > 0:
        widths["moe_intermediate_size"] = moe_width
    for name, width in widths.items():
        if width % tp:
            return (
                f"{label} refuses tensor parallel {tp} for {model.name}: its {name} {width} does not divide by {tp} "
                "(MergedColumnParallelLinear / RowParallelLinear)"
            )
    if _padded_vocab(model.vocab_size) % tp:
        return (
            f"{label} refuses tensor parallel {tp} for {model.name}: its vocabulary padded to "
            f"{_padded_vocab(model.vocab_size)} does not divide by {tp} (VocabParallelEmbedding)"
        )
    return None


def accepted_tensor_parallel(engine: str, model: ModelSpec, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The sizes of ``sizes`` that ``engine`` accepts for ``model`` (:func:`tensor_parallel_refusal`)."""
    return tuple(tp for tp in sizes if tensor_parallel_refusal(engine, model, tp) is None)
