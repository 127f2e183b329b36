"""``planner probe ... -- CMD``'s predicted column builds the model as the program does (issue 42), and is
predicted before the program runs: what the run itself measures never feeds it.

A run of the program whose hook saw it build its model whole before ``deepspeed.initialize`` (with a ZeRO-3 config
of its own) is predicted so beside its measurement, as ``recommend --program`` plans it, not by ``--framework``'s
rule (HF's Trainer: under ``deepspeed.zero.Init``). A real SQLite store; the run is a stored one of the program,
reused (no process is started). LoRA under ZeRO-3 on two L4s: there the build changes the reserved peaks.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from planner.job.inputs import JobSpec, resolve
from planner.probing import program as program_module
from planner.probing.device import device_coefficients, device_prediction
from planner.probing.program import run_program_strategy
from planner.probing.program_runs import program_request
from planner.probing.settings import ProbeSettings
from probes.measure.fingerprint import versions
from probes.script.outcome import ScriptProbeResult
from search import DEFAULT_COEFFICIENTS as C
from search import predict
from search.prediction import Prediction
from store.db import open_storage
from store.measurements import PhaseMeasurement, ProbeResult
from store.records import Strategy

PROGRAM = {"command": ["python", "train.py"], "script": "/train.py", "script_sha256": "cd", "versions": {}}
STRATEGY = Strategy(zero_stage=3, lora_rank=16, micro_batch=4, grad_accum=1)


def _predicted(workload: Any, hardware: Any) -> Prediction:
    return device_prediction(predict(workload, STRATEGY, hardware, device_coefficients("cuda", C)), "cuda")


def test_the_predicted_column_follows_the_build_the_programs_run_saw(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'plans.db'}"
    job = resolve(JobSpec(model="opt-350m", workload="sft", gpu="L4", gpus=2, seq_len=256, batch=8, framework="hf"), db)
    settings = ProbeSettings.checked(device="cuda", steps=4, timeout_s=600.0)
    whole = _predicted(replace(job.workload, model_build="whole"), job.hardware)
    by_rule = _predicted(job.workload, job.hardware)
    # the case means something: built whole first, the frozen base's partitions are made between the originals
    # and keep their segments after the originals are freed (search.streams.build._zero3_init): more reserved
    assert [p.peak_reserved_bytes for p in whole.phases] != [p.peak_reserved_bytes for p in by_rule.phases]
    measured = tuple(PhaseMeasurement(p.name, p.peak_allocated_bytes, p.peak_reserved_bytes, 0.1) for p in whole.phases)
    request = program_request(job, STRATEGY, PROGRAM, settings)
    ran_with = {"model_zero_init": False, "program_zero_stage": 3}
    result = ProbeResult(outcome="ok", phases=measured, extra={"program_run": {"ran_with": ran_with}})
    with open_storage(db) as storage:
        storage.save_probe(request, result, key=request.key(versions()))

    done = run_program_strategy(
        job, STRATEGY, ["python", "train.py"], program=PROGRAM, settings=settings, coef=C, db=db
    )
    assert not done.ran  # the stored run reused
    shown = {p.name: p.predicted_reserved_bytes for p in done.run.phases}
    assert shown == {p.name: p.peak_reserved_bytes for p in whole.phases}
    assert done.run.predicted_step_s == whole.step_time_s


def test_the_prediction_is_made_before_the_program_runs_and_its_own_run_does_not_feed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'plans.db'}"
    job = resolve(JobSpec(model="opt-350m", workload="sft", gpu="L4", gpus=2, seq_len=256, batch=8, framework="hf"), db)
    settings = ProbeSettings.checked(device="cuda", steps=4, timeout_s=600.0)
    by_rule = _predicted(job.workload, job.hardware)
    calls: list[str] = []
    looked_up = program_module.seen_model_build

    def model_build(ident: str, runs: list[Any]) -> tuple[str, str] | None:
        calls.append("predicted")
        return looked_up(ident, runs)

    def runner(command: list[str], script: Any, timeout_s: float) -> ScriptProbeResult:
        calls.append("ran")  # this run saw the program build its model whole, under its own ZeRO-3 config
        phases = tuple(
            PhaseMeasurement(p.name, p.peak_allocated_bytes, p.peak_reserved_bytes, 0.1) for p in by_rule.phases
        )
        gpu = {"device": "cuda", "name": "NVIDIA L4", "total_memory_bytes": 24 * 2**30}
        ran_with = {"model_zero_init": False, "program_zero_stage": 3}
        return ScriptProbeResult(outcome="ok", phases=phases, ran_with=ran_with, ranks=({"fingerprint": gpu},))

    monkeypatch.setattr(program_module, "seen_model_build", model_build)
    done = run_program_strategy(
        job, STRATEGY, ["python", "train.py"], program=PROGRAM, settings=settings, coef=C, db=db, runner=runner
    )
    assert done.ran and calls == ["predicted", "ran"]
    shown = {p.name: p.predicted_reserved_bytes for p in done.run.phases}
    assert shown == {p.name: p.peak_reserved_bytes for p in by_rule.phases}  # not the build this run saw
