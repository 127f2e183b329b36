"""The rollout engine block of an RLHF strategy: who generates the experience, where, and how it sleeps.

``RLHFStrategy.rollout`` is ``None`` for DeepSpeed's own generation (the hybrid engine, or HF ``generate``
on the DeepSpeed actor: ``hybrid_engine`` says which), as in DeepSpeed-Chat. A :class:`RolloutStrategy`
puts the rollout on a separate inference engine, as OpenRLHF, TRL's GRPOTrainer and veRL run it since 2025:

- ``engine``: ``"vllm"`` or ``"sglang"``.
- ``placement``: ``"colocate"`` (the engine shares every training GPU and takes turns with the trainer:
  OpenRLHF ``--colocate_all_models``, TRL ``vllm_mode="colocate"``, veRL's hybrid engine) or ``"separate"``
  (``engine_gpus`` GPUs of each node run only the engine; the trainer has the others: OpenRLHF without
  colocation, TRL ``vllm_mode="server"``).
- ``tensor_parallel``: GPUs one engine replica spans (``vllm_tensor_parallel_size``).
- ``gpu_memory_utilization``: vLLM's ``gpu_memory_utilization`` (SGLang's ``mem_fraction_static``), the share
  of the GPU's memory the engine may take; ``None`` lets the planner solve for it.
- ``sleep_level``: what leaves the GPU while the trainer runs: 0 nothing; 1 the KV cache is discarded and
  the weights are backed up in host memory (vLLM ``sleep(level=1)``); 2 both are discarded (the trainer's
  weight sync refills them).
- ``offload_training``: DeepSpeed's ``offload_states`` of the trained models during the rollout (OpenRLHF
  ``--deepspeed_enable_sleep``): optimizer states, fp32 master weights and gradients go to host memory; the
  16-bit weights stay.
- ``enforce_eager``: no CUDA graphs for decoding (less memory, slower decoding).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from store.choices import RolloutEngine, values
from store.errors import InputError, refuse_unknown_keys

ROLLOUT_ENGINES: tuple[str, ...] = values(RolloutEngine)  # "hybrid-engine": DeepSpeed's own
INFERENCE_ENGINES: tuple[str, ...] = tuple(name for name in ROLLOUT_ENGINES if name != RolloutEngine.HYBRID_ENGINE)
ROLLOUT_PLACEMENTS: tuple[str, ...] = ("colocate", "separate")
SLEEP_LEVELS: tuple[int, ...] = (0, 1, 2)


@dataclass(frozen=True)
class RolloutStrategy:
    """A vLLM or SGLang rollout engine beside the DeepSpeed trainer (see the module docstring)."""

    engine: str = "vllm"
    placement: str = "colocate"
    engine_gpus: int = 0  # separate placement: GPUs per node that run only the engine (taken from --gpus)
    tensor_parallel: int = 1
    gpu_memory_utilization: float | None = None  # None: the planner solves for it
    sleep_level: int = 1
    offload_training: bool = True
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        problems = rollout_problems(self)
        if problems:
            raise InputError("strategy: rollout: " + "; ".join(problems))

    @property
    def colocated(self) -> bool:
        return self.placement == "colocate"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_value(cls, value: Any) -> RolloutStrategy | None:
        """The block from its JSON value: an object, or an engine name as shorthand (``"vllm"``).

        ``None`` and ``"hybrid-engine"`` mean DeepSpeed's own generation (returns None)."""
        if value is None or value == "hybrid-engine":
            return None
        if isinstance(value, str):
            if value not in ROLLOUT_ENGINES:
                raise InputError(f"strategy: rollout must be one of {', '.join(ROLLOUT_ENGINES)}, not {value!r}")
            return cls(engine=value)
        if isinstance(value, RolloutStrategy):
            return value
        if not isinstance(value, dict):
            raise InputError("strategy: rollout must be an engine name or an object")
        refuse_unknown_keys(value, (f.name for f in fields(cls)), "strategy: rollout")
        if value.get("engine") == "hybrid-engine":
            return None
        return cls(**value)

    def with_(self, **changes: Any) -> RolloutStrategy:
        return replace(self, **changes)

    def describe(self) -> str:
        """A short label: ``vLLM colocate tp1 u0.45 sleep1 +ds-sleep``."""
        name = {"vllm": "vLLM", "sglang": "SGLang"}[self.engine]
        parts = [name, self.placement if self.colocated else f"separate {self.engine_gpus} GPU/node"]
        parts.append(f"tp{self.tensor_parallel}")
        if self.gpu_memory_utilization is not None:
            parts.append(f"u{self.gpu_memory_utilization:.2f}")
        parts.append(f"sleep{self.sleep_level}")
        if self.offload_training:
            parts.append("+ds-sleep")
        if self.enforce_eager:
            parts.append("eager")
        return " ".join(parts)


