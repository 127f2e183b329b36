"""QLoRA's frozen base: bytes of the bitsandbytes weights, the backward's dequantization workspace and its seconds.

Pure functions (no torch). The byte formulas per weight live in :mod:`store.quantization` (cited there against
bitsandbytes 0.50.1). Mechanisms priced here:

- Every block linear (``linear_shapes`` x layers) is a ``Linear4bit`` / ``Linear8bitLt``; the token embedding,
  the norms and the LM head stay in the compute dtype (transformers keeps ``lm_head`` out,
  ``quantizers/base.py:39``). PEFT's ``prepare_model_for_kbit_training`` casts them to float32
  (``peft/utils/other.py:204-209``), and DeepSpeed's engine casts every float parameter back to the compute dtype
  at ``deepspeed.initialize`` (deepspeed 0.19.8 ``runtime/engine.py:1859-1862``, ``CASTABLE_DTYPES`` at line 154;
  the packed uint8 weights are not castable): so they are held at ``d`` bytes during training.
- Forward: ``MatMul4Bit.forward`` calls the ``bitsandbytes::gemm_4bit`` op (``autograd/_functions.py:324-345``),
  whose CUDA kernel (``backends/cuda/ops.py``) runs a fused 4-bit GEMM only for at most
  :data:`GEMM_4BIT_CUSTOM_MAX_M` rows (tokens) and otherwise falls back to ``_dequant_linear_fallback``: the weight
  dequantized to the compute dtype, then ``F.linear``. A training micro-batch (thousands of tokens) takes the
  fallback; so does a checkpointed layer's recompute. Backward: the input gradient dequantizes the whole weight
  (``_functions.py:384``, ``F.dequantize_4bit(B, ctx.state).to(grad_output.dtype)``). Each dequantization makes
  one linear's weight at a time a transient of ``d x in x out`` bytes, and a memory-bound kernel reads the codes
  and writes the 16-bit weight.

Under ZeRO-3 (nf4 only, PEFT's recipe) the packed codes are parameters stored in the compute dtype
(``bnb_4bit_quant_storage``): DeepSpeed sees ``(n + 1) // (2 d)`` elements per weight and partitions, gathers,
offloads and moves them as it does any 16-bit parameter (:func:`zero3_frozen_elements`,
:func:`quantized_weight_elements`); each weight's constants are its ``QuantState``, not a parameter, and stay whole
on every GPU (:func:`quant_constants_bytes`).
"""

from __future__ import annotations

from search.coefficients import Coefficients
from search.model.roofline import PassSeconds, hbm_seconds, host_seconds
from search.model.shapes import linear_shapes
from store.quantization import (
    dequantized_read_bytes,
    nf4_constants_bytes,
    nf4_stored_elements,
    quantized_linear_bytes,
)
from store.records import DTYPE_BYTES, GPUSpec, ModelSpec

# bitsandbytes' dequantize_4bit launches one kernel, and ``.to(dtype)`` a cast when the output dtype differs
DEQUANT_KERNELS_PER_LINEAR = 1
# Past this many rows of the input (tokens), bitsandbytes' CUDA gemm_4bit dequantizes and calls F.linear
# (``backends/cuda/ops.py``: ``_gemm_4bit_custom_max_m = 1536``, "dequant+F.linear wins past M=1536")
GEMM_4BIT_CUSTOM_MAX_M = 1536


def forward_dequantizes(quantization: str, tokens: int) -> bool:
    """Whether a forward over ``tokens`` rows dequantizes each 4-bit weight (the fallback past the fused
    kernel's rows); int8 weights are dequantized in the backward only."""
    return quantization == "nf4" and tokens > GEMM_4BIT_CUSTOM_MAX_M


def quantized_params(model: ModelSpec) -> int:
    """Parameters bitsandbytes quantizes: every block linear's weight (never more than the backbone)."""
    per_layer = sum(n_in * n_out for n_in, n_out in linear_shapes(model))
    return min(model.num_layers * per_layer, model.backbone_params)


def quantized_base_bytes(model: ModelSpec, quantization: str, dtype: str, *, lm_head: bool = True) -> int:
    """Bytes of the frozen base model per GPU: the quantized block linears (with their constants) plus the
    rest (embeddings, norms, LM head or scalar head) in the compute dtype."""
    d = DTYPE_BYTES[dtype]
    base = model.total_params if lm_head else model.backbone_params + model.hidden_size
    packed = model.num_layers * sum(quantized_linear_bytes(quantization, i, o) for i, o in linear_shapes(model))
    return packed + d * max(0, base - quantized_params(model))


def quantized_weight_elements(quantization: str, dtype: str, elements: int) -> int:
    """Elements DeepSpeed's ZeRO-3 sees for one quantized block-linear weight of ``elements`` weights: its packed
    codes stored in the compute dtype (:func:`store.quantization.nf4_stored_elements`); unchanged when 16-bit."""
    if quantization == "none":
        return elements
    return nf4_stored_elements(elements, DTYPE_BYTES[dtype])


def zero3_frozen_elements(model: ModelSpec, quantization: str, dtype: str, *, lm_head: bool = True) -> int:
    """Frozen elements a ZeRO-3 QLoRA engine partitions: every block linear's stored codes plus the 16-bit rest
    (embeddings, norms, the LM head or scalar head), as :func:`quantized_base_bytes` lays them out."""
    base = model.total_params if lm_head else model.backbone_params + model.hidden_size
    codes = model.num_layers * sum(
        quantized_weight_elements(quantization, dtype, i * o) for i, o in linear_shapes(model)
    )
    return codes + max(0, base - quantized_params(model))


def quant_constants_bytes(model: ModelSpec, quantization: str) -> int:
    """Bytes of every quantized weight's constants (absmax with double quantization's second level): a
    ``QuantState`` per weight, not a parameter, so whole on every GPU under ZeRO-3 too."""
    if quantization != "nf4":
        return 0
    return model.num_layers * sum(nf4_constants_bytes(i * o) for i, o in linear_shapes(model))


def dequant_workspace(model: ModelSpec, dtype: str) -> int:
    """Bytes of the backward's transient 16-bit weight: the largest block linear, dequantized."""
    return DTYPE_BYTES[dtype] * max(n_in * n_out for n_in, n_out in linear_shapes(model))


def dequant_seconds(model: ModelSpec, quantization: str, dtype: str, gpu: GPUSpec, coef: Coefficients) -> PassSeconds:
    """One pass's dequantization of every block linear: codes read, 16-bit weights written (HBM-bound),
    one launch per linear on the host clock."""
    n = quantized_params(model)
    moved = n * (dequantized_read_bytes(quantization) + DTYPE_BYTES[dtype])
    kernels = DEQUANT_KERNELS_PER_LINEAR * model.num_layers * len(linear_shapes(model))
    return PassSeconds(gpu={"dequantize": hbm_seconds(moved, gpu)}, host={"dequantize": host_seconds(kernels, coef)})
