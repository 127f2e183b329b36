"""Bytes per GPU of one trained model's states as DeepSpeed lays them out (the working buffers around them:
:mod:`search.model.zero_buffers`).

Pure functions. ``T`` is trainable parameters, ``F`` frozen ones (LoRA's base model), ``N`` the
data-parallel world size, ``d`` the bytes of the compute dtype. The ZeRO layouts follow
``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py`` and agree with DeepSpeed's own estimators
(``estimate_zero2_model_states_mem_needs``, ``estimate_zero3_model_states_mem_needs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from search.model.shapes import largest_module_params
from store.ds_defaults import ZERO3_SUB_GROUP_SIZE
from store.records import DTYPE_BYTES, ModelSpec


@dataclass(frozen=True)
class ModelStates:
    """Where one trainable model's states live, in bytes per GPU (host bytes per GPU too)."""

    parameters: int  # 16-bit (fp32 when training in fp32) weights resident on the GPU
    gradients: int  # 16-bit gradients plus DeepSpeed's fp32 gradient partition
    optimizer_states: int  # fp32 master weights, Adam m and v
    zero3_gathered: int  # ZeRO-3: gathered parameters and their full gradients of the live module
    step_transient: int  # extra bytes only during the optimizer step
    host: int  # states offloaded to the host, per GPU, before pinned-buffer slack
    host_parameters: int = 0  # of ``host``: the 16-bit parameter partition offloaded to CPU memory
    host_nvme: int = 0  # of ``host``: ZeRO-Infinity's swap buffers of the states offloaded to NVMe

    @property
    def gpu_total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states + self.zero3_gathered


def model_states(
    *,
    model: ModelSpec,
    trainable: int,
    frozen: int,
    dtype: str,
    zero_stage: int,
    offload_optimizer: str,
    offload_param: str,
    world_size: int,
    grad_accum: int,
    sub_group_size: int = ZERO3_SUB_GROUP_SIZE,
    frozen_bytes: int | None = None,
) -> ModelStates:
    """Model-state bytes per GPU for one trainable model under a ZeRO stage and offload choice (ZeRO-3 steps
    the optimizer ``sub_group_size`` elements at a time). ``frozen_bytes``: the frozen base's bytes when they are
    not ``d`` per parameter (QLoRA's quantized weights, :mod:`search.model.quantized`; ZeRO-0/1/2 only)."""
    d = DTYPE_BYTES[dtype]
    n = world_size
    t, f = trainable, frozen
    mixed = dtype != "fp32"
    offload_opt = offload_optimizer != "none"
    held = d * (t + f) if frozen_bytes is None else d * t + frozen_bytes  # ZeRO-0/1/2: every rank holds them
    if zero_stage == 0:
        # No ZeRO: FP16_Optimizer (bf16 too) keeps fp32 master, m, v; at step() it upcasts every 16-bit
        # grad to fp32 and flattens those copies (fused_optimizer.py step: _flatten_dense_tensors over
        # p.grad.to(fp32)), so 4T + 4T live beside the 16-bit grads. In fp32 the torch optimizer holds m, v.
        return ModelStates(
            parameters=held,
            gradients=d * t,
            optimizer_states=(12 if mixed else 8) * t,
            zero3_gathered=0,
            step_transient=(8 * t) if mixed else 0,
            host=0,
        )
    if zero_stage in (1, 2):
        return _zero12_states(d, t, n, held, zero_stage=zero_stage, grad_accum=grad_accum, offload=offload_opt)
    return _zero3_states(
        model,
        d,
        t,
        f,
        n,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        sub_group_size=sub_group_size,
    )


def _zero12_states(
    d: int, t: int, n: int, held: int, *, zero_stage: int, grad_accum: int, offload: bool
) -> ModelStates:
    """ZeRO-1 and ZeRO-2: the 16-bit weights whole on every rank (``held``), the rest partitioned over ``n``."""
    # ZeRO-1 keeps param.grad whole until the accumulation boundary; ZeRO-2 reduces every micro-step.
    full_lp_grads = zero_stage == 1 and grad_accum > 1
    lp_grads = d * t if full_lp_grads else d * t // n
    if offload:
        return ModelStates(
            parameters=held,
            gradients=d * t if full_lp_grads else 0,
            optimizer_states=0,
            zero3_gathered=0,
            step_transient=0,
            host=16 * t // n,  # fp32 master copy, its gradient, Adam m and v
        )
    # The reduced 16-bit partition (grads_in_partition) persists; its fp32 copy exists during step().
    return ModelStates(
        parameters=held,
        gradients=lp_grads,
        optimizer_states=12 * t // n,
        zero3_gathered=0,
        step_transient=4 * t // n,
        host=0,
    )


