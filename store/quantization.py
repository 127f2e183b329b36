"""QLoRA's quantized base weights as bitsandbytes stores them: bytes per weight, which modules stay 16-bit.

A strategy's ``quantization`` is ``none`` (16-bit base weights), ``nf4`` (bitsandbytes' ``Linear4bit`` with
``bnb_4bit_quant_type="nf4"`` and double quantization, the QLoRA recipe) or ``int8`` (``Linear8bitLt``). The
formulas follow bitsandbytes 0.50.1 (github.com/bitsandbytes-foundation/bitsandbytes, tag 0.50.1):

- ``bitsandbytes/_ops.py:232-236`` (``quantize_4bit``'s fake): ``blocks = ceil(n / blocksize)``, ``absmax`` is
  ``blocks`` float32, the packed weight ``(n + 1) // 2`` uint8 (two 4-bit codes a byte).
- ``bitsandbytes/functional.py:917-918``: ``blocksize`` defaults to 64 (``nn/modules.py:230-231``, ``Params4bit``,
  the same); ``functional.py:938-940``: with ``compress_statistics`` (transformers'
  ``bnb_4bit_use_double_quant``) the absmax values less their mean (one float32 ``offset``) are quantized again
  by ``quantize_blockwise(..., blocksize=256)``: one uint8 per first-level block (``_ops.py:349``) and one float32
  absmax per 256 of them (``_ops.py:347-348``). The 256-entry dynamic code map is shared by every tensor
  (``functional.py`` ``name2qmap["dynamic"]``) and is not counted per weight.
- ``_ops.py:95-98`` (``int8_vectorwise_quant``): ``CB`` int8 of the weight's shape and ``SCB``, one float32 per
  row (``numel // shape[-1]``: ``out_features`` rows of an ``nn.Linear`` weight), kept by ``Int8Params``
  (``nn/modules.py:743``).

Which modules stay 16-bit: transformers quantizes every ``nn.Linear`` but those of ``llm_int8_skip_modules`` and
``get_keys_to_not_convert`` (``quantizers/base.py:39``: the output embedding, ``lm_head``); embeddings and norms are
not ``nn.Linear``. PEFT's ``prepare_model_for_kbit_training`` (``peft/utils/other.py:204-209``) then casts every
non-``Params4bit`` 16-bit parameter to float32 and, by default, enables gradient checkpointing and input grads.
"""

from __future__ import annotations

from store.choices import Quantization, values
from store.errors import InputError

QUANTIZATIONS: tuple[str, ...] = values(Quantization)
NF4_BLOCKSIZE = 64  # Params4bit / quantize_4bit default (bitsandbytes nn/modules.py:230-231, functional.py:917-918)
NESTED_BLOCKSIZE = 256  # double quantization's second level (functional.py:940)
FP32 = 4
# QLoRA's recipe (Dettmers et al. 2023) and TRL's ``use_bnb_nested_quant``: memplan's nf4 double-quantizes
NF4_DOUBLE_QUANT = True


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def nf4_bytes(n: int, *, double_quant: bool = NF4_DOUBLE_QUANT, blocksize: int = NF4_BLOCKSIZE) -> int:
    """Bytes of one NF4 weight of ``n`` elements: packed codes, then its absmax constants (one level or two)."""
    blocks = _ceil_div(n, blocksize)
    packed = (n + 1) // 2
    if not double_quant:
        return packed + FP32 * blocks
    # uint8 absmax per block, float32 absmax per 256 blocks, one float32 offset
    return packed + blocks + FP32 * _ceil_div(blocks, NESTED_BLOCKSIZE) + FP32


def nf4_constants_bytes(n: int, *, double_quant: bool = NF4_DOUBLE_QUANT, blocksize: int = NF4_BLOCKSIZE) -> int:
    """Bytes of one NF4 weight's quantization constants (its ``QuantState``: absmax, the nested level, the offset),
    which are not a parameter: ZeRO-3 partitions the packed codes only, every rank keeps these whole."""
    return nf4_bytes(n, double_quant=double_quant, blocksize=blocksize) - (n + 1) // 2


def nf4_stored_elements(n: int, storage_bytes: int) -> int:
    """Elements of the tensor holding one NF4 weight's packed codes when ``bnb_4bit_quant_storage`` is a dtype of
    ``storage_bytes`` bytes (``_ops.py`` ``quantize_4bit``'s fake: ``(n + 1) // (itemsize * 2)`` elements): what
    DeepSpeed's ZeRO-3 sees, partitions and gathers (PEFT's ZeRO-3 QLoRA recipe stores them in the compute dtype)."""
    return (n + 1) // (2 * storage_bytes)


