"""The user's program gets the ops memplan's own probe gets (issue 44 item 3): DeepSpeed's ops its strategies'
configs load are built once before it runs, outside its timeout, into the folder its environment names."""

from __future__ import annotations

from typing import Any

import pytest

import planner.probing.program_ops as program_ops
from planner.planning.predicting import job_spec, resolve
from probes.ops.prepare import BuildOutcome, OpBuildError
from probes.process.isolation import child_env
from probes.process.op_cache import VARIABLE
from store.records import Strategy

JOB = resolve(job_spec("opt-125m", {"workload": "sft", "gpu_mem": "24G", "cpu_mem": "64G", "batch": 4}))
ON_GPU = Strategy(zero_stage=2, micro_batch=2, grad_accum=2)
OFFLOADED = Strategy(zero_stage=2, offload_optimizer="cpu", micro_batch=2, grad_accum=2)


def test_the_ops_follow_deepspeeds_optimizer_choice() -> None:
    """DeepSpeed 0.19's engine: Adam(W) without torch_adam is CPU Adam under optimizer offload, else FusedAdam;
    on the CPU accelerator first the shared-memory allreduce."""
    assert program_ops.program_ops([ON_GPU], JOB.workload, JOB.hardware, "cpu") == (
        "ShareMemCommBuilder",
        "FusedAdamBuilder",
    )
    both = program_ops.program_ops([ON_GPU, OFFLOADED], JOB.workload, JOB.hardware, "cuda")
    assert both == ("FusedAdamBuilder", "CPUAdamBuilder")


def test_built_once_before_the_program_into_the_folder_its_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(program_ops, "_DONE", set())
    builds: list[tuple[str, tuple[str, ...], dict[str, str], float]] = []
    notes: list[str] = []

    def build(device: str, ops: tuple[str, ...], env: dict[str, str], timeout_s: float) -> BuildOutcome:
        builds.append((device, ops, env, timeout_s))
        return BuildOutcome(ok=True, built=ops)

    for _ in range(2):  # the second program run loads what the first build left
        program_ops.prepare_program_ops(
            [OFFLOADED], JOB.workload, JOB.hardware, "cpu", on_note=notes.append, build=build
        )
    assert len(builds) == 1 and builds[0][1] == ("ShareMemCommBuilder", "CPUAdamBuilder")
    program_env = child_env("cpu", OFFLOADED.allocator)  # what probes.script.launch starts the program with
    assert builds[0][2][VARIABLE] == program_env[VARIABLE]
    assert len(notes) == 1 and "outside its timeout" in notes[0] and program_env[VARIABLE] in notes[0]


def test_a_failed_build_is_one_line_naming_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(program_ops, "_DONE", set())

    def build(*_: Any) -> BuildOutcome:
        return BuildOutcome(ok=False, timed_out=True, last_step="CPUAdamBuilder")

    with pytest.raises(OpBuildError, match=r"timed out \(in CPUAdamBuilder\); the program was not run"):
        program_ops.prepare_program_ops([OFFLOADED], JOB.workload, JOB.hardware, "cpu", build=build)
