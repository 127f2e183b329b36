"""A DeepSpeed config as DeepSpeed itself reads it (for ``planner check``), where deepspeed is installed.

``deepspeed.runtime.config.DeepSpeedConfig`` is what ``deepspeed.initialize`` builds from the user's config: its
pydantic models (``extra="forbid"``) and assertions decide what DeepSpeed accepts, and their values what the
config means (``"enabled": "yes"`` is true, ``cpu_offload: true`` is ``offload_optimizer: {device: cpu}``,
``"stage": "2"`` is stage 2). Two readings, both through it:

- :func:`read_as_deepspeed` (before the job is resolved): the config's meaning, returned as a plain config of
  the keys ``launch.ds_config_read`` reads, with DeepSpeed's values in them. The batch keys are set aside
  (they need the world size), ``"auto"`` values (transformers fills them from its Trainer's arguments) stay
  ``"auto"``.
- :func:`check_with_deepspeed` (once the batch is known): the whole config, its ``"auto"`` batch keys filled
  with the batch the job runs, at the job's data-parallel world size.

A refusal is one line (``InputError``). Without a process group ``DeepSpeedConfig`` falls back to world size
1; the subclass built here sets the job's world size just before DeepSpeed reads the batch keys. DeepSpeed's
logger writes to stdout (its accelerator choice, deprecation warnings): it is silenced while the config is read,
so that ``--json`` stays a JSON document. deepspeed is imported here lazily, inside the functions.
"""

from __future__ import annotations

import copy
import logging
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from functools import cache
from typing import Any

from pydantic import ValidationError

from launch.ds_config_read import BATCH_KEYS
from store.ds_buckets import CONFIG_KEYS, ZeroBuckets
from store.errors import InputError

ACCUMULATION_KEY = "gradient_accumulation_steps"
# The config block each of DeepSpeed's models reads, for messages (the model's name where it is not here).
MODEL_BLOCKS = {
    "DeepSpeedZeroConfig": "zero_optimization",
    "DeepSpeedFP16Config": "fp16",
    "DeepSpeedBF16Config": "bf16",
    "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer",
    "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param",
}
NOT_A_MAPPING = re.compile(r"(\w+)\(\) argument after \*\* must be a mapping, not (\w+)")
LONGEST_DETAIL = 300
# Python's names of the JSON types DeepSpeed finds where it wants an object.
JSON_TYPES = {"bool": "a boolean", "list": "a list", "NoneType": "null", "str": "a string", "int": "a number"}


@contextmanager
def _deepspeed_quiet() -> Iterator[None]:
    """DeepSpeed's logger (named "DeepSpeed", writing to stdout) disabled for the block, then as it was."""
    ds_logger = logging.getLogger("DeepSpeed")
    was = ds_logger.disabled
    ds_logger.disabled = True
    try:
        yield
    finally:
        ds_logger.disabled = was


@cache
def deepspeed_parser() -> tuple[type, tuple[type[Exception], ...]] | None:
    """DeepSpeed's ``DeepSpeedConfig`` taught to take the world size, and the errors with which it refuses a
    config; None where deepspeed is not installed. Imports deepspeed (seconds), once."""
    with _deepspeed_quiet():
        try:
            # deepspeed ships no type information: under a user's strict mypy its classes are Any
            from deepspeed.runtime.config import (  # type: ignore[import-untyped, unused-ignore]
                DeepSpeedConfig,
                DeepSpeedConfigError,
            )
        except ImportError:
            return None

    class AtWorldSize(DeepSpeedConfig):  # type: ignore[misc, unused-ignore]
        """DeepSpeedConfig at a given data-parallel world size, without a process group."""

        def __init__(self, config: dict[str, Any], world_size: int) -> None:
            self._memplan_world_size = world_size
            super().__init__(config)

        def _initialize_params(self, param_dict: dict[str, Any]) -> None:
            # __init__ has just set world_size (1 without a process group); the batch keys are read after this.
            self.world_size = self._memplan_world_size
            super()._initialize_params(param_dict)

    # ValueError covers pydantic's ValidationError; the others are DeepSpeed's own checks and its getters meeting
    # a value of the wrong type (an "optimizer" that is a list)
    return AtWorldSize, (AssertionError, ValueError, TypeError, AttributeError, KeyError, DeepSpeedConfigError)