def _zero3_states(
    model: ModelSpec,
    d: int,
    t: int,
    f: int,
    n: int,
    *,
    offload_optimizer: str,
    offload_param: str,
    sub_group_size: int,
) -> ModelStates:
    """ZeRO-3: every state partitioned over ``n`` ranks, offloaded to the host or NVMe as asked."""
    # ZeRO-3: everything partitioned; the live module is gathered (params and full grads, 2 x d bytes).
    gathered = 2 * d * largest_module_params(model)
    lp_params = d * (t + f) // n
    # ZeRO-Infinity on NVMe keeps only swap buffers in host memory: a sub-group of optimizer states and
    # DeepSpeed's default parameter buffers (5 x 1e8 elements).
    host_optimizer = 16 * min(t // n, sub_group_size) if offload_optimizer == "nvme" else 16 * t // n
    host_params = 5 * 100_000_000 * d if offload_param == "nvme" else lp_params
    nvme = (host_optimizer if offload_optimizer == "nvme" else 0) + (host_params if offload_param == "nvme" else 0)
    if offload_param != "none":
        on_cpu = host_params if offload_param == "cpu" else 0
        return ModelStates(
            parameters=0,
            gradients=0,
            optimizer_states=0,
            zero3_gathered=gathered,
            step_transient=0,
            host=host_optimizer + host_params,
            host_parameters=on_cpu,
            host_nvme=nvme,
        )
    if offload_optimizer != "none":
        return ModelStates(
            parameters=lp_params,
            gradients=0,
            optimizer_states=0,
            zero3_gathered=gathered,
            step_transient=0,
            host=host_optimizer,
            host_parameters=0,
            host_nvme=nvme,
        )
    # The fp32 gradient exists only while its sub-group steps (stage3.py _prepare_fp32_grad_for_sub_group):
    # a flattened 16-bit copy and its fp32 upcast of at most sub_group_size elements.
    step_elements = min(t // n, sub_group_size)
    return ModelStates(
        parameters=lp_params,
        gradients=d * t // n,
        optimizer_states=12 * t // n,
        zero3_gathered=gathered,
        step_transient=(d + 4) * step_elements,
        host=0,
    )


def init_cached_bytes(
    *, trainable: int, resident: int, dtype: str, zero_stage: int, offload_param: str = "none"
) -> int:
    """Bytes of the model's own weights that DeepSpeed's engine init frees into torch's cache and that stay
    reserved (their segments are then shared with small long-lived tensors, so ``empty_cache`` cannot return
    them; only the step's activations, of similar sizes, reuse them). The search's screen adds them to a step's
    reserved bytes; each figure is at most what the allocator replay of the init keeps
    (:mod:`search.streams.init`, :func:`search.streams.build.step_stream`), so the screen's term is a lower
    bound of the replay's (``tests/search/test_screen_bound.py``).

    - ZeRO-1/2: the optimizer copies the trainable 16-bit weights into one flat buffer (stage_1_and_2.py
      ``torch.cat`` while the originals exist) and points each ``p.data`` at it: the originals, d x T, are
      freed. The other init transients (the 16-bit partition's clone, the fp32 zero gradient) are reused
      exactly by the same-sized ``grads_in_partition`` and Adam ``exp_avg`` of the first step.
    - ZeRO-0 with a 16-bit dtype: FP16_Optimizer (bf16 too) clones every weight, flattens the clones and frees
      them, then frees the originals (fused_optimizer.py): 2 x d x T.
    - ZeRO-3: 0. Under ``deepspeed.zero.Init`` (the HF Trainer, Accelerate, TRL, OpenRLHF, DeepSpeed-Chat:
      ``store.model_build``) weights are partitioned as they are made and nothing is freed. A model built whole
      first (memplan's own loop) frees every original weight while it is partitioned, but ``defragment``
      (stage3.py ``_create_fp16_partitions_with_defragmentation``) then calls ``empty_cache()``, which gives back
      every segment no partition still holds: what stays is only the part of the segments holding a frozen
      partition (LoRA's base), which the replay counts block by block and which is never below 0. (Counting
      ``d x resident`` here, as the screen once did, made it prune ZeRO-3 plans the replay fits: issue 42.)
      With the parameters offloaded the model is built on the host and its weights never occupy the GPU.
    """
    d = DTYPE_BYTES[dtype]
    if zero_stage == 3:
        return 0
    if zero_stage == 0:
        return 2 * d * trainable if dtype != "fp32" else 0
    return d * trainable
