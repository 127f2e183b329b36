"""The vocabulary of a trained model's moments: the live parts, a moment's bytes, the tensors a moment holds
by name, and one model's moments per training phase (:class:`TrainingMoments`). :mod:`search.model.moments`
and :mod:`search.model.deepspeed_tensors` build them."""

from __future__ import annotations

from dataclasses import dataclass

from search.model.zero_buffers import ZeroWorkspace

# The bytes live beside the resident ones at one moment, named as in the JSON breakdown (``buffers``:
# DeepSpeed's buckets that exist only for a while, such as ZeRO-1/2's reduce buckets during a backward).
LIVE_PARTS = ("gradients", "zero3_gathered", "activations", "logits", "buffers")
Moment = dict[str, int]
TRAINING_PHASES = ("forward", "backward", "optimizer_step")


@dataclass(frozen=True)
class Named:
    """A tensor a moment holds by name, in a live part: the allocation stream (:mod:`search.streams`) makes
    it once and frees it when a later moment no longer names it, in whatever order that is (the rest of a
    part's bytes come and go last made, first freed). ``stream``: the CUDA stream it is allocated on (0 the
    default; 1 a side stream, whose blocks torch's allocator keeps in a pool of their own)."""

    part: str
    name: str
    size: int
    stream: int = 0


NamedTensors = tuple[Named, ...]
REDUCTION_STREAM = 1  # DeepSpeed's reduction_stream (ZeRO-1/2 with overlap_comm on a device with streams)
# ZeRO-2's gradient tensors (stage_1_and_2.py): grads_in_partition, made at the first reduce-bucket flush
# and kept to step(); get_grad_norm_direct's fp64 upcast of one gradient; the flattened 16-bit partition
# and its fp32 upcast (single_grad_partition), which step() makes, then frees the first two before Adam.
GRAD_PARTITION, GRAD_NORM, FLAT_GRADS, FP32_GRADS = "grad_partition", "grad_norm", "flat_grads", "fp32_grads"
# Without ZeRO: the engine's allreduce flattens the 16-bit gradients (one bucket) after a boundary backward;
# FP16_Optimizer.step() upcasts each 16-bit gradient to fp32 (a group of tensors, one per parameter) and
# flattens those into one fp32 gradient (fused_optimizer.py).
ALLREDUCE_FLAT, FP32_UPCASTS, FP32_FLAT = "allreduce_flat", "fp32_upcasts", "fp32_flat"
# transformers' cross-entropy (ForCausalLMLoss): the 16-bit logits, their fp32 upcast, the log-softmax, and
# in the backward the NLL's and the log-softmax's fp32 gradients.
LOGITS, LOGITS_FP32, LOG_SOFTMAX = "logits", "logits_fp32", "log_softmax"
NLL_GRAD, LOG_SOFTMAX_GRAD = "nll_grad", "log_softmax_grad"


def moment(**parts: int) -> Moment:
    """The bytes live beside the resident ones at one moment of a phase (every LIVE_PARTS name present)."""
    unknown = set(parts) - set(LIVE_PARTS)
    if unknown:
        raise ValueError(f"unknown live parts {sorted(unknown)}")
    return {name: int(parts.get(name, 0)) for name in LIVE_PARTS}


def plus(base: Moment, **parts: int) -> Moment:
    """``base`` with ``parts`` added."""
    extra = moment(**parts)
    return {name: base[name] + extra[name] for name in LIVE_PARTS}


def between_micro_steps(work: ZeroWorkspace) -> Moment:
    """What a trained model keeps alive between its micro-steps beyond the resident bytes: gradients
    accumulated over an optimizer step and, under ZeRO-1, the reduce buckets set up by its first backward."""
    return moment(gradients=work.carried_grads, buffers=work.backward_buckets if work.buckets_carried else 0)


@dataclass(frozen=True)
class TrainingMoments:
    """What one trained model adds to its resident bytes, moment by moment, per training phase."""

    base: Moment  # alive before a micro-step starts: carried gradients (and ZeRO-1's carried buckets)
    gathered_params: int  # ZeRO-3 parameters gathered for the running module (0 on one rank)
    phases: dict[str, list[Moment]]  # forward, backward, optimizer_step: the candidate peak moments
    named: dict[str, list[NamedTensors]] | None = None  # per phase and moment, the tensors held by name

    def named_of(self, phase: str) -> tuple[NamedTensors, ...]:
        """The named tensors of each moment of ``phase`` (empty where none are named)."""
        named = (self.named or {}).get(phase)
        return tuple(named) if named else tuple(() for _ in self.phases[phase])

    @property
    def steady(self) -> int:
        """Gradients alive between micro-steps: what is not allocated and freed within a step's phases."""
        return self.base["gradients"]

    @property
    def carried(self) -> int:
        """Every byte alive between micro-steps (the gradients and ZeRO-1's reduce buckets under accumulation)."""
        return sum(self.base.values())


def largest(moments: list[Moment]) -> Moment:
    """The moment with the most live bytes."""
    return max(moments, key=lambda parts: sum(parts.values()))
