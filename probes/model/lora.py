"""A minimal LoRA for probes: low-rank adapters on every linear layer of the decoder blocks.

peft is not a dependency of memplan, so probes add LoRA themselves, in the shape that
``peft.get_peft_model(model, LoraConfig(r=r, target_modules="all-linear"))`` gives (the advice of
:func:`launch.ds_config.outside_settings`): every ``nn.Linear`` (and transformers' GPT-2 ``Conv1D``)
inside the model except the output layer (``lm_head``) and a value head gets an adapter, all base
weights are frozen, and only the adapters (plus any module named in ``trainable``) train. The memory
that matters is the same as peft's: frozen 16-bit base weights, adapter weights, their gradients and
optimizer states, and the adapter's activations (each adapted layer's input is used once more).

The layer follows DeepSpeed-Chat's ``LinearLayer_LoRA`` (``dschat/utils/module/lora.py``), because
DeepSpeed's hybrid engine knows that layout: the layer keeps the original ``weight`` and ``bias``
parameters under their own names (inference containers read ``q_proj.weight``), and the adapter is
``lora_right_weight`` (in x r, Kaiming-uniform), ``lora_left_weight`` (r x out, zeros) and
``lora_scaling`` (1 / r, DeepSpeed-Chat's default), which ``fuse_lora`` / ``unfuse_lora`` of the hybrid
engine's containers add to and take from ``weight`` around generation.

:func:`adapters_disabled` switches the adapters off in a block (DPO's reference with LoRA is the policy's
base model, as TRL does it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LoRALinear", "add_lora", "adapters_disabled"]

SKIPPED = ("lm_head", "v_head", "score", "embed_out")


def is_quantized_linear(module: nn.Module) -> bool:
    """Is ``module`` one of bitsandbytes' quantized linear layers (QLoRA, :mod:`probes.model.quantize`)?"""
    return type(module).__module__.startswith("bitsandbytes")


class LoRALinear(nn.Module):
    """A linear layer (``base``'s own weight and bias) plus ``scaling * (x @ right) @ left``.

    ``transposed`` marks GPT-2's ``Conv1D``, whose weight is stored (in, out). ``in_features`` and
    ``out_features`` are there for code that reads them off an ``nn.Linear`` (DeepSpeed's Llama policy).
    A bitsandbytes base (QLoRA, :mod:`probes.model.quantize`) is kept whole as ``base_layer`` and run as
    itself, as PEFT does; its adapters are made in ``adapter_dtype`` (the compute dtype), on the device of the
    model's 16-bit parameters (``adapter_device``: its codes may stay on the host).
    """

    def __init__(
        self,
        base: nn.Module,
        in_features: int,
        out_features: int,
        rank: int,
        transposed: bool,
        adapter_dtype: torch.dtype | None = None,
        adapter_device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.base_layer = base if is_quantized_linear(base) else None
        if self.base_layer is None:
            self.weight = base.weight
            self.bias = base.bias
        self.transposed = transposed
        self.in_features, self.out_features = in_features, out_features  # what nn.Linear readers look for
        quantized = self.base_layer is not None
        kw = {
            "dtype": adapter_dtype if quantized and adapter_dtype is not None else base.weight.dtype,
            "device": adapter_device if quantized and adapter_device is not None else base.weight.device,
        }
        self.lora_right_weight = nn.Parameter(torch.empty(in_features, rank, **kw))
        self.lora_left_weight = nn.Parameter(torch.zeros(rank, out_features, **kw))
        nn.init.kaiming_uniform_(self.lora_right_weight, a=math.sqrt(5))
        self.lora_scaling = 1.0 / rank
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.base_layer is not None:
            out = self.base_layer(x)
        elif self.transposed:
            flat = x.reshape(-1, x.shape[-1])
            out = torch.addmm(self.bias, flat, self.weight) if self.bias is not None else flat @ self.weight
            out = out.view(*x.shape[:-1], self.out_features)
        else:
            out = F.linear(x, self.weight, self.bias)
        if not self.enabled:
            return out
        return out + (x @ self.lora_right_weight @ self.lora_left_weight) * self.lora_scaling


def _features(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) of a linear layer: nn.Linear stores (out, in), GPT-2's Conv1D (in, out)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:
        rows, cols = module.weight.shape
        return rows, cols
    return None


def add_lora(
    model: nn.Module, rank: int, trainable: tuple[str, ...] = (), adapter_dtype: torch.dtype | None = None
) -> int:
    """Freeze ``model`` and put a rank-``rank`` adapter beside each of its linear layers (see the module).

    Modules whose name ends in one of ``trainable`` (a value head) stay trainable. ``adapter_dtype``: the
    adapters' dtype over quantized bases (default: each base weight's). Returns the number of adapted layers.
    """
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, not {rank}")
    for param in model.parameters():
        param.requires_grad_(False)
    targets = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in SKIPPED or isinstance(module, LoRALinear):
            continue
        features = _features(module)
        if features is not None:
            targets.append((name, features))
    device = next((p.device for p in model.parameters() if p.is_floating_point()), None)
    for name, (fan_in, fan_out) in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, leaf)
        transposed = not isinstance(base, nn.Linear)
        setattr(parent, leaf, LoRALinear(base, fan_in, fan_out, rank, transposed, adapter_dtype, device))
    for name, module in model.named_modules():
        if name and name.rsplit(".", 1)[-1] in trainable:
            for param in module.parameters():
                param.requires_grad_(True)
    return len(targets)


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run the block with every adapter of ``model`` switched off (the base model alone)."""
    adapters = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for adapter in adapters:
        adapter.enabled = False
    try:
        yield
    finally:
        for adapter in adapters:
            adapter.enabled = True