def _refusal(err: Exception) -> InputError:
    """One line for what DeepSpeed raised while reading a config."""
    detail = ""
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        block = MODEL_BLOCKS.get(str(err.title), str(err.title))
        where = ".".join([block, *(str(part) for part in first.get("loc", ()))])
        shown = repr(first.get("input"))
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        detail = f"{where}: {first.get('msg', '')} (given {shown})"
        if first.get("type") == "extra_forbidden":
            detail = f"{where}: unknown key (DeepSpeed has no such setting)"
    elif isinstance(err, TypeError) and (found := NOT_A_MAPPING.search(str(err))):
        block = MODEL_BLOCKS.get(found.group(1), found.group(1))
        detail = f"{block} must be an object, not {JSON_TYPES.get(found.group(2), found.group(2))}"
    else:
        where = ""
        if isinstance(err, (TypeError, AttributeError, KeyError)):  # a getter met a value of the wrong type
            frames = [f for f in traceback.extract_tb(err.__traceback__) if "deepspeed" in f.filename]
            where = f" (in DeepSpeed's {frames[-1].name})" if frames else ""
        detail = f"{str(err) or type(err).__name__}{where}"
    detail = " ".join(detail.split())
    if len(detail) > LONGEST_DETAIL:
        detail = detail[: LONGEST_DETAIL - 3] + "..."
    return InputError(f"ds_config: DeepSpeed refuses it: {detail}")


def _parse(config: dict[str, Any], world_size: int) -> Any:
    """DeepSpeed's parsed config, or the InputError of its refusal; None where deepspeed is not installed."""
    found = deepspeed_parser()
    if found is None:
        return None
    parser, refusals = found
    with _deepspeed_quiet():
        try:  # a copy: DeepSpeed keeps the dict it is given
            return parser(copy.deepcopy(config), world_size)
        except refusals as err:
            raise _refusal(err) from None


def _raw_enabled(config: dict[str, Any], name: str) -> Any:
    """The ``enabled`` value as written in the block DeepSpeed reads for ``name`` (``bfloat16``: old bf16)."""
    block = config.get(name)
    if name == "bf16" and block is None:
        block = config.get("bfloat16")
    return block.get("enabled") if isinstance(block, dict) else None


def _zero_block(zero: Any, raw: Any) -> dict[str, Any]:
    """The ``zero_optimization`` keys memplan reads, with DeepSpeed's values (``"auto"`` where it was written)."""
    raw = raw if isinstance(raw, dict) else {}
    block: dict[str, Any] = {"stage": int(getattr(zero.stage, "value", zero.stage))}
    for name in ("offload_optimizer", "offload_param"):
        offload = getattr(zero, name)
        device = "none" if offload is None else str(getattr(offload.device, "value", offload.device))
        block[name] = {"device": device}
    for f in fields(ZeroBuckets):
        keys = CONFIG_KEYS.get(f.name, (f.name,))
        auto = any(raw.get(key) == "auto" for key in keys)
        value = getattr(zero, f.name)
        block[f.name] = "auto" if auto else value if isinstance(value, bool) else int(value)
    return block


def read_as_deepspeed(config: dict[str, Any]) -> dict[str, Any] | None:
    """``config`` as DeepSpeed reads it, in the keys ``launch.ds_config_read`` reads: the batch keys as written,
    ``fp16``/``bf16`` with DeepSpeed's ``enabled`` (``"auto"`` where it was), ``zero_optimization`` with
    DeepSpeed's stage, offload devices and bucket sizes. An InputError where DeepSpeed refuses the config (its
    batch keys aside: :func:`check_with_deepspeed` reads them); None where deepspeed is not installed.
    """
    unbatched = {k: v for k, v in config.items() if k not in (*BATCH_KEYS, ACCUMULATION_KEY)}
    parsed = _parse({**unbatched, "train_micro_batch_size_per_gpu": 1}, 1)
    if parsed is None:
        return None
    read: dict[str, Any] = {k: config[k] for k in (*BATCH_KEYS, ACCUMULATION_KEY) if k in config}
    for name, parsed_block in (("fp16", parsed.float16_config), ("bf16", parsed.bfloat16_config)):
        auto = not parsed_block.enabled and _raw_enabled(config, name) == "auto"
        read[name] = {"enabled": "auto" if auto else bool(parsed_block.enabled)}
    read["zero_optimization"] = _zero_block(parsed.zero_config, config.get("zero_optimization"))
    return read


def check_with_deepspeed(config: dict[str, Any], world_size: int, micro_batch: int, grad_accum: int) -> None:
    """Put the whole config to DeepSpeed at ``world_size`` data-parallel GPUs, its ``"auto"`` batch keys filled
    as transformers fills them (``micro_batch`` per GPU, ``grad_accum`` steps): an InputError where DeepSpeed
    refuses it; nothing where it accepts it or deepspeed is not installed."""
    filled = {
        "train_micro_batch_size_per_gpu": micro_batch,
        ACCUMULATION_KEY: grad_accum,
        "train_batch_size": micro_batch * grad_accum * world_size,
    }
    _parse({k: filled[k] if v == "auto" and k in filled else v for k, v in config.items()}, world_size)