def refuses_expandable_segments(rollout: RolloutStrategy | None) -> bool:
    """True when the plan's rollout engine cannot run beside ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.

    A vLLM engine that sleeps allocates its weights and KV cache through its ``CuMemAllocator`` (vLLM's
    ``vllm/device_allocator/cumem.py``, ``CuMemAllocator.__init__``), which asserts that the process's
    ``PYTORCH_CUDA_ALLOC_CONF`` holds no ``expandable_segments:True``. Colocated, the engine shares the trainer's
    environment in every framework memplan exports for: TRL's ``vllm_mode="colocate"`` and veRL's hybrid worker
    run it in the trainer's own process; OpenRLHF starts its engines in the same Ray job, whose ``runtime_env``
    is one for all actors. Such a plan keeps the allocator's default.
    """
    return rollout is not None and rollout.engine == "vllm" and rollout.colocated and rollout.sleep_level > 0


def rollout_problems(r: RolloutStrategy) -> list[str]:
    """What makes a rollout block impossible, as readable phrases (empty when valid)."""
    problems: list[str] = []
    if r.engine not in INFERENCE_ENGINES:
        problems.append(f"engine must be one of {', '.join(ROLLOUT_ENGINES)}, not {r.engine!r}")
    if r.placement not in ROLLOUT_PLACEMENTS:
        problems.append(f"placement must be one of {', '.join(ROLLOUT_PLACEMENTS)}, not {r.placement!r}")
    for name, least in (("engine_gpus", 0), ("tensor_parallel", 1)):
        value = getattr(r, name)
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= 1024:
            problems.append(f"{name} must be a whole number from {least} to 1024, not {value!r}")
    if not problems and r.placement == "colocate" and r.engine_gpus:
        problems.append("engine_gpus is for the separate placement (a colocated engine shares every GPU)")
    if not problems and r.placement == "separate" and r.engine_gpus < 1:
        problems.append("the separate placement needs engine_gpus >= 1 (GPUs per node for the engine)")
    if not problems and r.placement == "separate" and r.engine_gpus % r.tensor_parallel:
        problems.append(f"tensor_parallel {r.tensor_parallel} must divide engine_gpus {r.engine_gpus}")
    u = r.gpu_memory_utilization
    if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0):
        problems.append(f"gpu_memory_utilization must be a number in (0, 1], not {u!r}")
    if r.sleep_level not in SLEEP_LEVELS or isinstance(r.sleep_level, bool):
        problems.append(f"sleep_level must be 0, 1 or 2, not {r.sleep_level!r}")
    for name in ("offload_training", "enforce_eager"):
        if not isinstance(getattr(r, name), bool):
            problems.append(f"{name} must be true or false")
    if not problems and r.placement == "separate" and r.sleep_level:
        problems.append("an engine on its own GPUs has nothing to make room for: sleep_level must be 0")
    if not problems and r.placement == "separate" and r.offload_training:
        problems.append("offload_training makes room for a colocated engine; the separate placement needs none")
    return problems
