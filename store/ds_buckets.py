"""DeepSpeed's ZeRO bucket settings, as a config sets them: the buffers they size are real GPU bytes.

``Strategy.ds_buckets`` is ``None`` for memplan's own plans: the exported ``ds_config.json`` then carries
``store.ds_defaults``' values and the cost model counts those. A user's config (``planner check``) runs with
its own keys and, for every key it leaves out, DeepSpeed's default (``runtime/zero/config.py``
``DeepSpeedZeroConfig``): a :class:`ZeroBuckets` holds them so that the prediction counts the buffers that
config really makes. ``"auto"`` values are those transformers fills in (``integrations/deepspeed.py``
``HfTrainerDeepSpeedConfig.trainer_config_finalize``: hidden^2, 0.9 hidden^2, 10 hidden).

Sizes are in elements, as DeepSpeed counts them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from store.errors import InputError, refuse_unknown_keys

# DeepSpeedZeroConfig's defaults (deepspeed 0.19 runtime/zero/config.py)
DS_REDUCE_BUCKET_SIZE = 500_000_000
DS_ALLGATHER_BUCKET_SIZE = 500_000_000
DS_PREFETCH_BUCKET_SIZE = 50_000_000
DS_PARAM_PERSISTENCE_THRESHOLD = 100_000
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
DS_MAX_REUSE_DISTANCE = 1_000_000_000
DS_SUB_GROUP_SIZE = 1_000_000_000
MAX_ELEMENTS = 2**50  # larger than any device: a typo, not a bucket


@dataclass(frozen=True)
class ZeroBuckets:
    """The ZeRO bucket keys a DeepSpeed config runs with (elements; DeepSpeed's defaults where unset).

    ``overlap_comm`` left unset is DeepSpeed's dynamic default: on for stage 3 only
    (``DeepSpeedZeroConfig.overlap_comm_valid``); here it is always resolved to a bool.
    """

    reduce_bucket_size: int = DS_REDUCE_BUCKET_SIZE
    allgather_bucket_size: int = DS_ALLGATHER_BUCKET_SIZE
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    prefetch_bucket_size: int = DS_PREFETCH_BUCKET_SIZE
    param_persistence_threshold: int = DS_PARAM_PERSISTENCE_THRESHOLD
    max_live_parameters: int = DS_MAX_LIVE_PARAMETERS
    max_reuse_distance: int = DS_MAX_REUSE_DISTANCE
    sub_group_size: int = DS_SUB_GROUP_SIZE  # ZeRO-3 steps the optimizer one sub-group of this many at a time

    def __post_init__(self) -> None:
        problems = bucket_problems(self)
        if problems:
            raise InputError("strategy: ds_buckets: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_value(cls, value: Any) -> ZeroBuckets | None:
        """The block from its JSON value (an object of these keys, or null for memplan's own)."""
        if value is None or isinstance(value, ZeroBuckets):
            return value
        if not isinstance(value, dict):
            raise InputError("strategy: ds_buckets must be an object or null")
        refuse_unknown_keys(value, (f.name for f in fields(cls)), "strategy: ds_buckets")
        return cls(**value)


def bucket_problems(b: ZeroBuckets) -> list[str]:
    """What makes a bucket block impossible, as readable phrases (empty when valid)."""
    problems: list[str] = []
    for f in fields(b):
        value = getattr(b, f.name)
        if isinstance(f.default, bool):
            if not isinstance(value, bool):
                problems.append(f"{f.name} must be true or false, not {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ELEMENTS:
            problems.append(f"{f.name} must be a whole number of elements from 0 to 2^50, not {value!r}")
    for name in ("reduce_bucket_size", "sub_group_size"):
        if not problems and getattr(b, name) <= 0:
            problems.append(f"{name} must be larger than zero")
    return problems


# the config's key for each field where it differs from the field's name (stage 3 keys carry a prefix)
CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "prefetch_bucket_size": ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    "param_persistence_threshold": ("stage3_param_persistence_threshold", "param_persistence_threshold"),
    "max_live_parameters": ("stage3_max_live_parameters", "max_live_parameters"),
    "max_reuse_distance": ("stage3_max_reuse_distance", "max_reuse_distance"),
}


def hf_auto_values(hidden_size: int) -> dict[str, int]:
    """What transformers writes for ``"auto"`` bucket keys of a model with this hidden size."""
    return {
        "reduce_bucket_size": hidden_size * hidden_size,
        "prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "param_persistence_threshold": 10 * hidden_size,
    }


def buckets_from_zero_config(zero: dict[str, Any], stage: int, hidden_size: int) -> ZeroBuckets:
    """The buckets a config's ``zero_optimization`` block runs with: its keys, ``"auto"`` as transformers fills
    it (a key transformers leaves alone stays at DeepSpeed's default), DeepSpeed's defaults for the rest."""
    auto = hf_auto_values(hidden_size)
    values: dict[str, Any] = {}
    for f in fields(ZeroBuckets):
        for key in CONFIG_KEYS.get(f.name, (f.name,)):
            if key not in zero or zero[key] is None:
                continue
            value = zero[key]
            if value == "auto":
                if f.name in auto:
                    values[f.name] = auto[f.name]
                break
            if f.name not in ("overlap_comm", "contiguous_gradients") and isinstance(value, float):
                if not value.is_integer():
                    raise InputError(f"ds_config: zero_optimization.{key} must be a whole number, not {value!r}")
                value = int(value)  # 5e8 in JSON is a float; DeepSpeed's pp_int takes it
            values[f.name] = value
            break
    values.setdefault("overlap_comm", stage == 3)
    try:
        return ZeroBuckets(**values)
    except InputError as err:
        raise InputError(str(err).replace("strategy: ds_buckets:", "ds_config: zero_optimization:")) from None
