"""What one pass of a decoder model launches on the GPU: matrix products, bytes of element-wise traffic, kernels.

Counted from transformers' eager model code (one decoder layer of each family) and peft's LoRA ``Linear``;
the time model (:mod:`search.model.roofline`) turns them into seconds. Pure functions of ModelSpec.

Kernels per layer forward, read off the layer's ``forward`` in transformers 5.x:
- OPT: layer norm, q/k/v/out ``addmm``, q scaling, sdpa, head-merge copy, dropout, residual add, layer
  norm, fc1, ReLU, fc2, dropout, residual add: 16.
- GPT-2: layer norm, ``c_attn``, sdpa, merge copy, ``c_proj``, dropout, add, layer norm, ``c_fc``,
  ``gelu_new`` (8 element-wise ops: pow, mul, add, mul, tanh, add, mul, mul), ``c_proj``, dropout, add: 20.
- Llama, Mistral, Qwen2 (RMSNorm, rotary, GQA sdpa, SwiGLU): two RMSNorms of 8 ops (fp32 upcast, pow, mean,
  add, rsqrt, mul, downcast, weight), q/k/v ``mm``, rotary on q and k (5 ops each: mul cos, neg, cat, mul
  sin, add), sdpa, merge copy, ``o_proj``, add, gate/up ``mm``, SiLU, mul, down ``mm``, add: 39.
- Families with more RMSNorms per layer (:data:`RMSNORMS_PER_LAYER`) take the Llama count with their own norms
  in place of its two: Qwen3 adds q_norm and k_norm (4 x 8 ops: 55); Gemma 3 runs six (input, post-attention,
  pre- and post-feedforward, q_norm, k_norm) of 10 ops each, its RMSNorm upcasting the weight and adding 1
  (``weight.float()``, ``1.0 + w``, then ``type_as``): 83; Gemma 2 four such (63). Outside the layers Gemma 3
  launches about 64 kernels (the scaled embedding, a global and a local rotary table, a full and a sliding
  mask, its 10-op final norm, the head and HF's loss; :data:`OUTSIDE_KERNELS`). Counted against an H200 profile
  of gemma-3-1b (2,266 forward launches; 26 x 83 + 64 = 2,222; benchmarks/results/host_kernels_h200.md).
- peft LoRA on a linear: ``lora_A``, ``lora_B``, the scaling and the add (dropout 0 is Identity): 4.
Autograd's backward launches about two kernels per forward kernel (a ``mm`` becomes the input and weight
gradient products, an ``addmm`` adds the bias sum, each element-wise op one or two).

Which kernel sdpa runs on a GPU of a given compute capability and dtype (:func:`sdpa_kernel`; docs/gpus.md), and
what the memory-efficient and math kernels save where they differ from the traced one (:func:`with_lse_padding`,
:func:`math_sdpa_saved`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search.model.shapes import dropout_probs, linear_shapes, sliding_window_layers, uses_rmsnorm
from store.records import Hardware, ModelSpec

LAYER_KERNELS = {"opt": 16, "gpt2": 20}
LLAMA_LAYER_KERNELS = 39  # llama, mistral, qwen2 and the other RMSNorm/rotary/SwiGLU decoders
# RMSNorms per decoder layer (Llama's two elsewhere) and the ops of each (Llama's eight elsewhere): see above
RMSNORMS_PER_LAYER = {"gemma3_text": 6, "gemma3": 6, "gemma2": 4, "qwen3": 4, "qwen3_moe": 4}
RMSNORM_KERNELS = {"gemma3_text": 10, "gemma3": 10, "gemma2": 10}
LLAMA_RMSNORMS, LLAMA_RMSNORM_KERNELS = 2, 8
OUTSIDE_KERNELS = {"gemma3_text": 64, "gemma3": 64}  # the families that launch more than HEAD_AND_LOSS_KERNELS
LORA_KERNELS_PER_LINEAR = 4
BACKWARD_KERNELS_PER_FORWARD = 2.0
# Outside the layers: embedding, position ids/mask, final norm, LM head and HF's loss (float upcast,
# log-softmax, nll, shift/pad of the labels), about 20 kernels; a value head instead of the LM head about 6.
HEAD_AND_LOSS_KERNELS = 20
# One decoding step of HF generate beyond the layers: the LM head on the last token, logits processors,
# sampling (softmax, multinomial), stopping criteria, attention mask and cache-position updates.
GENERATE_STEP_KERNELS = 30
# A decoding step of a layer launches the forward's kernels plus the KV cache's update (DynamicCache:
# one torch.cat for keys and one for values).
KV_UPDATE_KERNELS = 2


@dataclass(frozen=True)
class Gemm:
    """One matrix product of a pass: (m, n, k) with m the tokens, and how many of it per layer."""

    m: int
    n: int
    k: int
    trainable: bool  # the weight takes a gradient (a weight-gradient product in the backward)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def rmsnorms_per_layer(model: ModelSpec) -> int:
    """RMSNorm modules in one decoder layer of an RMSNorm family (0 for LayerNorm families)."""
    if not uses_rmsnorm(model) or model.model_type in LAYER_KERNELS:
        return 0
    return RMSNORMS_PER_LAYER.get(model.model_type, LLAMA_RMSNORMS)


def head_and_loss_kernels(model: ModelSpec) -> int:
    """Kernels a forward launches outside the decoder layers (embedding, masks, final norm, head and loss)."""
    return OUTSIDE_KERNELS.get(model.model_type, HEAD_AND_LOSS_KERNELS)


def layer_kernels(model: ModelSpec, lora_rank: int) -> int:
    """Kernels one decoder layer's forward launches (see the module docstring for the counts)."""
    base = LAYER_KERNELS.get(model.model_type, LLAMA_LAYER_KERNELS if uses_rmsnorm(model) else 16)
    norms = rmsnorms_per_layer(model)
    if norms:  # the family's own norms in place of Llama's two
        per_norm = RMSNORM_KERNELS.get(model.model_type, LLAMA_RMSNORM_KERNELS)
        base += norms * per_norm - LLAMA_RMSNORMS * LLAMA_RMSNORM_KERNELS
    if not dropout_probs(model)[1] and model.model_type in LAYER_KERNELS:
        base -= 2  # no residual dropout kernels
    lora = LORA_KERNELS_PER_LINEAR * len(linear_shapes(model)) if lora_rank else 0
    return base + lora


