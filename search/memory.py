"""Bytes per GPU: model states as DeepSpeed lays them out, its buffers, activations and logits.

Pure functions. ``T`` is trainable parameters, ``F`` frozen ones (LoRA's base model), ``N`` the
data-parallel world size, ``d`` the bytes of the compute dtype. The ZeRO layouts follow
``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py`` and agree with DeepSpeed's own estimators
(``estimate_zero2_model_states_mem_needs``, ``estimate_zero3_model_states_mem_needs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from search.coefficients import Coefficients
from search.shapes import dropout_probs, largest_module_params, uses_rmsnorm
from store.ds_defaults import (
    CONTIGUOUS_GRADIENTS,
    OVERLAP_COMM,
    ZERO3_SUB_GROUP_SIZE,
    ZERO12_BUCKET_ELEMENTS,
    zero3_buckets,
)
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
    gradients_persist: bool  # gradients stay allocated between micro-steps

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
) -> ModelStates:
    """Model-state bytes per GPU for one trainable model under a ZeRO stage and offload choice."""
    d = DTYPE_BYTES[dtype]
    n = world_size
    t, f = trainable, frozen
    mixed = dtype != "fp32"
    offload_opt = offload_optimizer != "none"
    if zero_stage == 0:
        # No ZeRO: FP16_Optimizer (bf16 too) keeps fp32 master, m, v; at step() it flattens the 16-bit
        # grads and builds fp32 grads (2T + 4T transient). In fp32 the torch optimizer holds m and v.
        return ModelStates(
            parameters=d * (t + f),
            gradients=d * t,
            optimizer_states=(12 if mixed else 8) * t,
            zero3_gathered=0,
            step_transient=(6 * t) if mixed else 0,
            host=0,
            gradients_persist=grad_accum > 1,
        )
    fp32_partition = 16 * t // n  # fp32 master copy, its gradient, Adam m and v
    if zero_stage in (1, 2):
        # ZeRO-1 keeps param.grad whole until the accumulation boundary; ZeRO-2 reduces every micro-step.
        full_lp_grads = zero_stage == 1 and grad_accum > 1
        lp_grads = d * t if full_lp_grads else d * t // n
        if offload_opt:
            return ModelStates(d * (t + f), d * t if full_lp_grads else 0, 0, 0, 0, fp32_partition, True)
        # The reduced 16-bit partition (grads_in_partition) persists; its fp32 copy exists during step().
        return ModelStates(
            parameters=d * (t + f),
            gradients=lp_grads,
            optimizer_states=12 * t // n,
            zero3_gathered=0,
            step_transient=4 * t // n,
            host=0,
            gradients_persist=True,
        )
    # ZeRO-3: everything partitioned; the live module is gathered (params and full grads, 2 x d bytes).
    gathered = 2 * d * largest_module_params(model)
    lp_params = d * (t + f) // n
    # ZeRO-Infinity on NVMe keeps only swap buffers in host memory: a sub-group of optimizer states and
    # DeepSpeed's default parameter buffers (5 x 1e8 elements).
    host_optimizer = 16 * min(t // n, ZERO3_SUB_GROUP_SIZE) if offload_optimizer == "nvme" else fp32_partition
    host_params = 5 * 100_000_000 * d if offload_param == "nvme" else lp_params
    if offload_param != "none":
        return ModelStates(0, 0, 0, gathered, 0, host_optimizer + host_params, True)
    if offload_opt:
        return ModelStates(lp_params, 0, 0, gathered, 0, host_optimizer, True)
    # The fp32 gradient exists only while its sub-group steps (stage3.py _prepare_fp32_grad_for_sub_group):
    # a flattened 16-bit copy and its fp32 upcast of at most sub_group_size elements.
    step_elements = min(t // n, ZERO3_SUB_GROUP_SIZE)
    return ModelStates(
        parameters=lp_params,
        gradients=d * t // n,
        optimizer_states=12 * t // n,
        zero3_gathered=gathered,
        step_transient=(d + 4) * step_elements,
        host=0,
        gradients_persist=True,
    )


def deepspeed_buffers(model: ModelSpec, dtype: str, zero_stage: int, coef: Coefficients) -> int:
    """Communication buckets DeepSpeed allocates on the GPU, plus the cuBLAS workspace."""
    d = DTYPE_BYTES[dtype]
    workspace = int(coef.cublas_workspace_bytes)
    if zero_stage in (1, 2) and CONTIGUOUS_GRADIENTS:
        # setup_buckets(): one reduce_bucket_size buffer, two with overlap_comm.
        return workspace + (2 if OVERLAP_COMM else 1) * ZERO12_BUCKET_ELEMENTS * d
    if zero_stage == 3:
        buckets = zero3_buckets(model)
        return workspace + d * (buckets.reduce_bucket_size + buckets.prefetch_bucket_size)
    return workspace


@dataclass(frozen=True)
class Activations:
    """Activation bytes of one micro-batch: what backward keeps, and one layer's full set."""

    saved: int  # all layers, as kept for backward (or the checkpoints under recompute)
    layer: int  # one layer without checkpointing: the recompute and backward working set
    forward_working: int  # live while a no-grad forward (inference) runs one layer


