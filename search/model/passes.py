"""Seconds of a model's forward, backward and decoding passes (:mod:`search.model.roofline` on the op
inventory of :mod:`search.model.kernels`). Cached on their hashable arguments."""

from __future__ import annotations

from functools import lru_cache

from search.coefficients import Coefficients
from search.model.kernels import (
    BACKWARD_KERNELS_PER_FORWARD,
    GENERATE_STEP_KERNELS,
    HEAD_AND_LOSS_KERNELS,
    KV_UPDATE_KERNELS,
    head_and_loss_kernels,
    head_gemm,
    layer_elementwise_bytes,
    layer_gemms,
    layer_kernels,
    layers_attention_flops,
    loss_bytes,
    rmsnorms_per_layer,
)
from search.model.roofline import (
    PassSeconds,
    backward_gemms,
    gemm_seconds,
    hbm_seconds,
    host_seconds,
    matmul_rate,
)
from search.model.shapes import kv_tokens_held, linear_shapes, uses_rmsnorm
from store.loss_chunks import chunk_count
from store.records import DTYPE_BYTES, GPUSpec, ModelSpec


def _pass(
    model: ModelSpec,
    sequences: int,
    seq_len: int,
    dtype: str,
    gpu: GPUSpec,
    coef: Coefficients,
    *,
    lora_rank: int,
    lm_head: bool,
    backward: bool,
    loss: bool,
) -> PassSeconds:
    """A forward, or the backward of one: every product (the backward's are each forward product's input and
    weight gradients), attention (the backward 2.5 x its forward: FlashAttention-2), the element-wise traffic
    (twice the forward's in the backward), the loss over the logits, and the kernels to issue (twice the
    forward's in the backward)."""
    d, tokens, layers = DTYPE_BYTES[dtype], sequences * seq_len, model.num_layers
    products = [*layer_gemms(model, tokens, lora_rank)]
    head = [head_gemm(model, tokens, lora_rank, lm_head)]
    if backward:
        products = [b for g in products for b in backward_gemms(g)]
        head = [b for g in head for b in backward_gemms(g)]
    repeat = 2 if backward else 1
    matmul = layers * sum(gemm_seconds(g, dtype, gpu) for g in products)
    matmul += sum(gemm_seconds(g, dtype, gpu) for g in head)
    attention_share = 2.5 if backward else 1.0
    attention = attention_share * layers_attention_flops(model, sequences, seq_len)
    attention /= matmul_rate(model.head_dim, dtype, gpu)
    elementwise = repeat * layers * hbm_seconds(layer_elementwise_bytes(model, tokens, d, lora_rank), gpu)
    loss_s = hbm_seconds(loss_bytes(model, tokens, d)[int(backward)], gpu) if (loss and lm_head) else 0.0
    kernels = (BACKWARD_KERNELS_PER_FORWARD if backward else 1.0) * (
        layers * layer_kernels(model, lora_rank) + head_and_loss_kernels(model)
    )
    return PassSeconds(
        gpu={"matmul": matmul, "attention": attention, "elementwise": elementwise, "loss": loss_s},
        host={"host_launch": host_seconds(kernels, coef)},
    )


@lru_cache(maxsize=4096)
def forward_pass(
    model: ModelSpec,
    sequences: int,
    seq_len: int,
    dtype: str,
    gpu: GPUSpec,
    coef: Coefficients,
    *,
    lora_rank: int = 0,
    lm_head: bool = True,
    loss: bool = True,
) -> PassSeconds:
    """One forward over ``sequences`` x ``seq_len`` tokens: the layers, the head and (``loss``) HF's loss
    or an RLHF log-softmax over the logits."""
    return _pass(
        model, sequences, seq_len, dtype, gpu, coef, lora_rank=lora_rank, lm_head=lm_head, backward=False, loss=loss
    )


@lru_cache(maxsize=4096)
def chunked_loss_extra(
    model: ModelSpec, sequences: int, seq_len: int, dtype: str, gpu: GPUSpec, coef: Coefficients, lora_rank: int
) -> PassSeconds:
    """What a chunked loss (``loss: "chunked"``, ``probes.model.chunked_loss``) adds to a micro-step's backward: the
    LM head's product and the loss's forward traffic once more (each chunk's logits are recomputed in the
    backward), and the head-and-loss kernels of every chunk beyond the first, forward and backward."""
    tokens = sequences * seq_len
    chunks = chunk_count(tokens, model.vocab_size, model.hidden_size)
    recompute = gemm_seconds(head_gemm(model, tokens, lora_rank, True), dtype, gpu)
    traffic = hbm_seconds(loss_bytes(model, tokens, DTYPE_BYTES[dtype])[0], gpu)
    kernels = (chunks - 1) * HEAD_AND_LOSS_KERNELS * (1 + BACKWARD_KERNELS_PER_FORWARD) + HEAD_AND_LOSS_KERNELS
    return PassSeconds(
        gpu={"matmul": recompute, "loss": traffic}, host={"host_launch": host_seconds(int(kernels), coef)}
    )


