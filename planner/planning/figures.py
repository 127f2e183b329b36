"""Every figure a plan's report shows, computed once here with the coefficients the plan was made with.

A plan's document (:class:`planner.report.results.PredictionReport`) holds the prediction, the allocator replay
of its step (:func:`search.replay_memory`), each framework's launch flags and, for an RLHF plan whose rollout
engine a framework does not run, the engine that framework runs in its place at the budget memplan predicts for
it (:func:`search.retarget.for_engine`), and for ``recommend`` what its ``empty_cache`` placement saves and
costs (:func:`empty_cache_effect`). All of them are computed here, under the same coefficients as
the prediction (a calibration's, a program's spread); ``planner.report`` renders the document and ``planner
export`` writes its files from it, and neither computes a figure again.
"""

from __future__ import annotations

from typing import Any

from launch.ds_config import outside_settings, render_ds_config
from launch.frameworks import launch_entries
from launch.rlhf_config import render_rlhf_ds_configs, rlhf_outside_settings
from planner.job.inputs import ResolvedJob
from planner.report.prediction import predicted_block
from planner.report.results import FrameworkRollout, PredictionReport
from planner.report.strategy_record import PlanStrategy
from search import (
    Coefficients,
    Prediction,
    Retargeted,
    activation_source,
    for_engine,
    formula_reason,
    replay_memory,
    tensor_parallel_refusal,
    trainer_hardware,
    variant_sources,
)
from search import predict as predict_strategy
from store.activation_terms import GENERATION_WINDOWS
from store.errors import InputError
from store.framework_packages import packages_setting
from store.frameworks import ROLLOUT_ENGINES_RUN
from store.model_build import program_build
from store.records import Hardware, ModelSpec, RLHFStrategy, Strategy, Workload
from store.workload_kinds import traits

__all__ = ["allocator_replay", "empty_cache_effect", "framework_rollouts", "prediction_report"]


def framework_rollouts(
    strategy: RLHFStrategy, workload: Workload, hardware: Hardware, coef: Coefficients
) -> dict[str, Retargeted]:
    """For each framework that does not run the plan's rollout engine (``store.frameworks.ROLLOUT_ENGINES_RUN``):
    the strategy it runs, on its own engine at the budget memplan predicts for that engine under ``coef``, and
    the lines that say so (:func:`search.retarget.for_engine`; each engine solved once). A framework whose
    engine would refuse the plan's tensor-parallel size (:func:`search.rollout.engine_accepts`) keeps the plan's
    strategy with that refusal as its line. Empty for a plan without a rollout engine."""
    rollout = strategy.rollout
    if rollout is None:
        return {}
    solved: dict[str, Retargeted] = {}
    found: dict[str, Retargeted] = {}
    for name, engines in ROLLOUT_ENGINES_RUN.items():
        if rollout.engine in engines:
            continue
        engine = engines[0]
        if engine not in solved:
            refused = tensor_parallel_refusal(engine, workload.model, rollout.tensor_parallel)
            solved[engine] = (
                Retargeted(strategy, (f"{refused}: plan for this framework (its --framework) to get a plan it starts",))
                if refused
                else for_engine(workload, strategy, hardware, engine, coef)
            )
        found[name] = solved[engine]
    return found


def _framework_launch(
    strategy: RLHFStrategy, workload: Workload, hardware: Hardware, rollouts: dict[str, Retargeted]
) -> dict[str, dict[str, Any]]:
    """DeepSpeed-Chat, OpenRLHF 0.11, veRL and TRL launch flags and gaps, from the code that writes each
    framework's files (:func:`launch.frameworks.launch_entries`); a plan one of them cannot take gets its reason
    as the gap (the report is never refused for it). A framework that runs another rollout engine than the plan's
    gets the strategy of ``rollouts`` (:func:`framework_rollouts`), as ``planner export`` writes it."""

    try:
        entries = launch_entries(strategy, workload, hardware)
    except InputError as exc:
        return {"frameworks": {"flags": [], "gaps": [str(exc)]}}
    for name, found in rollouts.items():
        if name not in entries:
            continue
        try:
            entry = launch_entries(found.strategy, workload, hardware)[name]
        except InputError as exc:
            entry = {"flags": [], "gaps": [str(exc)]}
        entries[name] = {"flags": entry["flags"], "gaps": [*found.lines, *entry["gaps"]]}
    return entries


def allocator_replay(job: ResolvedJob, strategy: Strategy | RLHFStrategy, coef: Coefficients) -> dict[str, Any] | None:
    """The ``allocator_replay`` block: the step replayed through the port of torch's caching allocator under the
    plan's coefficients (:func:`search.replay_memory`); None for an RLHF plan with a rollout engine (the replay
    has no turn of the engine's process, nor the cache emptied for it)."""
    if isinstance(strategy, RLHFStrategy) and strategy.rollout is not None:
        return None
    return replay_memory(job.workload, strategy, job.hardware, coef).to_dict()