def int8_bytes(n_out: int, n_in: int) -> int:
    """Bytes of one LLM.int8() weight (``out`` x ``in``): int8 codes plus one float32 scale per row."""
    return n_out * n_in + FP32 * n_out


def quantized_linear_bytes(quantization: str, n_in: int, n_out: int) -> int:
    """Bytes bitsandbytes keeps for one ``nn.Linear(n_in, n_out)`` weight under ``quantization``."""
    if quantization == "nf4":
        return nf4_bytes(n_in * n_out)
    if quantization == "int8":
        return int8_bytes(n_out, n_in)
    raise InputError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {quantization!r}")


def dequantized_read_bytes(quantization: str) -> float:
    """Bytes per weight a dequantization kernel reads (codes; the constants are a rounding error)."""
    return 0.5 if quantization == "nf4" else 1.0


def quantization_label(quantization: str, lora_rank: int) -> str:
    """The plan label's adapter part: ``QLoRA nf4 r16`` or ``LoRA r16``."""
    if quantization != "none":
        return f"QLoRA {quantization} r{lora_rank}"
    return f"LoRA r{lora_rank}"


def qlora_loading(quantization: str, dtype: str | None, *, zero_stage: int = 0, offload_param: str = "none") -> str:
    """The model-loading snippet of a QLoRA plan: transformers' ``BitsAndBytesConfig`` (bitsandbytes on CUDA), then
    PEFT's ``prepare_model_for_kbit_training`` before the adapters; ``dtype`` None: the job's, left to fill.

    Under ZeRO-3 (nf4 only) the packed codes are stored in the compute dtype (``bnb_4bit_quant_storage``, PEFT's
    ZeRO-3 QLoRA recipe) so DeepSpeed can flatten and partition them with the 16-bit parameters. transformers 5.23
    builds a quantized model without ``zero.Init`` (``modeling_utils.py``: ``needs_zero3_init`` is false when
    quantized) and bitsandbytes' loader places it on the current GPU (``Bnb4BitHfQuantizer.update_device_map``):
    every rank holds the whole 4-bit model on its GPU until ``deepspeed.initialize`` partitions it. With the
    parameters offloaded the plan loads it on the host instead (``device_map={"": "cpu"}``, which the quantizer
    accepts when every module is on the CPU, and which ``integrations/accelerate.py`` ``check_and_set_device_map``
    refuses once a ZeRO-3 config is active: so before it) and moves each weight's ``quant_state`` (not a parameter:
    DeepSpeed never moves it) to the GPU; DeepSpeed's engine then moves each parameter to the GPU and partitions it
    to the host one at a time (``Init._convert_to_zero_parameters``). tests/probes/test_qlora_zero3_stack.py runs
    this recipe with the real libraries on DeepSpeed's CPU accelerator."""
    compute = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}.get(dtype or "", "...")
    zero3 = zero_stage == 3
    if quantization == "nf4":
        storage = f", bnb_4bit_quant_storage={compute}" if zero3 else ""
        config = (
            'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", '
            f"bnb_4bit_compute_dtype={compute}, bnb_4bit_use_double_quant={NF4_DOUBLE_QUANT}{storage})"
        )
    else:
        config = "BitsAndBytesConfig(load_in_8bit=True)"
    on_host = zero3 and offload_param != "none"
    placement = ', device_map={"": "cpu"}' if on_host else ""
    text = (
        f"QLoRA {quantization}: AutoModelForCausalLM.from_pretrained(..., quantization_config={config}, "
        f"dtype={compute}{placement}), then peft.prepare_model_for_kbit_training(model) before the adapters "
        f"(bitsandbytes, CUDA only; {'ZeRO-3' if zero3 else 'ZeRO-0/1/2'})"
    )
    if on_host:
        text += (
            "; load it before the ZeRO-3 config is active (before TrainingArguments(deepspeed=...) or "
            "HfDeepSpeedConfig: transformers refuses a device_map under ZeRO-3), then before deepspeed.initialize "
            "move every 4-bit weight's quantization constants to the GPU: for p in model.parameters(): "
            "getattr(p, 'quant_state', None) is not None and p.quant_state.to('cuda') (memplan's tests run this "
            "path on DeepSpeed's CPU accelerator; the move to a GPU is not yet run on one)"
        )
    elif zero3:
        text += "; every rank loads the whole 4-bit model onto its GPU before deepspeed.initialize partitions it"
    return text
