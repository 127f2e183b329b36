"""What one script probe asks of the user's program, and how the strategy's keys enter the program's config.

:class:`ScriptProbeSettings` travels from the planner to the hook in every rank as one JSON file (named by the
``MEMPLAN_SCRIPT_PROBE`` variable): the DeepSpeed config keys the strategy sets (``ds_overrides``), the settings
that live outside the config (gradient checkpointing, LoRA and the loss, which the hook can only check, the
``empty_cache`` policy and the allocator), the warm-up and timed steps, and the folder the ranks write to.

:func:`strategy_overrides` cuts them out of the config ``launch.ds_config.render_ds_config`` renders for the
strategy (what ``planner export`` writes): the micro-batch, the accumulation, the whole ``zero_optimization``
block (stage, offload, buckets) and, unless left out, the precision blocks. ``train_batch_size`` is left out
on purpose: :func:`merge_config` drops the program's, and DeepSpeed derives it from micro-batch x accumulation
x the ranks the program really runs (a plan for N GPUs probed on fewer ranks would otherwise be refused).

:func:`merge_config` puts them into the config the program passes (``config=``, ``config_params=`` or
``args.deepspeed_config``), keeping the program's own other keys (its optimizer, scheduler, clipping, the
values its framework resolved from "auto"): the program's ``zero_optimization`` loses the keys that size or
place ZeRO's memory (:data:`ZERO_STRATEGY_KEYS`) and takes the strategy's; its precision blocks take the
strategy's ``enabled``. Pure Python: no torch here (the hook reads this module in every rank).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

__all__ = [
    "EVENTS_FILE",
    "HOOK_ERRORS_FILE",
    "HOOK_FOLDER",
    "PROJECT_ROOT",
    "RESULT_FILE",
    "SETTINGS_FILE",
    "SETTINGS_VARIABLE",
    "ZERO_STRATEGY_KEYS",
    "ScriptProbeSettings",
    "merge_config",
    "rank_folder",
    "strategy_overrides",
]

SETTINGS_VARIABLE = "MEMPLAN_SCRIPT_PROBE"  # the settings file's path, in the program's environment
SETTINGS_FILE = "settings.json"
RESULT_FILE = "result.json"  # per rank, in rank_folder(output_dir, rank)
EVENTS_FILE = "events.jsonl"  # per rank: pid, initialize, phases, steps (one JSON object a line)
HOOK_ERRORS_FILE = "hook_errors.jsonl"  # beside the settings file: the hook failed before it could report per rank
HOOK_FOLDER = Path(__file__).resolve().parent / "hook"  # first on the program's PYTHONPATH: its sitecustomize
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # where the hook finds memplan's packages

STEP_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
PRECISION_KEYS = ("bf16", "fp16")
# the program's keys that the strategy replaces: DeepSpeed derives train_batch_size from the others
DROPPED_KEYS = ("train_batch_size",)
# zero_optimization keys that size or place ZeRO's memory: the program's are dropped, the strategy's taken
ZERO_STRATEGY_KEYS = frozenset(
    {
        "stage",
        "offload_optimizer",
        "offload_param",
        "cpu_offload",
        "cpu_offload_param",
        "cpu_offload_params",
        "cpu_offload_use_pin_memory",
        "reduce_bucket_size",
        "allgather_bucket_size",
        "allgather_partitions",
        "overlap_comm",
        "contiguous_gradients",
        "reduce_scatter",
        "sub_group_size",
        "prefetch_bucket_size",
        "stage3_prefetch_bucket_size",
        "param_persistence_threshold",
        "stage3_param_persistence_threshold",
        "model_persistence_threshold",
        "stage3_model_persistence_threshold",
        "max_live_parameters",
        "stage3_max_live_parameters",
        "max_reuse_distance",
        "stage3_max_reuse_distance",
        "zero_hpz_partition_size",
        "zero_quantized_weights",
        "zero_quantized_gradients",
        "mics_shard_size",
    }
)
WARMUP_STEPS, ZERO3_WARMUP_STEPS = 1, 2  # as the built-in probes (probes.step.warmup)


def rank_folder(output_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` of the program writes its events and result."""
    return Path(output_dir) / f"rank{rank}"