@lru_cache(maxsize=4096)
def fused_head_extra(
    model: ModelSpec, sequences: int, seq_len: int, dtype: str, gpu: GPUSpec, lora_rank: int
) -> PassSeconds:
    """What TRL's fused log-prob head (``search.model.fused_head``) adds to a micro-step's backward: its
    backward recomputes every tile's projection (``torch.mm(hidden_chunk, w_chunk.t(), out=tile)`` in
    ``ChunkedLogProbFunction.backward``), one more LM-head product over the tokens."""
    recompute = gemm_seconds(head_gemm(model, sequences * seq_len, lora_rank, True), dtype, gpu)
    return PassSeconds(gpu={"matmul": recompute})


@lru_cache(maxsize=4096)
def backward_pass(
    model: ModelSpec,
    sequences: int,
    seq_len: int,
    dtype: str,
    gpu: GPUSpec,
    coef: Coefficients,
    *,
    lora_rank: int = 0,
    lm_head: bool = True,
) -> PassSeconds:
    """One backward with the loss's, without the recompute of checkpointed layers and DeepSpeed's hooks."""
    return _pass(
        model, sequences, seq_len, dtype, gpu, coef, lora_rank=lora_rank, lm_head=lm_head, backward=True, loss=True
    )


def trainable_tensors(model: ModelSpec, lora_rank: int, *, lm_head: bool = True) -> int:
    """Parameter tensors the optimizer steps (DeepSpeed's hooks and step loops walk them one by one).

    Full fine-tuning: every linear's weight (and bias where the family has one: OPT and GPT-2 everywhere,
    Qwen2 on q/k/v), the norms' weights (and LayerNorm biases; Gemma 3's six and Qwen3's four RMSNorms a layer,
    :func:`search.model.kernels.rmsnorms_per_layer`), the embeddings and the final norm; LoRA:
    two adapter matrices per block linear.
    """
    linears = len(linear_shapes(model))
    if lora_rank:
        return model.num_layers * 2 * linears
    biased = {"opt": linears, "gpt2": linears, "qwen2": 3}.get(model.model_type, 0)
    norm_tensors = 1 if uses_rmsnorm(model) else 2
    per_layer = linears + biased + (rmsnorms_per_layer(model) or 2) * norm_tensors
    embeddings = 1 if uses_rmsnorm(model) else 2  # token (and learned position) embeddings
    head = 0 if (model.tie_word_embeddings or not lm_head) else 1
    return model.num_layers * per_layer + embeddings + norm_tensors + head


@lru_cache(maxsize=4096)
def decode_step(
    model: ModelSpec, sequences: int, context: float, dtype: str, gpu: GPUSpec, coef: Coefficients
) -> PassSeconds:
    """One token of HF generate for ``sequences`` sequences over ``context`` cached tokens (on average).

    The GPU reads every weight and the KV cache once (bandwidth-bound at small batches) and runs each kernel
    at least ``kernel_floor_s``; the host issues every layer's kernels, the cache update and generate's own
    per-token work (:mod:`search.model.kernels`). DeepSpeed 0.19's hybrid engine finds no inference policy
    for transformers' Cache-based decoders and runs this same path (hybrid_engine.py
    populate_all_inference_policies).
    """
    d = DTYPE_BYTES[dtype]
    weights = d * (model.num_layers * model.layer_params + model.vocab_size * model.hidden_size)
    kv = kv_tokens_held(model, context) * sequences * model.kv_elements_per_token * d
    kernels = model.num_layers * (layer_kernels(model, 0) + KV_UPDATE_KERNELS) + GENERATE_STEP_KERNELS
    gpu_s = max(hbm_seconds(weights + kv, gpu), kernels * gpu.kernel_floor_s)
    return PassSeconds(gpu={"weights_and_kv_read": gpu_s}, host={"host_launch": host_seconds(kernels, coef)})