@lru_cache(maxsize=1024)
def layer_gemms(model: ModelSpec, tokens: int, lora_rank: int) -> tuple[Gemm, ...]:
    """The matrix products of one decoder layer's forward over ``tokens`` tokens (LoRA adapters included)."""
    full = lora_rank == 0
    out = [Gemm(tokens, n_out, n_in, full) for n_in, n_out in linear_shapes(model)]
    if lora_rank:
        for n_in, n_out in linear_shapes(model):
            out.append(Gemm(tokens, lora_rank, n_in, True))
            out.append(Gemm(tokens, n_out, lora_rank, True))
    return tuple(out)


def head_gemm(model: ModelSpec, tokens: int, lora_rank: int, lm_head: bool) -> Gemm:
    """The LM head (vocabulary logits) or a value head's product; trained unless LoRA freezes the base."""
    n = model.vocab_size if lm_head else 1
    return Gemm(tokens, n, model.hidden_size, lora_rank == 0)


def layer_elementwise_bytes(model: ModelSpec, tokens: int, dtype_bytes: int, lora_rank: int) -> float:
    """HBM bytes the element-wise kernels of one layer's forward read and write (norms, rotary, activation,
    dropout, residual adds, the sdpa kernel's inputs and output, LoRA's scaled adds).

    Counted in tensors of ``tokens x hidden`` read or written: a LayerNorm reads and writes one (2), an
    RMSNorm's eight ops with their fp32 intermediates about 18, rotary on q and k about 10 (GQA), a residual
    add 3, dropout 2 plus its mask, the MLP's activation over the intermediate width 2 (ReLU, GELU) or 5
    (SiLU and the gate product), sdpa's q, k, v reads and output write 4 and the head-merge copy 2.
    """
    h, i = model.hidden_size, model.intermediate_size
    unit = tokens * h * dtype_bytes
    width = i / h
    if uses_rmsnorm(model):
        units = 2 * 18 + 10 + 4 + 2 + 2 * 3 + 5 * width
    else:
        attn_p, hidden_p = dropout_probs(model)
        dropout = 2.5 * 2 if hidden_p else 0.0
        # ReLU reads and writes once; gelu_new's eight ops over the intermediate width read 10 and write 8
        activation = 2 * width if model.model_type == "opt" else 18 * width
        units = 2 * 2 + 2 + 4 + 2 + 2 * 3 + dropout + activation
    if lora_rank:
        outputs = sum(n_out for _, n_out in linear_shapes(model)) / h
        units += 3 * outputs  # result + lora_B(...) * scaling: a scaled product and an add over each output
    return units * unit