@dataclass(frozen=True)
class ScriptProbeSettings:
    """One script probe's settings (module docstring). ``output_dir`` is filled in by the parent
    (:func:`probes.script.launch.run_script_probe`); ``world_size`` is the plan's ranks (0: not checked)."""

    ds_overrides: dict[str, Any]
    device: str = "cuda"
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    loss: str = "hf"
    empty_cache: str = "never"
    allocator: str = "default"
    warmup_steps: int = WARMUP_STEPS
    timed_steps: int = 2
    world_size: int = 1
    memory_cap_bytes: int | None = None  # CPU backend: live tensor bytes that count as out of memory
    output_dir: str = ""
    strategy: dict[str, Any] = field(default_factory=dict)  # the strategy's JSON shape, for the record

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be cuda or cpu, not {self.device!r}")
        if self.timed_steps < 1 or self.warmup_steps < 0:
            raise ValueError("a script probe needs at least one timed step and no negative warm-up")

    @property
    def steps(self) -> int:
        """Optimizer steps the program runs before the hook ends it: warm-up and timed."""
        return self.warmup_steps + self.timed_steps

    @property
    def micro_batch(self) -> int | None:
        value = self.ds_overrides.get("train_micro_batch_size_per_gpu")
        return value if isinstance(value, int) else None

    @property
    def grad_accum(self) -> int | None:
        value = self.ds_overrides.get("gradient_accumulation_steps")
        return value if isinstance(value, int) else None

    @property
    def zero_stage(self) -> int | None:
        value = (self.ds_overrides.get("zero_optimization") or {}).get("stage")
        return value if isinstance(value, int) else None

    @property
    def dtype(self) -> str | None:
        """The precision the overrides set (None: the program's own)."""
        if not any(key in self.ds_overrides for key in PRECISION_KEYS):
            return None
        for key in PRECISION_KEYS:
            if (self.ds_overrides.get(key) or {}).get("enabled") is True:
                return key
        return "fp32"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScriptProbeSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, path: Path) -> None:
        """Write the settings file atomically."""
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        os.replace(temporary, path)

    @classmethod
    def read(cls, path: str | Path) -> ScriptProbeSettings:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def with_output(self, output_dir: str | Path) -> ScriptProbeSettings:
        return replace(self, output_dir=str(output_dir))

    @classmethod
    def for_strategy(
        cls,
        strategy: Any,
        workload: Any,
        hardware: Any,
        *,
        device: str = "cuda",
        timed_steps: int = 2,
        warmup_steps: int | None = None,
        precision: bool = True,
        memory_cap_bytes: int | None = None,
    ) -> ScriptProbeSettings:
        """The settings that probe ``strategy`` (a ``store.records.Strategy``) of ``workload`` on ``hardware``:
        its config keys (:func:`strategy_overrides`), its outside settings, and warm-up as the built-in probes
        (two steps under ZeRO-3, else one) unless ``warmup_steps`` is given."""
        if warmup_steps is None:
            warmup_steps = ZERO3_WARMUP_STEPS if strategy.zero_stage == 3 else WARMUP_STEPS
        return cls(
            ds_overrides=strategy_overrides(strategy, workload, hardware, precision=precision),
            device=device,
            gradient_checkpointing=strategy.gradient_checkpointing,
            lora_rank=strategy.lora_rank,
            loss=strategy.loss,
            empty_cache=strategy.empty_cache,
            allocator=strategy.allocator,
            warmup_steps=warmup_steps,
            timed_steps=timed_steps,
            world_size=hardware.gpus,
            memory_cap_bytes=memory_cap_bytes,
            strategy=strategy.to_dict(),
        )


def strategy_overrides(strategy: Any, workload: Any, hardware: Any, *, precision: bool = True) -> dict[str, Any]:
    """The strategy's keys of the DeepSpeed config ``planner export`` writes (module docstring); ``precision``
    False leaves the program's bf16/fp16 blocks alone."""
    from launch.ds_config import render_ds_config

    rendered = render_ds_config(strategy, workload, hardware)
    keys = STEP_KEYS + ("zero_optimization",) + (PRECISION_KEYS if precision else ())
    return {key: copy.deepcopy(rendered[key]) for key in keys if key in rendered}


def merge_config(program: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The program's config with the strategy's keys in (module docstring); neither argument is changed."""
    merged = copy.deepcopy(program)
    if any(key in overrides for key in STEP_KEYS):
        for key in DROPPED_KEYS:
            merged.pop(key, None)
    for key, value in overrides.items():
        if key == "zero_optimization":
            own = merged.get(key) if isinstance(merged.get(key), dict) else {}
            kept = {k: v for k, v in own.items() if k not in ZERO_STRATEGY_KEYS and v != "auto"}
            merged[key] = {**kept, **copy.deepcopy(value)}
        elif key in PRECISION_KEYS and isinstance(value, dict):
            own = merged.get(key) if isinstance(merged.get(key), dict) else {}
            merged[key] = {**own, **copy.deepcopy(value)}
        else:
            merged[key] = copy.deepcopy(value)
    return merged
