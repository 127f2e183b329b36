"""Seconds ZeRO-3 adds to a micro-step, from its own mechanism (DeepSpeed's ``runtime/zero``).

ZeRO-3 runs Python around every module and every gradient. :mod:`probes.trace.zero3_host` counts it on a real
ZeRO-3 engine (DeepSpeed's CPU accelerator, a tiny OPT of the real module structure at two depths) into
``store/zero3_host_counts.json``; this module reads the counts and prices them:

- **module hooks** (``parameter_offload.py``): every module gets a forward pre-hook (``fetch_sub_module``: trace
  step, gather, wait, prefetch) and a forward hook (``release_sub_module``), once per module per forward;
  their backward twins run once per module in the backward (the post-backward one on all but the parameterless
  activation); and the autograd Functions DeepSpeed wraps around every module's inputs and outputs to get
  those backward calls cost host time beyond the hooks themselves (``forward_wrapper``/``backward_wrapper``: the
  engine's forward and backward outside the counted hooks, less the plain model's own time);
- **the checkpointed recompute**: each layer's forward runs again inside the backward, its submodules' forward
  hooks with it (the layer itself is called through the checkpoint and is not hooked again);
- **gradient hooks** (``stage3.py reduce_partition_and_remove_grads``): one per trainable tensor per backward,
  each copying the gradient into the reduce bucket and, when it is full, reducing and partitioning the bucket
  (``__reduce_and_partition_ipg_grads``, ``partition_grads``; with optimizer offload, the partition's copy to the
  host's pinned buffer and its fp32 upcast on the host side);
- with ``offload_optimizer``, the bulk copies of ``stage3.py`` beyond ZeRO-1/2's (:func:`zero3_offload`);
- on the GPU, the gradient's two copies (into the bucket, then into its partition) over HBM. On one GPU the
  parameter "gather" is a view (``partition_parameters.py _no_gather_coalesced``: the partition is the whole
  parameter) and moves no bytes; across GPUs the all-gathers are :func:`search.model.timing.zero_comm_bytes`.

Each hook call's host cost was measured on the CPU in units of the plain model's own host time per dispatched
compute op (op-equivalents), the unit in which the calibration's ``host_s_per_kernel`` prices every kernel
the model's Python issues; so a hook costs its op-equivalents times ``host_s_per_kernel`` on the target, and
no coefficient is set from a ZeRO-3 measurement. The terms go on the host clock of the pass they run in
(:class:`search.model.roofline.PassSeconds`), where they overlap the GPU's work as the model's own issuing does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import store
from search.coefficients import Coefficients
from search.model.passes import trainable_tensors
from search.model.roofline import PassSeconds, hbm_seconds, host_seconds
from search.model.shapes import linear_shapes
from search.model.timing import pcie_time
from store.records import DTYPE_BYTES, GPUSpec, Hardware, ModelSpec

COUNTS_PATH = Path(store.__file__).resolve().parent / "zero3_host_counts.json"
LORA_MODULES_PER_LINEAR = 4  # peft's LoraLayer calls its base layer, lora_dropout, lora_A and lora_B per linear
GRADIENT_COPIES = 2  # stage3.py: into the reduce bucket (__add_grad_to_ipg_bucket), then into the partition


@dataclass(frozen=True)
class Zero3HostRates:
    """Counts per module and tensor, and op-equivalents per call, of :mod:`probes.trace.zero3_host`."""

    modules_per_layer: float  # of the traced OPT layer (the structure the per-module rates are measured on)
    modules_outside_layers: float
    forward_calls_per_module: float
    recompute_calls_per_module: float
    backward_pre_calls_per_module: float
    backward_post_calls_per_module: float
    grad_hooks_per_tensor: float
    equivalents: dict[str, float]  # op-equivalents per call, optimizer on the GPU
    equivalents_offload: dict[str, float]  # the same with offload_optimizer cpu
    fixed: dict[str, float]  # op-equivalents once per step beyond the calls (a region's first call does more)
    fixed_offload: dict[str, float]

    def per_call(self, name: str, offload: bool) -> float:
        """Op-equivalents of one call of ``name`` (``pre_forward``, ``grad_hook``, ``forward_wrapper``, ...)."""
        return (self.equivalents_offload if offload else self.equivalents)[name]

    def per_step(self, name: str, offload: bool) -> float:
        """Op-equivalents ``name`` spends once per micro-step beyond its calls."""
        return (self.fixed_offload if offload else self.fixed)[name]


@lru_cache(maxsize=1)
def zero3_rates(path: Path = COUNTS_PATH) -> Zero3HostRates:
    """The committed counts (``python -m probes.trace.zero3_host --write``)."""
    rates = json.loads(path.read_text(encoding="utf-8"))["rates"]
    return Zero3HostRates(
        modules_per_layer=rates["modules_per_layer"],
        modules_outside_layers=rates["modules_outside_layers"],
        forward_calls_per_module=rates["forward_calls_per_module"],
        recompute_calls_per_module=rates["recompute_calls_per_module"],
        backward_pre_calls_per_module=rates["backward_pre_calls_per_module"],
        backward_post_calls_per_module=rates["backward_post_calls_per_module"],
        grad_hooks_per_tensor=rates["grad_hooks_per_tensor"],
        equivalents=dict(rates["op_equivalents"]),
        equivalents_offload=dict(rates["op_equivalents_offload"]),
        fixed=dict(rates["fixed_op_equivalents"]),
        fixed_offload=dict(rates["fixed_op_equivalents_offload"]),
    )


def modules_per_layer(model: ModelSpec, lora_rank: int = 0) -> int:
    """Modules of one decoder layer that DeepSpeed hooks and the forward calls: the layer, its attention block,
    every linear, the norms, the activation module, and (all but OPT's and GPT-2's flat layers) the MLP block;
    with LoRA, peft's wrapped pieces of every linear. The traced OPT layer has 11 (2 + 6 linears + 2 LayerNorms
    + ReLU), a Llama layer 13."""
    linears = len(linear_shapes(model))
    norms = 2
    mlp_block = 0 if model.model_type in ("opt", "gpt2") else 1
    lora = LORA_MODULES_PER_LINEAR * linears if lora_rank else 0
    return 2 + linears + norms + 1 + mlp_block + lora


def hooked_modules(model: ModelSpec, lora_rank: int = 0) -> float:
    """Modules hooked over the whole model: the layers' and the traced count outside them (embeddings, final norm,
    head, the model's wrappers)."""
    rates = zero3_rates()
    return model.num_layers * modules_per_layer(model, lora_rank) + rates.modules_outside_layers


