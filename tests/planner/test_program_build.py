"""How your program builds its model under ZeRO-3, seen by ``planner probe ... -- CMD``'s hook, stored with the
program's run and planned with by ``recommend --program`` (issue 42): a real SQLite store, the real recommend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from planner.planning.program_build import program_model_build
from planner.schema import committed_schema
from probes.script.program_model import model_build_seen, zero_init
from store.measurements import ProbeRequest, ProbeResult, program_id

PROGRAM = {"command": ["python", "t.py"], "script": "/t.py", "script_sha256": "ab", "versions": {}}
JOB = {"kind": "sft", "model": "opt-125m", "seq_len": 256, "global_batch": 8}


def _store(db: str, *ran_with: dict[str, Any]) -> str:
    from store.db import open_storage

    with open_storage(db) as storage:
        for index, ran in enumerate(ran_with):
            request = ProbeRequest(
                workload=JOB, strategy={"zero_stage": 3, "micro_batch": 8}, hardware={"gpus": 1}, program=PROGRAM
            )
            result = ProbeResult(outcome="ok", extra={"program_run": {"ran_with": ran}})
            storage.save_probe(request, result, key=f"k{index}")
    return program_id(PROGRAM)


def test_the_hook_reads_the_models_build_and_the_programs_own_stage() -> None:
    import torch

    plain = torch.nn.Linear(4, 4)
    assert not zero_init(plain)  # built whole: no parameter carries zero.Init's ds_id
    stage3 = {"zero_optimization": {"stage": 3}, "train_batch_size": 8}
    assert model_build_seen(False, stage3) == {"model_zero_init": False, "program_zero_stage": 3}
    assert model_build_seen(None, {"train_batch_size": 8}) == {"model_zero_init": None, "program_zero_stage": None}
    assert model_build_seen(True, "ds_config.json")["program_zero_stage"] is None  # a path: not read here


@pytest.mark.parametrize(
    ("ran_with", "seen"),
    [
        ({"model_zero_init": True, "program_zero_stage": 3}, "zero-init"),
        ({"model_zero_init": False, "program_zero_stage": 3}, "whole"),
        # a Trainer decides on zero.Init from its own config: at ZeRO-2 it says nothing of a ZeRO-3 build
        ({"model_zero_init": False, "program_zero_stage": 2}, None),
        ({"zero_stage": 3}, None),  # a run stored before the hook looked
    ],
)
def test_the_stored_runs_say_how_the_program_builds(tmp_path: Path, ran_with: dict[str, Any], seen: str | None) -> None:
    db = f"sqlite:///{tmp_path / 'plans.db'}"
    ident = _store(db, ran_with)
    found = program_model_build(ident, db)
    assert (found[0] if found else None) == seen
    if found:
        assert found[1].startswith(f"model build: your program {ident}")


def test_recommend_for_the_program_plans_its_seen_build(tmp_path: Path) -> None:
    """recommend --program of a program seen building whole: its ZeRO-3 plans (here forced by --zero... through
    predict's same workload) are predicted whole, with the reading line; without --program the framework's rule."""
    from planner import recommend

    db = f"sqlite:///{tmp_path / 'plans.db'}"
    ident = _store(db, {"model_zero_init": False, "program_zero_stage": 3})
    job: dict[str, Any] = {"workload": "sft", "gpu": "L4", "gpus": 2, "seq_len": 256, "batch": 8, "framework": "hf"}
    plan = recommend("opt-125m", db=db, save=False, program=ident, top=0, **job)
    assert any(line.startswith(f"model build: your program {ident} builds its model whole") for line in plan.readings)
    assert plan.workload["model_build"] == "whole"
    plain = recommend("opt-125m", db=db, save=False, top=0, **job)
    assert "model_build" not in plain.workload
    # the plan's document says the build it assumed (the schema bounds it to the two builds), and validates
    validator = jsonschema.Draft202012Validator(committed_schema("plan"))
    for document, build in ((plan.model_dump(), "whole"), (plain.model_dump(), "zero-init")):
        assert document["model_build"] == build  # --framework hf builds under zero.Init; the program was seen whole
        validator.validate(document)
        assert not validator.is_valid({**document, "model_build": "half"})