def attention_flops(model: ModelSpec, sequences: int, seq_len: int) -> float:
    """Forward FLOPs of the attention kernel (QK^T and PV) of one layer with a causal mask: the fused
    kernels (sdpa's flash/cuDNN paths) skip the masked half."""
    return 0.5 * 4.0 * sequences * seq_len * seq_len * model.num_heads * model.head_dim


def layers_attention_flops(model: ModelSpec, sequences: int, seq_len: int) -> float:
    """Forward FLOPs of every layer's sdpa attention kernel. A full-attention layer is causal without a mask
    (transformers passes ``is_causal``: flash skips the masked half, :func:`attention_flops`). A sliding-window
    layer at ``seq_len`` of at least its window gets an explicit mask (``masking_utils._ignore_causal_mask_sdpa``
    returns False once ``kv_length >= local_attention_size``): sdpa then runs the memory-efficient kernel with the
    mask as a bias and ``is_causal=False``, which computes every query-key block, twice the causal half."""
    half = attention_flops(model, sequences, seq_len)
    sliding, window = sliding_window_layers(model)
    masked = sliding if window is not None and seq_len >= window else 0
    return (model.num_layers - masked) * half + masked * 2.0 * half


# PyTorch's sdpa kernels on CUDA (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, can_use_flash_attention
# and can_use_mem_efficient_attention); the dispatcher takes the first that applies in this order.
SDPA_KERNELS = ("flash", "efficient", "math")
# What ``attn_impl`` names a resolved sdpa kernel by, where it differs from what the traced ``sdpa`` terms were traced
# with (probes.trace.activations routes 16-bit sdpa without a mask to the flash kernel, fp32 to the memory-efficient
# one); "sdpa" itself stays the traced kernel, so GPUs that run it predict as before.
SDPA_EFFICIENT = "sdpa-efficient"
SDPA_MATH = "sdpa-math"


def sdpa_kernel(
    compute_capability: tuple[int, int] | None,
    dtype: str,
    head_dim: int,
    *,
    masked: bool = False,
    training: bool = True,
) -> str:
    """The kernel ``F.scaled_dot_product_attention`` runs on a CUDA GPU of ``compute_capability``: ``"flash"``,
    ``"efficient"`` (memory-efficient, from xformers' CUTLASS kernels) or ``"math"`` (plain ops that materialise
    the b x heads x s x s scores and their softmax).

    As PyTorch's sdp_utils.cpp checks them:
    - flash: sm80 to sm121; fp16 or bf16; head_dim a multiple of 8 and at most 256; no explicit mask (``masked``);
      not a trained head_dim over 192 on sm86-sm89 (its backward refuses those);
    - memory-efficient: sm50 and up; fp16 or fp32 (bf16 too from sm80); head_dim a multiple of the GEMM
      alignment (8 for 16-bit inputs, 4 for fp32 from sm80, 1 for fp32 before); a mask allowed;
    - otherwise the math path.
    An unknown compute capability (None) is taken as a current GPU (sm90).
    """
    cc = compute_capability or (9, 0)
    half = dtype in ("fp16", "bf16")
    flash = (8, 0) <= cc <= (12, 1) and half and head_dim % 8 == 0 and head_dim <= 256 and not masked
    if flash and training and head_dim > 192 and (8, 6) <= cc <= (8, 9):
        flash = False
    if flash:
        return "flash"
    dtypes = ("fp16", "fp32", "bf16") if cc >= (8, 0) else ("fp16", "fp32")
    alignment = 8 if half else (4 if cc >= (8, 0) else 1)
    if cc >= (5, 0) and dtype in dtypes and head_dim % alignment == 0:
        return "efficient"
    return "math"


def traced_sdpa_kernel(dtype: str, head_dim: int, masked: bool = False) -> str:
    """The kernel the traced ``sdpa`` terms were traced with (``probes.trace.activations.gpu_kernels``): flash
    for 16-bit inputs without a mask and head_dim up to 256, the memory-efficient kernel otherwise."""
    return "flash" if dtype in ("fp16", "bf16") and not masked and head_dim <= 256 else "efficient"


def attention_impl(attn_impl: str, dtype: str, compute_capability: tuple[int, int] | None, head_dim: int) -> str:
    """``attn_impl`` as the activation model reads it on a GPU of ``compute_capability``: ``"sdpa"`` where the
    GPU runs the kernel the ``sdpa`` terms were traced with, :data:`SDPA_EFFICIENT` or :data:`SDPA_MATH` where it
    runs another (a V100 or T4 in fp16: memory-efficient); ``eager`` and ``flash_attention_2`` as they are."""
    if attn_impl != "sdpa":
        return attn_impl
    kernel = sdpa_kernel(compute_capability, dtype, head_dim)
    if kernel == traced_sdpa_kernel(dtype, head_dim):
        return "sdpa"
    return SDPA_MATH if kernel == "math" else SDPA_EFFICIENT if kernel == "efficient" else "sdpa"


