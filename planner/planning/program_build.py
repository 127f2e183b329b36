"""How your program builds its model under ZeRO-3, as the stored runs of it saw (``planner probe ... -- CMD``).

The probe's hook looks at the model the program hands to ``deepspeed.initialize`` before the engine is made
(:func:`probes.script.program_model.model_build_seen`, kept in each run's ``ran_with``): parameters that already
carry ``ds_id`` were made under ``deepspeed.zero.Init`` (the whole model never sat on one GPU); parameters without
it, while the program's own config asks for ZeRO-3, mean the program builds the model whole first and lets
``deepspeed.initialize`` partition it. ``recommend --program`` plans with what was seen
(``Workload.model_build``) instead of ``--framework``'s rule (:mod:`store.model_build`), and says so.

A run whose program's own config is not ZeRO-3 and whose model was not partitioned says nothing: a Trainer or
Accelerate decides on ``zero.Init`` from the program's config, which the probe's merged keys come after.
Reads the plan database only; no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from planner.job.inputs import ResolvedJob
from planner.planning.program_spread import program_runs, stored_probes
from store.model_build import SEEN_WHOLE, SEEN_ZERO_INIT

if TYPE_CHECKING:
    from store.db import ProbeRecord


def _seen(record: ProbeRecord) -> dict[str, Any]:
    run = record.result.extra.get("program_run") if isinstance(record.result.extra, dict) else None
    ran = run.get("ran_with") if isinstance(run, dict) else None
    return ran if isinstance(ran, dict) else {}


def seen_model_build(program_id: str, runs: list[ProbeRecord]) -> tuple[str, str] | None:
    """(``Workload.model_build``, the reading line that says it) as the program's ``runs`` saw it; None where no
    run saw it (runs stored before the hook looked, or none with a ZeRO-3 config of the program's own)."""
    seen = [_seen(record) for record in runs]
    if any(ran.get("model_zero_init") is True for ran in seen):
        return SEEN_ZERO_INIT, (
            f"model build: your program {program_id} builds its model under deepspeed.zero.Init (its parameters "
            "were partitioned before deepspeed.initialize in a stored run): planned so under ZeRO-3"
        )
    if any(ran.get("model_zero_init") is False and ran.get("program_zero_stage") == 3 for ran in seen):
        return SEEN_WHOLE, (
            f"model build: your program {program_id} builds its model whole before deepspeed.initialize, even with "
            "a ZeRO-3 config of its own (a stored run saw no partitioned parameter): planned so under ZeRO-3"
        )
    return None


def program_model_build(ref: str, db: str | None) -> tuple[str, str] | None:
    """:func:`seen_model_build` of the program ``ref`` names (:func:`planner.planning.program_spread.program_runs`)."""
    ident, runs = program_runs(ref, stored_probes(db))
    return seen_model_build(ident, runs)


def with_model_build(resolved: ResolvedJob, ref: str, db: str | None) -> ResolvedJob:
    """``resolved`` with the program ``ref``'s model build as its runs saw it (``Workload.model_build``) and the
    reading line that says so; unchanged where no run saw it."""
    seen = program_model_build(ref, db)
    if seen is None:
        return resolved
    workload = replace(resolved.workload, model_build=seen[0])
    return replace(resolved, workload=workload, readings=(*resolved.readings, seen[1]))
