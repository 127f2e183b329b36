"""The ``strategy`` of a plan or prediction as a typed, read-only record over its JSON object.

``PlanStrategy`` is the JSON object of DESIGN.md's strategy shape (single model, or RLHF's per-model blocks
plus the step-wide knobs) and stays one: a ``dict`` whose ``json.dumps`` and ``model_dump()`` are the document's
``strategy`` as before, key for key. Beside ``strategy["lora_rank"]`` it offers typed attributes a type checker
checks (``plan.strategy.lora_rank: int | None``): ``None`` where the shape has no such key (``zero_stage`` of an
RLHF strategy lives in ``strategy.actor``). It refuses changes (``TypeError``): a plan's strategy is what was
predicted.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NoReturn, TypeVar

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from store.choices import AllocatorSetting, EmptyCachePolicyName, OffloadDevice, Quantization, RolloutEngine

__all__ = ["FrozenModelBlock", "PlanStrategy", "TrainedModelBlock"]


class _Record(dict[str, Any]):
    """A read-only ``dict`` (pickles and copies as its class)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__} is read-only: build a new strategy instead")

    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        self._refuse()

    def __reduce__(self) -> tuple[type[_Record], tuple[dict[str, Any]]]:
        return type(self), (dict(self),)

    def __copy__(self) -> _Record:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _Record:
        import copy

        return type(self)(copy.deepcopy(dict(self), memo))

    def _int(self, key: str) -> int | None:
        value = self.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _str(self, key: str) -> str | None:
        value = self.get(key)
        return value if isinstance(value, str) else None

    def _bool(self, key: str) -> bool | None:
        value = self.get(key)
        return value if isinstance(value, bool) else None


class TrainedModelBlock(_Record):
    """A trained RLHF model's block (``actor``, ``critic``): how its states are laid out."""

    @property
    def zero_stage(self) -> int | None:
        return self._int("zero_stage")

    @property
    def offload_optimizer(self) -> str | None:
        return self._str("offload_optimizer")

    @property
    def offload_param(self) -> str | None:
        return self._str("offload_param")

    @property
    def gradient_checkpointing(self) -> bool | None:
        return self._bool("gradient_checkpointing")

    @property
    def lora_rank(self) -> int | None:
        return self._int("lora_rank")

    @property
    def quantization(self) -> str:
        """``none`` (16-bit base weights), ``nf4`` or ``int8`` (QLoRA); the key is written only when quantized."""
        return self._str("quantization") or "none"


class FrozenModelBlock(_Record):
    """A frozen RLHF model's block (``reference``, ``reward``): whole, ZeRO-3 partitioned, or offloaded."""

    @property
    def zero_stage(self) -> int | None:
        return self._int("zero_stage")

    @property
    def offload(self) -> str | None:
        return self._str("offload")


_BlockT = TypeVar("_BlockT", TrainedModelBlock, FrozenModelBlock)


class PlanStrategy(TrainedModelBlock):
    """A plan's ``strategy`` (DESIGN.md's shape): the single-model keys, or RLHF's blocks and step-wide knobs."""

    @property
    def is_rlhf(self) -> bool:
        """True for RLHF's shape (an ``actor`` block), False for a single trainable model's."""
        return isinstance(self.get("actor"), dict)

    @property
    def micro_batch(self) -> int | None:
        return self._int("micro_batch")

    @property
    def grad_accum(self) -> int | None:
        return self._int("grad_accum")

    @property
    def empty_cache(self) -> str | None:
        """``never``, ``after-generation``, ``after-inference``, ``after-phase`` or ``every-step``."""
        return self._str("empty_cache")

    @property
    def allocator(self) -> str | None:
        """``default`` or ``expandable-segments``."""
        return self._str("allocator")

    @property
    def loss(self) -> str:
        """``hf`` (the key is absent) or ``chunked``."""
        return self._str("loss") or "hf"

    @property
    def actor(self) -> TrainedModelBlock | None:
        return self._block("actor", TrainedModelBlock)

    @property
    def critic(self) -> TrainedModelBlock | None:
        return self._block("critic", TrainedModelBlock)

    @property
    def reference(self) -> FrozenModelBlock | None:
        return self._block("reference", FrozenModelBlock)

    @property
    def reward(self) -> FrozenModelBlock | None:
        return self._block("reward", FrozenModelBlock)

    @property
    def hybrid_engine(self) -> bool | None:
        return self._bool("hybrid_engine")

    @property
    def ema(self) -> bool | None:
        return self._bool("ema")

    @property
    def generation_batch(self) -> int | None:
        return self._int("generation_batch")

    @property
    def rollout(self) -> dict[str, Any] | None:
        """RLHF with a vLLM/SGLang rollout engine: its block (engine, GPUs, memory fraction, ...)."""
        value = self.get("rollout")
        return value if isinstance(value, dict) else None

    def _block(self, key: str, kind: type[_BlockT]) -> _BlockT | None:
        value = self.get(key)
        return kind(value) if isinstance(value, dict) else None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """Validated and serialized as the JSON object it is (the same schema as ``dict[str, Any]``)."""
        return core_schema.no_info_after_validator_function(cls, handler.generate_schema(dict[str, Any]))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """The JSON object's schema, with the closed sets of its keys as ``enum`` lists read from ``store.choices``."""
        body = dict(handler(schema))
        body["properties"] = strategy_properties()
        return body


def _enum(choices: type[StrEnum]) -> dict[str, Any]:
    return {"enum": [member.value for member in choices]}


def strategy_properties() -> dict[str, Any]:
    """The strategy keys that hold a closed set (``store.choices``), as JSON Schema properties: single-model keys,
    RLHF's trained (``actor``, ``critic``) and frozen (``reference``, ``reward``) blocks and its rollout engine."""
    trained = {
        "offload_optimizer": _enum(OffloadDevice),
        "offload_param": _enum(OffloadDevice),
        "quantization": _enum(Quantization),
    }
    frozen = {"properties": {"offload": _enum(OffloadDevice)}}
    return {
        **trained,
        "empty_cache": _enum(EmptyCachePolicyName),
        "allocator": _enum(AllocatorSetting),
        "actor": {"properties": trained},
        "critic": {"properties": trained},
        "reference": frozen,
        "reward": frozen,
        "rollout": {"properties": {"engine": _enum(RolloutEngine)}},
    }