def _formula_reason(spec: ModelSpec, dtype: str, attn_impl: str, windows: tuple[str, ...]) -> dict[str, str]:
    """``{"activations_reason": why}`` where a model's activations come from the formulas, else nothing."""
    why = formula_reason(spec, dtype, attn_impl, windows)
    return {} if why is None else {"activations_reason": why}


def _workload_block(job: ResolvedJob) -> dict[str, Any]:
    """The ``workload`` block: the workload's document, its parameters, its models by role and where each model's
    counts come from (traced module tree or formula, and its experts if it has any)."""
    w = job.workload
    workload = w.to_dict()
    workload["params"] = w.model.total_params
    workload["roles"] = {role: spec.name for role, spec in w.role_models().items()}
    rlhf_windows = GENERATION_WINDOWS if w.is_rlhf else ()  # RLHF's generation and scoring are traced too
    workload["shapes"] = {
        role: {
            **spec.to_dict(),
            "activations": activation_source(spec, w.dtype, w.attn_impl, rlhf_windows),
            # why the formulas stand in for the trace, where they do (absent when traced)
            **_formula_reason(spec, w.dtype, w.attn_impl, rlhf_windows),
            # checkpointing and LoRA: traced as such, or composed from the full fine-tune's trace
            "activation_variants": variant_sources(spec, w.dtype, w.attn_impl),
        }
        for role, spec in w.role_models().items()
    }
    return workload


def prediction_report(
    job: ResolvedJob,
    strategy: Strategy | RLHFStrategy,
    prediction: Prediction,
    calibration: dict[str, Any] | None,
    coef: Coefficients,
) -> PredictionReport:
    """Workload, hardware, strategy, prediction, the DeepSpeed config(s) that run it, the calibration block of
    :func:`planner.job.calibrated.calibrated` (when one was looked up), and the figures beside the prediction:
    the allocator replay (:func:`allocator_replay`) and, for RLHF, each framework's launch flags and rollout
    engine (:func:`framework_rollouts`). ``coef``: the coefficients ``prediction`` was made with, which every
    figure here is computed with too."""
    common: dict[str, Any] = {
        "workload": _workload_block(job),
        "hardware": job.hardware.to_dict(),
        "strategy": strategy.to_dict(),
        "fits": prediction.fits,
        "predicted": predicted_block(prediction),
        "readings": list(job.readings),
        "allocator_replay": allocator_replay(job, strategy, coef),
        "calibration": calibration,
        "model_build": program_build(job.workload.framework, job.workload.model_build),
    }
    if isinstance(strategy, RLHFStrategy):
        rollouts = framework_rollouts(strategy, job.workload, job.hardware, coef)
        launch_flags: dict[str, list[str]] = {}
        gaps: dict[str, list[str]] = {}
        for name, entry in _framework_launch(strategy, job.workload, job.hardware, rollouts).items():
            launch_flags[name], gaps[name] = entry["flags"], entry["gaps"]
        trainer = job.hardware if strategy.rollout is None else trainer_hardware(job.hardware, strategy.rollout)
        return PredictionReport(
            **common,
            ds_configs=render_rlhf_ds_configs(strategy, job.workload, trainer),
            outside_settings=rlhf_outside_settings(strategy),
            launch={name: flags for name, flags in launch_flags.items() if flags},
            launch_gaps={name: notes for name, notes in gaps.items() if notes},
            framework_rollouts=None
            if strategy.rollout is None
            else {
                name: FrameworkRollout(strategy=PlanStrategy(found.strategy.to_dict()), lines=list(found.lines))
                for name, found in rollouts.items()
            },
        )
    return PredictionReport(
        **common,
        ds_config=render_ds_config(strategy, job.workload, job.hardware),
        # what the framework's step imports beyond its own install (store.framework_packages)
        outside_settings={**outside_settings(strategy), **packages_setting(job.workload.framework, strategy.loss)},
    )


def empty_cache_effect(
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    prediction: Prediction,
    coefficients: Coefficients,
) -> dict[str, Any]:
    """What an ``empty_cache`` placement saves and costs against never calling it.

    The chosen placement when it is not ``never``; otherwise, for comparison, the placement the paper
    measured (after every inference phase for RLHF and DPO, after every step for the others).
    """
    chosen = strategy.empty_cache != "never"
    if chosen:
        policy, placed = strategy.empty_cache, prediction
        never = predict_strategy(workload, strategy.with_(empty_cache="never"), hardware, coefficients)
    else:
        policy = (
            "after-inference"
            if traits(workload.kind).generates or traits(workload.kind).reference_forward
            else "every-step"
        )
        placed = predict_strategy(workload, strategy.with_(empty_cache=policy), hardware, coefficients)
        never = prediction
    saved = never.peak_reserved_bytes - placed.peak_reserved_bytes
    return {
        "policy": policy,
        "chosen": chosen,
        "peak_reserved_bytes": placed.peak_reserved_bytes,
        "peak_reserved_never_bytes": never.peak_reserved_bytes,
        "peak_reserved_saved_bytes": saved,
        "peak_reserved_saved_fraction": saved / never.peak_reserved_bytes,
        "step_time_added_fraction": placed.step_time_s / never.step_time_s - 1.0,
        "fits_without": never.fits,
    }
