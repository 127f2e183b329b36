"""Host memory per node, by phase and by part: what fills it, and which phase sets its peak.

A run's host memory goes through phases that never overlap, so the host's peak (``host_bytes``, the bytes
``--cpu-mem`` must hold) is the largest phase, not their sum, and the breakdown is that phase's parts:

- ``steady``: held from ``deepspeed.initialize`` through every step;
- ``loading``: before ``deepspeed.initialize``, every local rank holds one model's 16-bit copy as it loads
  (``zero.Init`` builds ZeRO-3 models partitioned, so 1/N of it); once the engine moved it to the GPU (or
  partitioned it onto the host) that copy is gone. RLHF loads one model at a time.

Later parts add named parts or phases (:meth:`HostMemory.plus`). Parts, bytes per node (per-GPU bytes times
the GPUs per node):

- ``offloaded_optimizer_states``: ZeRO-Offload's fp32 master partition, its gradient and Adam's m and v
  (16 bytes per trainable parameter over N ranks);
- ``offloaded_parameters``: ZeRO-3's 16-bit parameter partition with ``offload_param`` cpu;
- ``nvme_staging``: ZeRO-Infinity's host swap buffers of states offloaded to NVMe (an optimizer sub-group,
  DeepSpeed's default parameter buffers);
- ``pinned_buffers``: the host buffers DeepSpeed's ZeRO optimizer allocates beside the offloaded states
  (pinned: offload ``pin_memory`` defaults to true, ``runtime/zero/offload_config.py``), as
  :class:`search.model.zero_buffers.ZeroWorkspace` counts them: ZeRO-1/2
  ``param_buffer_of_bit16_for_cpu_offload_groups`` (a 16-bit copy of the partition, ``stage_1_and_2.py``
  __init__, after ``weights_partition`` is pinned),
  ``temp_grad_buffer_for_cpu_offload`` (the largest parameter, 16-bit), ``accumulated_grads_in_cpu`` with
  gradient accumulation (``buffer_to_accumulate_to_in_cpu``); ZeRO-3 ``grad_partitions_flat_buffer`` (the
  16-bit gradient partition, on ``self.device``, the CPU with optimizer offload, NVMe included);
- ``buffer_slack``: the rest of DeepSpeed's estimators' ``additional_buffer_factor`` (1.5 x the offloaded
  states, ``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``:
  ``coef.host_buffer_factor``) beyond the named buffers. What it stands for: torch's pinned-memory
  allocator rounds every pinned tensor up to a power of two (``ATen/core/CachingHostAllocator.h``,
  ``PowerOf2Ceil``), and CPU Adam's temporaries. A model's steady bytes are thus
  ``max(factor x states, states + pinned buffers)``: the estimator's figure unless DeepSpeed's own buffers
  exceed it;
- ``frozen_models``: the reference and reward weights offloaded under ZeRO-3 (16-bit partitions);
- ``ema``: DeepSpeed-Chat's EMA copy of the actor when it lives on the host (ZeRO-3 with offloaded parameters);
- ``model_loading``: the loading phase's 16-bit copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from search.coefficients import Coefficients
from search.model.placement import TrainedPlacement

STEADY = "steady"
LOADING = "loading"


@dataclass(frozen=True)
class HostMemory:
    """Host bytes per node of each phase of a run, by part (a phase's parts are held at the same time)."""

    phases: dict[str, dict[str, int]]

    def plus(self, phase: str, parts: Mapping[str, int]) -> HostMemory:
        """These bytes per node added to ``phase`` (a new phase when absent), summed with parts of the same name."""
        merged = dict(self.phases.get(phase, {}))
        for name, value in parts.items():
            merged[name] = merged.get(name, 0) + int(value)
        return HostMemory({**self.phases, phase: merged})

    @property
    def totals(self) -> dict[str, int]:
        """Bytes per node of each phase."""
        return {phase: sum(parts.values()) for phase, parts in self.phases.items()}

    @property
    def peak_phase(self) -> str:
        """The phase that sets the peak (the first of equals: ``steady`` before ``loading``)."""
        totals = self.totals
        return max(totals, key=lambda phase: totals[phase]) if totals else STEADY

    @property
    def bytes(self) -> int:
        """The host's peak per node: the largest phase."""
        return max(self.totals.values(), default=0)

    @property
    def breakdown(self) -> dict[str, int]:
        """The peak phase's parts with bytes, summing to :attr:`bytes`."""
        return {name: value for name, value in self.phases.get(self.peak_phase, {}).items() if value}


def trained_host(p: TrainedPlacement, coef: Coefficients) -> dict[str, float]:
    """A trained model's steady host bytes per GPU by part (``buffer_slack`` is fractional; see the module)."""
    s = p.states
    return {
        "offloaded_optimizer_states": s.host - s.host_parameters - s.host_nvme,
        "offloaded_parameters": s.host_parameters,
        "nvme_staging": s.host_nvme,
        "pinned_buffers": p.work.host,
        "buffer_slack": max(0.0, (coef.host_buffer_factor - 1.0) * s.host - p.work.host),
    }


def trained_host_bytes(p: TrainedPlacement, coef: Coefficients) -> float:
    """A trained model's steady host bytes per GPU: ``max(factor x states, states + pinned buffers)``."""
    return sum(trained_host(p, coef).values())


def per_node(per_gpu: Mapping[str, float], gpus: int) -> dict[str, int]:
    """Bytes per GPU by part, summed over parts of the same name as given, times the GPUs per node (a
    fractional part rounds down after the multiplication, as the node's total does)."""
    return {name: int(value * gpus) for name, value in per_gpu.items()}


def add_parts(*parts: Mapping[str, float]) -> dict[str, float]:
    """Parts of several models summed by name (the order of first appearance kept)."""
    total: dict[str, float] = {}
    for part in parts:
        for name, value in part.items():
            total[name] = total.get(name, 0) + value
    return total
