"""Helpers shared by the planner tests (imported by the test modules and by conftest.py)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli_here import run_planner_here

# DeepSpeed picks its accelerator when first imported: the CPU one, on any machine that runs these tests.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
GIB = 2**30
CPU_MEM = ("--cpu-mem", "64G", "--workload", "sft")  # host memory fixed; these tests cover the single-model path
STRATEGY_KEYS = frozenset(
    {
        "zero_stage",
        "offload_optimizer",
        "offload_param",
        "gradient_checkpointing",
        "lora_rank",
        "micro_batch",
        "grad_accum",
        "empty_cache",
        "allocator",
    }
)
BREAKDOWN_KEYS = frozenset(
    {"parameters", "gradients", "optimizer_states", "activations", "logits", "kv_cache", "buffers", "fragmentation"}
)


@dataclass(frozen=True)
class CliResult:
    """What one ``planner`` invocation returned and printed."""

    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def run_main(args: list[str]) -> CliResult:
    """``planner.cli.main(args)`` in this process, stdout and stderr captured (for session fixtures):
    ``cli_here.run_planner_here`` as a :class:`CliResult`."""
    done = run_planner_here(args)
    return CliResult(done.returncode, done.stdout, done.stderr)


def assert_one_error_line(result: CliResult, *fragments: str) -> str:
    """Exit 2, nothing on stdout, exactly one ``planner: error:`` line on stderr, no traceback."""
    assert "Traceback" not in result.out + result.err
    assert result.rc == 2, (result.rc, result.err)
    assert result.err_lines and len(result.err_lines) == 1, result.err
    line = result.err_lines[0]
    assert line.startswith("planner: error:"), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["DS_ACCELERATOR"] = "cpu"
    env.update(extra or {})
    return env


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_predicted_block(predicted: dict[str, Any], hardware: dict[str, Any]) -> None:
    """The invariants of one ``predicted`` block (docs/contracts.md): integer bytes, reserved >= allocated,
    the breakdown adds up to the peak phase's reserved bytes, the budget is below the GPU's memory.
    """
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "gpu_budget_bytes", "host_bytes"):
        assert _is_int(predicted[key]), (key, predicted[key])
        assert predicted[key] >= 0, (key, predicted[key])
    assert isinstance(predicted["step_time_s"], float) and predicted["step_time_s"] > 0
    assert predicted["peak_reserved_bytes"] >= predicted["peak_allocated_bytes"]
    # Usable memory is what is left after the safety margin and the CUDA context.
    assert predicted["gpu_budget_bytes"] <= hardware["gpu_memory_bytes"] * (1 - hardware["safety_margin"])

    breakdown = predicted["breakdown"]
    assert set(breakdown) >= BREAKDOWN_KEYS, sorted(BREAKDOWN_KEYS - set(breakdown))
    assert all(_is_int(v) and v >= 0 for v in breakdown.values()), breakdown

    phases = predicted["phases"]
    assert phases, "a step has at least one phase"
    for phase in phases:
        assert {"name", "peak_allocated_bytes", "peak_reserved_bytes", "time_s"} <= set(phase)
        assert _is_int(phase["peak_allocated_bytes"]) and _is_int(phase["peak_reserved_bytes"])
        assert phase["peak_reserved_bytes"] >= phase["peak_allocated_bytes"]
        assert phase["time_s"] >= 0
    # The step's peaks are the largest phase's peaks (what max_memory_* report after a whole step) ...
    assert predicted["peak_reserved_bytes"] == max(p["peak_reserved_bytes"] for p in phases)
    assert predicted["peak_allocated_bytes"] == max(p["peak_allocated_bytes"] for p in phases)
    # ... and the breakdown explains exactly the peak phase's reserved bytes.
    assert sum(breakdown.values()) == predicted["peak_reserved_bytes"]
    # Host memory per node: the parts of the host phase that sets it (steady or loading) add up to it.
    host = predicted["host_breakdown"]
    assert all(_is_int(v) and v > 0 for v in host.values()), host
    assert sum(host.values()) == predicted["host_bytes"]
    assert predicted["host_phases"][predicted["host_peak_phase"]] == predicted["host_bytes"]
    assert predicted["host_bytes"] == max(predicted["host_phases"].values())


def fits_by_numbers(predicted: dict[str, Any], hardware: dict[str, Any]) -> bool:
    """Whether the numbers say it fits: reserved within the GPU budget, host bytes within host memory."""
    return (
        predicted["peak_reserved_bytes"] <= predicted["gpu_budget_bytes"]
        and predicted["host_bytes"] <= hardware["cpu_memory_bytes"]
    )


def check_ds_config_batch(ds_config: dict[str, Any], strategy: dict[str, Any], doc: dict[str, Any]) -> None:
    """train_batch_size is the global batch and equals micro batch x accumulation x world size."""
    world = doc["hardware"]["gpus"] * doc["hardware"]["nodes"]
    assert ds_config["train_batch_size"] == doc["workload"]["global_batch"]
    assert ds_config["train_micro_batch_size_per_gpu"] == strategy["micro_batch"]
    assert ds_config["gradient_accumulation_steps"] == strategy["grad_accum"]
    assert ds_config["train_batch_size"] == strategy["micro_batch"] * strategy["grad_accum"] * world
