"""QLoRA's frozen base in a probe: each block linear swapped for bitsandbytes' quantized layer, as transformers
loads it.

transformers' bitsandbytes quantizer (``quantizers/quantizer_bnb_4bit.py``, ``integrations/bitsandbytes.py``)
replaces every ``nn.Linear`` but the output layer with ``bnb.nn.Linear4bit`` (``Linear8bitLt`` for int8) and
quantizes each weight as it is loaded, one at a time, on the target device (``Params4bit.to`` quantizes the first
time a weight moves). A probe builds its model from the config with random weights on the host, so it does the
same swap there and quantizes each weight onto the device the plan loads it to: the GPU, or under ZeRO-3 with
parameter offload the host, whose quantization constants then move to the GPU as the export tells the user to
(``store.quantization.qlora_loading``). The 16-bit rest (embeddings, norms, head) stays in the compute dtype: PEFT's
``prepare_model_for_kbit_training`` casts it to float32, and DeepSpeed's engine casts it back at initialize
(the cost model's ``search.model.quantized``), so the probe leaves it as it is.

Heavy imports (torch, bitsandbytes) happen inside the functions: this runs in the probe child only.
"""

from __future__ import annotations

from typing import Any

from probes.model.lora import SKIPPED
from store.quantization import NF4_DOUBLE_QUANT

LLM_INT8_THRESHOLD = 6.0  # BitsAndBytesConfig's llm_int8_threshold default, which transformers passes to Linear8bitLt


def _quantized(linear: Any, quantization: str, compute: Any, storage: Any) -> Any:
    """bitsandbytes' layer for ``linear`` holding its (not yet quantized) weight and bias, on the meta device."""
    import bitsandbytes as bnb
    import torch

    bias = linear.bias is not None
    if quantization == "nf4":
        layer = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=bias,
            compute_dtype=compute,
            compress_statistics=NF4_DOUBLE_QUANT,
            quant_type="nf4",
            quant_storage=storage,
            device="meta",
        )
        layer.weight = bnb.nn.Params4bit(
            linear.weight.data,
            requires_grad=False,
            compress_statistics=NF4_DOUBLE_QUANT,
            quant_type="nf4",
            quant_storage=storage,
            module=layer,
        )
    else:
        layer = bnb.nn.Linear8bitLt(
            linear.in_features,
            linear.out_features,
            bias=bias,
            has_fp16_weights=False,
            threshold=LLM_INT8_THRESHOLD,
            device="meta",
        )
        layer.weight = bnb.nn.Int8Params(linear.weight.data, requires_grad=False, has_fp16_weights=False)
    if bias:
        layer.bias = torch.nn.Parameter(linear.bias.data, requires_grad=False)
    return layer


def quantize_linears(
    model: Any, quantization: str, compute: Any, *, device: str, zero_stage: int, on_host: bool
) -> int:
    """Swap every linear of ``model`` but the output layers for bitsandbytes' quantized layer and quantize it onto
    ``device`` (``on_host``: onto the host, its constants then onto ``device``); the codes are stored in the
    compute dtype ``compute`` under ZeRO-3 (PEFT's recipe), else in uint8. Returns the number of linears swapped."""
    import torch

    storage = compute if zero_stage == 3 else torch.uint8
    target = "cpu" if on_host else device
    names = [
        name
        for name, module in model.named_modules()
        if type(module) is torch.nn.Linear and name.rsplit(".", 1)[-1] not in SKIPPED
    ]
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = _quantized(getattr(parent, leaf), quantization, compute, storage).to(target)
        state = getattr(layer.weight, "quant_state", None)
        if on_host and state is not None and device != "cpu":
            state.to(device)  # the export's recipe: the constants on the GPU, the codes on the host
        setattr(parent, leaf, layer)
    return len(names)