@dataclass(frozen=True)
class Zero3Passes:
    """What ZeRO-3 adds to one micro-step's forward and backward (the recompute's hooks are in the backward)."""

    forward: PassSeconds
    backward: PassSeconds


@lru_cache(maxsize=4096)
def zero3_passes(
    model: ModelSpec,
    dtype: str,
    gpu: GPUSpec,
    coef: Coefficients,
    *,
    lora_rank: int,
    lm_head: bool,
    checkpointing: bool,
    offload_optimizer: bool,
    trainable: int,
) -> Zero3Passes:
    """ZeRO-3's host terms of a micro-step (the module docstring), priced at ``coef.host_s_per_kernel`` per
    op-equivalent, and its gradient copies over HBM (``trainable`` parameters on this GPU before partitioning)."""
    rates = zero3_rates()

    def eq(name: str) -> float:
        return rates.per_call(name, offload_optimizer)

    def once(*names: str) -> float:
        return sum(rates.per_step(name, offload_optimizer) for name in names)

    modules = hooked_modules(model, lora_rank)
    forward_calls = modules * rates.forward_calls_per_module
    forward_hooks = forward_calls * (eq("pre_forward") + eq("post_forward") + eq("forward_wrapper"))
    forward_hooks += once("pre_forward", "post_forward", "forward_wrapper")
    backward_calls = modules * rates.backward_pre_calls_per_module
    backward_hooks = backward_calls * (eq("pre_backward") + eq("backward_wrapper"))
    backward_hooks += modules * rates.backward_post_calls_per_module * eq("post_backward")
    backward_hooks += once("pre_backward", "post_backward", "backward_wrapper")
    tensors = trainable_tensors(model, lora_rank, lm_head=lm_head)
    grad_hooks = tensors * rates.grad_hooks_per_tensor * eq("grad_hook") + once("grad_hook")
    backward_host = {
        "zero3_module_hooks": host_seconds(backward_hooks, coef),
        "zero3_grad_hooks": host_seconds(grad_hooks, coef),
    }
    if checkpointing:
        recompute_calls = model.num_layers * modules_per_layer(model, lora_rank) * rates.recompute_calls_per_module
        recompute = recompute_calls * (eq("pre_forward") + eq("post_forward") + eq("backward_wrapper"))
        backward_host["zero3_recompute_hooks"] = host_seconds(recompute, coef)
    copies = GRADIENT_COPIES * 2 * DTYPE_BYTES[dtype] * trainable  # each copy reads and writes the gradient
    return Zero3Passes(
        forward=PassSeconds(host={"zero3_module_hooks": host_seconds(forward_hooks, coef)}),
        backward=PassSeconds(gpu={"zero3_grad_copies": hbm_seconds(copies, gpu)}, host=backward_host),
    )