def layer_activation_bytes(
    model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str, coef: Coefficients
) -> int:
    """Bytes one decoder layer saves for backward (Korthikanti et al. 2022, generalised).

    With h=hidden, i=intermediate and OPT/GPT shapes in fp16 with eager attention and dropout this is
    sbh(34 + 5as/h) as in the paper, up to the fp32 softmax that HF's eager attention keeps.
    """
    d = DTYPE_BYTES[dtype]
    bs = sequences * seq_len
    h, i = model.hidden_size, model.intermediate_size
    q_dim = model.num_heads * model.head_dim
    kv_dim = model.num_kv_heads * model.head_dim
    attn_p, hidden_p = dropout_probs(model)
    norm = (d + coef.rmsnorm_extra_bytes) if uses_rmsnorm(model) else d
    total = 2 * norm * bs * h  # the two norms' inputs
    total += d * bs * h  # QKV projection input
    if attn_impl == "eager":
        # repeat_kv expands K and V to every head before the score matmul
        total += d * bs * 3 * q_dim
        scores = sequences * model.num_heads * seq_len * seq_len
        total += coef.eager_softmax_bytes * scores + d * scores
        if attn_p > 0:
            total += scores  # dropout mask, one byte per element
    else:
        total += d * bs * (q_dim + 2 * kv_dim) + d * bs * q_dim  # q, k, v and the kernel's output
    total += d * bs * q_dim  # output projection input
    if hidden_p > 0:
        total += 2 * bs * h  # residual dropout masks after attention and after the MLP
    total += d * bs * h  # MLP input
    total += (4 if model.gated_mlp else 2) * d * bs * i  # gate/up/act/down inputs or fc1 out/act out
    return int(total)


def activations(
    model: ModelSpec,
    sequences: int,
    seq_len: int,
    dtype: str,
    attn_impl: str,
    checkpointing: bool,
    coef: Coefficients,
) -> Activations:
    """Activation bytes of a micro-batch of ``sequences`` sequences of ``seq_len`` tokens."""
    d = DTYPE_BYTES[dtype]
    bs_h = sequences * seq_len * model.hidden_size
    layer = layer_activation_bytes(model, sequences, seq_len, dtype, attn_impl, coef)
    outside_layers = 3 * d * bs_h  # embedding output, final norm input, LM head input
    per_layer = d * bs_h if checkpointing else layer  # under recompute each layer keeps only its input
    saved = model.num_layers * per_layer + outside_layers
    forward_working = 2 * d * bs_h + layer // 2
    return Activations(saved=int(saved), layer=int(layer), forward_working=int(forward_working))


def logits_bytes(model: ModelSpec, sequences: int, seq_len: int, dtype: str, coef: Coefficients) -> tuple[int, int]:
    """(training peak, no-grad forward peak) of the LM head's logits and the loss over them.

    Training: transformers' ForCausalLMLoss upcasts to fp32 and keeps the log-softmax output, and the
    backward holds two fp32 gradients of the same size. Inference: 16-bit logits plus the fp32 upcast.
    """
    elements = sequences * seq_len * model.vocab_size
    d = DTYPE_BYTES[dtype]
    training = int(max(coef.logits_peak_bytes, d + 8) * elements)
    inference = int((d + 4) * elements)
    return training, inference
