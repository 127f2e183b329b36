"""Plans for a job: ``recommend`` (the search), ``predict`` (one fixed strategy) and ``check`` (a DeepSpeed
config, :mod:`planner.planning.checking`), each on the model and job keywords of ``planner.job.inputs.JobSpec``
(or a JobSpec), with the calibration in force. ``planner.api`` exports them; the calibration from records files
calls them here.

Each returns a typed pydantic result and raises ``store.errors.InputError`` for bad input.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from typing_extensions import Unpack

from planner.job.calibrated import calibrated
from planner.job.inputs import JobKeywords, JobSpec, resolve
from planner.planning.checking import check
from planner.planning.fallback_search import (
    DEFAULT_LORA_RANK,
    QUANTIZATION_CHOICES,
    rollout_families,
    search_with_fallbacks,
)
from planner.planning.figures import empty_cache_effect, prediction_report
from planner.planning.fixed import SINGLE_MODEL_KNOBS, as_dict, batch_of_job, with_batch_of
from planner.planning.job_call import JOB_FIELDS, job_spec, resolved_job
from planner.planning.program_build import with_model_build
from planner.planning.program_spread import applied_spread, program_spread
from planner.planning.saved import save_plan
from planner.report.prediction import alternative
from planner.report.results import Plan, PredictionReport
from search import DEFAULT_COEFFICIENTS, Coefficients
from search import predict as predict_strategy
from store.errors import InputError
from store.records import RLHFStrategy, Strategy

# the names callers import from here (planner.api, benchmarks, tests), wherever they now live
__all__ = [
    "DEFAULT_LORA_RANK",
    "JOB_FIELDS",
    "QUANTIZATION_CHOICES",
    "SINGLE_MODEL_KNOBS",
    "batch_of_job",
    "check",
    "empty_cache_effect",
    "job_spec",
    "predict",
    "recommend",
    "resolve",
    "rollout_families",
    "with_batch_of",
]
_job = resolved_job  # the tests' and benchmarks' name of it


def recommend(
    model: str | JobSpec,
    *,
    top: int = 3,
    lora_rank: int | str = "auto",
    seed: int = 0,
    db: str | None = None,
    save: bool = True,
    coefficients: Coefficients = DEFAULT_COEFFICIENTS,
    calibration: str = "auto",
    rollout: str = "auto",
    program: str | None = None,
    quantization: str = "auto",
    **job: Unpack[JobKeywords],
) -> Plan:
    """The fastest strategy predicted to fit, with its DeepSpeed config and the next best.

    ``quantization``: the base weights under LoRA. ``"auto"`` plans 16-bit weights and falls back to QLoRA (NF4
    4-bit base weights with LoRA adapters, bitsandbytes; a different recipe) only when no 16-bit plan fits, LoRA
    included; ``"none"`` never quantizes; ``"nf4"`` or ``"int8"`` plans QLoRA with those weights only (with
    ``lora_rank="auto"``, at rank 16).

    ``lora_rank="auto"`` fine-tunes every weight when some strategy fits, and falls back to LoRA
    (rank 16) only when none does; an integer fixes the rank (0 = full fine-tune). The plan is saved
    to the database (``db`` URL, ``PLANNER_DB``, or the user's data folder) unless ``save`` is False.
    ``calibration`` picks the coefficients fitted to probes (``planner.job.calibrated``): ``auto`` uses the
    newest calibration of the job's GPU in ``db``, ``none`` the defaults, an id that calibration.
    ``rollout`` (RLHF): what may generate the rollout, ``auto`` (all) or a comma-separated list of
    ``hybrid-engine`` (DeepSpeed's own generation), ``vllm`` and ``sglang``.
    ``program`` names your own program (its id from ``planner probe ... -- CMD``, or its script file): the plan
    keeps that program's measured spread of peak reserved free on top of the measured records' spread, where a
    run of it and memplan's own probe of the same strategy are stored (:mod:`planner.planning.program_spread`); a
    reading line and ``search.program_spread`` say which. Where a run of it saw how the program builds its model
    (under ``deepspeed.zero.Init`` or whole first: :mod:`planner.planning.program_build`), ZeRO-3 is planned so,
    in place of ``--framework``'s rule, with a reading line.
    """

    if not isinstance(top, int) or top < 0:
        raise InputError(f"--top must be a whole number >= 0, not {top!r}")
    if program is not None and (not isinstance(program, str) or not program.strip()):
        raise InputError("--program takes a program id (as planner probe -- CMD prints it) or your script's file")
    resolved = resolved_job(model, job, db)
    resolved, coefficients, calibration_block = calibrated(resolved, coefficients, choice=calibration, db=db)
    spread_block: dict[str, Any] | None = None
    if program is not None:
        found = program_spread(program, db)
        applied, line, spread_block = applied_spread(found, resolved.hardware.gpu.name)
        coefficients = replace(coefficients, program_reserved_factor=1.0 + applied)
        resolved = with_model_build(replace(resolved, readings=(*resolved.readings, line)), program, db)
    searched = search_with_fallbacks(
        resolved, coefficients, seed=seed, rollout=rollout, top=top, lora_rank=lora_rank, quantization=quantization
    )
    result = searched.result
    chosen = result.best or result.ranked[0]
    suggestions = searched.suggestions(resolved, coefficients)
    fastest = result.fastest_ignoring_memory  # a yardstick of time: its memory is the screen's (not replayed)
    overhead = None
    if fastest is not None and result.best is not None:
        overhead = chosen.prediction.step_time_s / fastest.prediction.step_time_s - 1.0
    report = prediction_report(resolved, chosen.strategy, chosen.prediction, calibration_block, coefficients)
    others = [c for c in result.feasible if c is not chosen][:top]
    result_plan = Plan(
        **dict(report),
        empty_cache_effect=empty_cache_effect(
            resolved.workload, chosen.strategy, resolved.hardware, chosen.prediction, coefficients
        ),
        alternatives=[alternative(c.strategy, c.prediction) for c in others],
        fastest_ignoring_memory=alternative(fastest.strategy, fastest.prediction) if fastest else None,
        overhead_vs_fastest=overhead,
        suggestions=suggestions,
        search={
            "sampler": result.sampler,
            "trials": result.trials,
            "replays": result.replays,
            "seed": seed,
            "lora_fallback": searched.lora_fallback,
        }
        | ({"program_spread": spread_block} if spread_block is not None else {}),
    )
    return save_plan(result_plan, db) if save else result_plan


def predict(
    model: str | JobSpec,
    strategy: Strategy | RLHFStrategy | dict[str, Any],
    *,
    calibration: str = "auto",
    db: str | None = None,
    **job: Unpack[JobKeywords],
) -> PredictionReport:
    """The prediction of one fixed strategy (the docs/contracts.md strategy shape of the workload) for the job.

    ``calibration`` and ``db`` as for ``recommend``: the newest calibration of the job's GPU, if any.

    A strategy document without ``grad_accum`` runs the job's global batch: ``micro_batch`` defaults to the
    samples (RLHF: sequences) per GPU per step and the accumulation makes up the rest (``batch_of_job``).
    One whose micro-batches make another batch sets the job's batch, unless ``batch`` was given (then it is
    an InputError).
    """

    spec = job_spec(model, job)
    resolved, coef, calibration_block = calibrated(resolve(spec, db), DEFAULT_COEFFICIENTS, choice=calibration, db=db)
    if not isinstance(strategy, (dict, Strategy, RLHFStrategy)):
        raise InputError(f"--strategy must be a JSON object (the strategy's knobs), not {type(strategy).__name__}")
    if isinstance(strategy, dict):
        strategy = batch_of_job(resolved, strategy)
    if resolved.workload.is_rlhf:
        fixed: Strategy | RLHFStrategy = (
            strategy if isinstance(strategy, RLHFStrategy) else RLHFStrategy.from_dict(as_dict(strategy))
        )
    else:
        fixed = strategy if isinstance(strategy, Strategy) else Strategy.from_dict(as_dict(strategy))
        resolved = with_batch_of(resolved, fixed, given=spec.batch is not None)
    prediction = predict_strategy(resolved.workload, fixed, resolved.hardware, coef)
    return prediction_report(resolved, fixed, prediction, calibration_block, coef)
