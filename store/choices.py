"""The closed sets of memplan's settings as string enums, each declared once.

The CLI (its options' choices), the JSON Schemas (``planner/schema/``: their ``enum`` lists) and the store (the
values ``store.records``, ``store.rollout``, ``store.quantization``, ``store.frameworks`` and ``store.phases``
accept) all read these. A member is a ``str`` and compares equal to its value (``OffloadDevice.CPU == "cpu"``),
so JSON documents, stored rows and strategy dictionaries hold the same strings as before; PyTorch's memory
tracker keeps its closed sets the same way (``_MemRefType`` in ``torch/distributed/_tools/mem_tracker.py``).

``store`` is the ground floor, so every package (``search``, which never imports torch, included) may import
this module.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "AllocatorSetting",
    "EmptyCachePolicyName",
    "Framework",
    "OffloadDevice",
    "Phase",
    "Quantization",
    "RolloutEngine",
    "values",
]


class OffloadDevice(StrEnum):
    """Where ZeRO offloads optimizer states or parameters (``offload_optimizer.device``): nowhere, host or NVMe."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class EmptyCachePolicyName(StrEnum):
    """Where ``torch.cuda.empty_cache()`` is called in a step (``store.phases.EMPTY_CACHE_AFTER`` says after what)."""

    NEVER = "never"
    AFTER_GENERATION = "after-generation"
    AFTER_INFERENCE = "after-inference"
    AFTER_PHASE = "after-phase"
    EVERY_STEP = "every-step"


class AllocatorSetting(StrEnum):
    """The caching allocator's setting: PyTorch's default or ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``."""

    DEFAULT = "default"
    EXPANDABLE_SEGMENTS = "expandable-segments"


class Quantization(StrEnum):
    """QLoRA's base weights (``store.quantization``): 16-bit, bitsandbytes' NF4 or int8."""

    NONE = "none"
    NF4 = "nf4"
    INT8 = "int8"


class Framework(StrEnum):
    """The program a plan is made for (``--framework``; ``store.frameworks``); ``deepspeed`` is memplan's own loop."""

    DEEPSPEED = "deepspeed"
    HF = "hf"
    ACCELERATE = "accelerate"
    TRL = "trl"
    OPENRLHF = "openrlhf"
    VERL = "verl"
    DEEPSPEED_CHAT = "deepspeed-chat"


class RolloutEngine(StrEnum):
    """What generates an RLHF step's rollouts: DeepSpeed's hybrid engine, or a vLLM / SGLang engine beside it."""

    HYBRID_ENGINE = "hybrid-engine"
    VLLM = "vllm"
    SGLANG = "sglang"


class Phase(StrEnum):
    """The phases of a training step (``store.phases.PHASES`` says which each workload kind runs, in order)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer_step"
    REFERENCE_FORWARD = "reference_forward"
    GENERATION = "generation"
    SCORING = "scoring"
    ACTOR_TRAINING = "actor_training"
    CRITIC_TRAINING = "critic_training"


def values(choices: type[StrEnum]) -> tuple[str, ...]:
    """The plain string values of ``choices``, in declaration order (what the store's tuples hold)."""
    return tuple(member.value for member in choices)