def gpu_attention(attn_impl: str, dtype: str, hardware: Hardware | None, head_dim: int) -> str:
    """:func:`attention_impl` on ``hardware``'s GPU (None: a current GPU, as the traces were made)."""
    return attention_impl(attn_impl, dtype, hardware.gpu.compute_capability if hardware else None, head_dim)


def sdpa_kernel_of(attn_impl: str, dtype: str, head_dim: int) -> str | None:
    """The sdpa kernel an ``attn_impl`` as :func:`attention_impl` resolves it stands for (None: eager)."""
    if attn_impl == "eager":
        return None
    if attn_impl == SDPA_MATH:
        return "math"
    if attn_impl == SDPA_EFFICIENT:
        return "efficient"
    if attn_impl == "flash_attention_2":
        return "flash"
    return traced_sdpa_kernel(dtype, head_dim)


LSE_ROWS = 32  # the memory-efficient kernel pads its log-sum-exp to a multiple of 32 query rows (kAlignLSE)


def efficient_lse_padding(model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str) -> int:
    """Bytes the memory-efficient kernel's saved log-sum-exp holds beyond the flash kernel's, per layer, where a
    16-bit job runs it (:data:`SDPA_EFFICIENT`) but its terms were traced with flash: the flash kernel saves
    b x heads x s fp32 values, the memory-efficient one b x heads x ceil(s / 32) * 32 (0 at multiples of 32)."""
    if attn_impl != SDPA_EFFICIENT or dtype == "fp32":
        return 0
    padded = -(-seq_len // LSE_ROWS) * LSE_ROWS
    return 4 * sequences * model.num_heads * (padded - seq_len)


def with_lse_padding(
    sizes: tuple[int, ...], model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str
) -> tuple[int, ...]:
    """Traced layer sizes with the saved log-sum-exp (the b x heads x s fp32 tensor) grown to the
    memory-efficient kernel's padded rows; unchanged where none is padded or no such tensor was traced."""
    pad = efficient_lse_padding(model, sequences, seq_len, dtype, attn_impl)
    lse = 4 * sequences * model.num_heads * seq_len
    if not pad or lse not in sizes:
        return sizes
    i = sizes.index(lse)
    return (*sizes[:i], lse + pad, *sizes[i + 1 :])


def math_sdpa_saved(model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_p: float) -> list[int]:
    """What sdpa's math path (``at::_scaled_dot_product_attention_math``) saves for backward in one layer.

    16-bit inputs are upcast to fp32 first (``allow_fp16_bf16_reduction_math_sdp`` is off by default), K and V
    expanded to every head; autograd keeps the scaled Q and K, V, and the fp32 softmax output over the
    b x heads x s x s scores; with attention dropout also its one-byte mask and the dropped probabilities."""
    bs = sequences * seq_len
    q_dim = model.num_heads * model.head_dim
    scores = sequences * model.num_heads * seq_len * seq_len
    saved = [4 * bs * q_dim] * 3 + [4 * scores]
    if attn_p > 0:
        saved += [scores, 4 * scores]
    return saved


def attention_kernel_flops(model: ModelSpec, sequences: int, seq_len: int, kernel: str | None) -> float:
    """Forward FLOPs of one layer's attention under a causal mask with ``kernel``: the fused kernels (flash,
    memory-efficient) skip the masked half (:func:`attention_flops`); the math path and eager attention compute
    the full s x s scores and their product with V."""
    half = attention_flops(model, sequences, seq_len)
    return half if kernel in ("flash", "efficient") else 2.0 * half


def loss_bytes(model: ModelSpec, tokens: int, dtype_bytes: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes of HF's causal-LM loss over the logits.

    Forward: the head writes the 16-bit logits, ``.float()`` reads them and writes fp32, log-softmax reads
    twice (max, sum) and writes fp32. Backward: the nll gradient is written, log-softmax's backward reads it
    and its output and writes the fp32 gradient, the downcast reads that and writes 16 bits.
    """
    elements = tokens * model.vocab_size
    forward = elements * (dtype_bytes + (dtype_bytes + 4) + 2 * 4 + 4)
    backward = elements * (4 + 3 * 4 + (4 + dtype_bytes))
    return float(forward), float(backward)