def zero3_offload(local: int, dtype: str, hardware: Hardware, coef: Coefficients) -> tuple[PassSeconds, PassSeconds]:
    """What ZeRO-3's optimizer offload moves beyond CPU Adam itself, as (backward, optimizer step), none hidden:

    - ``zero3_grad_roundtrip`` (backward): ``partition_grads`` copies each gradient partition into the pinned
      host buffer (``grad_partitions_flat_buffer``, in the gradient accumulation dtype: the model's 16-bit one by
      default) and back to the device (``grad_buffer.to(grad_partition.device)``) before the fp32 upcast goes to
      the host (that fp32 copy is the ``pcie`` term every stage has): 2 x 16-bit bytes over PCIe per parameter;
    - ``zero3_unscale``: ``unscale_and_clip_grads`` multiplies the fp32 gradient on the host by ``1 / scale``
      whatever the scale and clipping (stage3.py; ZeRO-1/2 skip it without clipping and loss scale): fp32 read
      and written over host memory;
    - ``zero3_param_conversion`` and ``zero3_param_upload``: ``_reassign_or_swap_out_partitioned_parameters``
      copies the fp32 master on the host into the 16-bit partition on the device with one blocking ``copy_``.
      Torch's CPU-to-GPU copy with a dtype change (``aten/src/ATen/native/cuda/Copy.cu``) casts on the CPU into
      a new tensor first (fp32 read, 16-bit write over host memory, plus the first touch of that tensor's fresh
      pages) and uploads it from that pageable memory, which the driver stages through pinned buffers
      (:attr:`Coefficients.pageable_copy_gbps`, not the link's DMA rate). ZeRO-1/2 instead cast into a pinned
      buffer made once and upload it non-blocking (the ``pcie`` term). On the H200 the profiled step of opt-1.3b
      (benchmarks/results/host_link.md) spent 333 ms in CPU Adam, 88 ms in the unscale, 324 ms casting and 490 ms
      in the pageable upload.
    """
    d = DTYPE_BYTES[dtype]
    node = local * hardware.gpus  # the node's host memory serves every GPU's partition
    backward = PassSeconds(serial={"zero3_grad_roundtrip": pcie_time(2 * d * local, hardware, coef)})
    step = {
        "zero3_unscale": node * 8 / (coef.host_memory_gbps * 1e9),
        "zero3_param_conversion": node * (4 + d) / (coef.host_memory_gbps * 1e9)
        + node * d / (coef.host_first_touch_gbps * 1e9),
        "zero3_param_upload": local * d / (coef.pageable_copy_gbps * 1e9),
    }
    return backward, PassSeconds(serial=step)
