"""The strategy records: how one trained model is laid out (:class:`Strategy`, :class:`TrainedModelStrategy`),
how a frozen one is held (:class:`FrozenModelStrategy`), an RLHF step's models together (:class:`RLHFStrategy`),
and the checks that a layout is one DeepSpeed runs. ``store.records`` re-exports them beside the other records.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from store.choices import AllocatorSetting, EmptyCachePolicyName, OffloadDevice, values
from store.ds_buckets import ZeroBuckets
from store.errors import InputError, refuse_unknown_keys
from store.loss_chunks import LOSSES
from store.quantization import QUANTIZATIONS, quantization_label
from store.rollout import RolloutStrategy

OFFLOADS: tuple[str, ...] = values(OffloadDevice)
EMPTY_CACHE_POLICIES: tuple[str, ...] = values(EmptyCachePolicyName)
ALLOCATORS: tuple[str, ...] = values(AllocatorSetting)


@dataclass(frozen=True)
class Strategy:
    """Memory strategy for one trainable model: the docs/contracts.md single-model shape."""

    zero_stage: int = 0
    offload_optimizer: str = "none"
    offload_param: str = "none"
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    micro_batch: int = 1
    grad_accum: int = 1
    empty_cache: str = "never"
    allocator: str = "default"
    # "hf": transformers' loss over the whole logits; "chunked": the LM head and cross-entropy over chunks of
    # tokens (store.loss_chunks), never the whole logits (Liger-Kernel's fused linear cross-entropy)
    loss: str = "hf"
    # the ZeRO bucket keys a user's DeepSpeed config runs with (``planner check``); None: memplan's own, the
    # values its exported config carries (store.ds_defaults)
    ds_buckets: ZeroBuckets | None = None
    # the base weights as bitsandbytes holds them (store.quantization): "none" (16-bit), "nf4" or "int8" (QLoRA)
    quantization: str = "none"

    def __post_init__(self) -> None:
        problems = strategy_problems(self)
        if problems:
            raise InputError("strategy: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape; ``loss`` only when it is not the default ``"hf"`` and ``ds_buckets`` only when set
        (older documents stay as they are)."""
        shape = asdict(self)
        if self.loss == "hf":
            del shape["loss"]
        if self.ds_buckets is None:
            del shape["ds_buckets"]
        if self.quantization == "none":  # only when quantized: older documents stay as they are
            del shape["quantization"]
        return shape

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Strategy:
        """Build from the JSON shape; unknown keys are an InputError naming them."""
        if not isinstance(data, dict):
            raise InputError("strategy: expected a JSON object")
        refuse_unknown_keys(data, (f.name for f in fields(cls)), "strategy")
        if "ds_buckets" in data:
            data = {**data, "ds_buckets": ZeroBuckets.from_value(data["ds_buckets"])}
        return cls(**data)

    def with_(self, **changes: Any) -> Strategy:
        return replace(self, **changes)

    def describe(self) -> str:
        """A short human label: ``ZeRO-2 + ckpt, opt offload cpu, mb 4 x 2``."""
        parts = [f"ZeRO-{self.zero_stage}"]
        if self.offload_optimizer != "none":
            parts.append(f"opt->{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"param->{self.offload_param}")
        if self.gradient_checkpointing:
            parts.append("ckpt")
        if self.lora_rank:
            parts.append(quantization_label(self.quantization, self.lora_rank))
        parts.append(f"mb {self.micro_batch}x{self.grad_accum}")
        if self.empty_cache != "never":
            parts.append(f"empty_cache {self.empty_cache}")
        if self.allocator != "default":
            parts.append(self.allocator)
        if self.loss != "hf":
            parts.append(f"{self.loss} loss")
        if self.ds_buckets is not None:
            b = self.ds_buckets
            parts.append(f"buckets {b.reduce_bucket_size:.0e}{' overlapped' if b.overlap_comm else ''}")
        return ", ".join(parts)


MAX_COUNT = 2**20  # ranks, micro-batches and accumulation steps beyond a million are typos, not plans


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def layout_problems(s: Strategy | TrainedModelStrategy) -> list[str]:
    """What makes a model's memory layout (ZeRO stage, offload, checkpointing, LoRA) impossible."""
    problems: list[str] = []
    if s.zero_stage not in (0, 1, 2, 3) or isinstance(s.zero_stage, bool):
        problems.append(f"zero_stage must be 0, 1, 2 or 3, not {s.zero_stage!r}")
    if s.offload_optimizer not in OFFLOADS:
        problems.append(f"offload_optimizer must be one of {', '.join(OFFLOADS)}, not {s.offload_optimizer!r}")
    if s.offload_param not in OFFLOADS:
        problems.append(f"offload_param must be one of {', '.join(OFFLOADS)}, not {s.offload_param!r}")
    elif s.offload_param != "none" and s.zero_stage != 3:
        problems.append("offload_param needs zero_stage 3")
    elif s.offload_param != "none" and s.offload_optimizer == "none":
        problems.append("offload_param needs offload_optimizer too (ZeRO-Infinity offloads both)")
    if s.offload_optimizer != "none" and s.zero_stage == 0:
        problems.append("offload_optimizer needs zero_stage 1, 2 or 3")
    elif s.offload_optimizer == "nvme" and s.zero_stage in (1, 2):
        problems.append("offload_optimizer nvme needs zero_stage 3 (ZeRO-1/2 keep offloaded states in host memory)")
    if not isinstance(s.gradient_checkpointing, bool):
        problems.append("gradient_checkpointing must be true or false")
    for name in ("lora_rank",):
        value = getattr(s, name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
            problems.append(f"{name} must be a whole number from 0 to {MAX_COUNT}, not {_shown(value)}")
    problems.extend(quantization_problems(s))
    return problems


def quantization_problems(s: Strategy | TrainedModelStrategy) -> list[str]:
    """What makes a QLoRA layout impossible or unmodeled: quantized base weights train only through LoRA
    adapters. Under ZeRO-3 only nf4 is planned, as PEFT's ZeRO-3 QLoRA recipe runs it (``bnb_4bit_quant_storage``
    in the compute dtype, so DeepSpeed flattens and partitions the packed codes with the 16-bit parameters;
    ``store.quantization.qlora_loading``); bitsandbytes' int8 weights have no storage dtype to choose (``Int8Params``
    hold int8 codes beside a per-row scale DeepSpeed does not know), so int8 stays at ZeRO-0/1/2."""
    q = s.quantization
    if q not in QUANTIZATIONS:
        return [f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {_shown(q)}"]
    if q == "none":
        return []
    problems: list[str] = []
    if not (isinstance(s.lora_rank, int) and s.lora_rank > 0):
        problems.append(f"quantization {q} (QLoRA) trains LoRA adapters on frozen quantized weights: set lora_rank > 0")
    if s.zero_stage == 3 and q != "nf4":
        problems.append(
            f"quantization {q} with zero_stage 3 is not planned: ZeRO-3 partitions 4-bit weights stored in the "
            "compute dtype (bnb_4bit_quant_storage); bitsandbytes' int8 weights have no such storage. Use nf4, or "
            "zero_stage 0, 1 or 2"
        )
    return problems


def strategy_problems(strategy: Strategy) -> list[str]:
    """Everything that makes ``strategy`` impossible, as readable phrases (empty when valid)."""
    s = strategy
    problems = layout_problems(s)
    for name in ("micro_batch", "grad_accum"):
        value = getattr(s, name)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_COUNT:
            problems.append(f"{name} must be a whole number from 1 to {MAX_COUNT}, not {_shown(value)}")
    if s.empty_cache not in EMPTY_CACHE_POLICIES:
        problems.append(f"empty_cache must be one of {', '.join(EMPTY_CACHE_POLICIES)}, not {s.empty_cache!r}")
    if s.allocator not in ALLOCATORS:
        problems.append(f"allocator must be one of {', '.join(ALLOCATORS)}, not {s.allocator!r}")
    if s.loss not in LOSSES:
        problems.append(f"loss must be one of {', '.join(LOSSES)}, not {_shown(s.loss)}")
    if s.ds_buckets is not None and not isinstance(s.ds_buckets, ZeroBuckets):
        problems.append("ds_buckets must be a bucket block (store.ds_buckets.ZeroBuckets) or null")
    return problems


# --- RLHF: per-model blocks plus the step-wide knobs (docs/contracts.md's RLHF strategy shape) ----------------


@dataclass(frozen=True)
class TrainedModelStrategy:
    """How one trained RLHF model (actor or critic) is laid out: the single-model knobs that are per model."""

    zero_stage: int = 2
    offload_optimizer: str = "none"
    offload_param: str = "none"
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    quantization: str = "none"  # QLoRA's base weights (store.quantization); last, so positional callers stay

    def __post_init__(self) -> None:
        problems = layout_problems(self)
        if problems:
            raise InputError("strategy: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        shape = asdict(self)
        if self.quantization == "none":  # only when quantized: older documents stay as they are
            del shape["quantization"]
        return shape

    def describe(self) -> str:
        parts = [f"Z{self.zero_stage}"]
        if self.offload_optimizer != "none":
            parts.append(f"opt->{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"param->{self.offload_param}")
        if self.gradient_checkpointing:
            parts.append("ckpt")
        if self.lora_rank:
            parts.append(quantization_label(self.quantization, self.lora_rank))
        return " ".join(parts)


@dataclass(frozen=True)
class FrozenModelStrategy:
    """How a frozen RLHF model (reference or reward) is held: whole, ZeRO-3 partitioned, or offloaded.

    Offload follows DeepSpeed-Chat's ``--offload_reference_model`` (its reward model is offloaded only through
    ``--offload`` with a ZeRO-3 critic): ZeRO-3 with parameters offloaded to the host, gathered layer by layer
    for each forward.
    """

    zero_stage: int = 0
    offload: str = "none"

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 3) or isinstance(self.zero_stage, bool):
            raise InputError(f"strategy: a frozen model's zero_stage must be 0 or 3, not {self.zero_stage!r}")
        if self.offload not in ("none", "cpu"):
            raise InputError(f"strategy: a frozen model's offload must be none or cpu, not {self.offload!r}")
        if self.offload == "cpu" and self.zero_stage != 3:
            raise InputError("strategy: offloading a frozen model needs zero_stage 3 (DeepSpeed-Chat does the same)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return f"Z{self.zero_stage}" + (" offload" if self.offload != "none" else "")


@dataclass(frozen=True)
class RLHFStrategy:
    """Strategy of an RLHF step: actor, critic (PPO only), reference and reward blocks, step-wide knobs.

    ``generation_batch`` counts prompts per GPU per generation call; ``micro_batch`` counts sequences
    per GPU per training micro-step; ``grad_accum`` micro-steps make one optimizer step.
    """

    actor: TrainedModelStrategy = field(default_factory=TrainedModelStrategy)
    critic: TrainedModelStrategy | None = field(default_factory=TrainedModelStrategy)
    reference: FrozenModelStrategy = field(default_factory=FrozenModelStrategy)
    reward: FrozenModelStrategy = field(default_factory=FrozenModelStrategy)
    hybrid_engine: bool = True
    ema: bool = False
    generation_batch: int = 4
    micro_batch: int = 4
    grad_accum: int = 1
    empty_cache: str = "after-generation"
    allocator: str = "default"
    # None: DeepSpeed generates (``hybrid_engine`` says how); a vLLM or SGLang engine otherwise (store.rollout)
    rollout: RolloutStrategy | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.rollout is not None and not isinstance(self.rollout, RolloutStrategy):
            problems.append("rollout must be a rollout block (store.rollout.RolloutStrategy)")
        elif self.rollout is not None and self.hybrid_engine is True:
            problems.append(f"hybrid_engine must be false with a {self.rollout.engine} rollout engine")
        for name in ("generation_batch", "micro_batch", "grad_accum"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a whole number >= 1, not {value!r}")
        for name in ("hybrid_engine", "ema"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be true or false")
        if self.empty_cache not in EMPTY_CACHE_POLICIES:
            problems.append(f"empty_cache must be one of {', '.join(EMPTY_CACHE_POLICIES)}, not {self.empty_cache!r}")
        if self.allocator not in ALLOCATORS:
            problems.append(f"allocator must be one of {', '.join(ALLOCATORS)}, not {self.allocator!r}")
        for role, block in (("actor", self.actor), ("critic", self.critic)):
            if isinstance(block, TrainedModelStrategy) and block.quantization != "none":
                problems.append(
                    f"{role} quantization {block.quantization}: QLoRA is planned for single-model training (sft, "
                    "reward, dpo) only; DeepSpeed-Chat, OpenRLHF and veRL exports have no bitsandbytes loading"
                )
        if problems:
            raise InputError("strategy: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"actor": self.actor.to_dict()}
        if self.critic is not None:
            out["critic"] = self.critic.to_dict()
        out["reference"] = self.reference.to_dict()
        out["reward"] = self.reward.to_dict()
        for name in (
            "hybrid_engine",
            "ema",
            "generation_batch",
            "micro_batch",
            "grad_accum",
            "empty_cache",
            "allocator",
        ):
            out[name] = getattr(self, name)
        if self.rollout is not None:  # only then: older documents stay as they are
            out["rollout"] = self.rollout.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RLHFStrategy:
        """Build from the docs/contracts.md RLHF shape; unknown keys are an InputError naming them."""
        if not isinstance(data, dict):
            raise InputError("strategy: expected a JSON object")
        refuse_unknown_keys(data, (f.name for f in fields(cls)), "strategy")
        values = dict(data)
        blocks: dict[str, type[TrainedModelStrategy] | type[FrozenModelStrategy]] = {
            "actor": TrainedModelStrategy,
            "critic": TrainedModelStrategy,
            "reference": FrozenModelStrategy,
            "reward": FrozenModelStrategy,
        }
        for name, block in blocks.items():
            if name in values and values[name] is not None:
                if not isinstance(values[name], dict):
                    raise InputError(f"strategy: {name} must be an object")
                try:
                    values[name] = block(**values[name])
                except TypeError as exc:
                    raise InputError(f"strategy: {name}: {exc}") from None
        if "critic" not in data:
            values["critic"] = None
        if "rollout" in values:
            values["rollout"] = RolloutStrategy.from_value(values["rollout"])
            if values["rollout"] is not None and "hybrid_engine" not in values:
                values["hybrid_engine"] = False  # the engine generates: DeepSpeed's hybrid engine is off
        return cls(**values)

    def with_(self, **changes: Any) -> RLHFStrategy:
        return replace(self, **changes)

    def describe(self, roles: Collection[str] | None = None) -> str:
        """A short label (:func:`strategy_label` gives it the job's roles); with ``roles`` (the job's roles), a
        frozen model the job does not hold (no reference at
        a KL coefficient of 0, no reward model with rule-based rewards) is said to be absent instead of placed."""
        parts = [f"actor {self.actor.describe()}"]
        if self.critic is not None:
            parts.append(f"critic {self.critic.describe()}")
        held = set(roles) if roles is not None else {"reference", "reward"}
        parts.append(f"ref {self.reference.describe()}" if "reference" in held else "no ref")
        parts.append(f"rm {self.reward.describe()}" if "reward" in held else "no rm")
        parts.append(f"gen {self.generation_batch}, mb {self.micro_batch}x{self.grad_accum}")
        if self.hybrid_engine:
            parts.append("HE")
        if self.rollout is not None:
            parts.append(self.rollout.describe())
        if self.ema:
            parts.append("EMA")
        if self.empty_cache != "never":
            parts.append(f"empty_cache {self.empty_cache}")
        if self.allocator != "default":
            parts.append(self.allocator)
        return ", ".join(parts)
