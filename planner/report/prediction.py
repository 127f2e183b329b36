"""Building the typed results from records and predictions (no I/O)."""

from __future__ import annotations

from typing import Any

from launch.ds_config import outside_settings, render_ds_config
from launch.frameworks import launch_entries
from launch.rlhf_config import render_rlhf_ds_configs, rlhf_outside_settings
from planner.job.inputs import ResolvedJob
from planner.report.results import Alternative, Predicted, PredictionReport
from planner.report.strategy_record import PlanStrategy
from search import Prediction, replay_memory
from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients
from search.model.activation_sources import formula_reason, variant_sources
from search.model.activation_sources import source as activation_source
from search.retarget import Retargeted, for_engine
from search.rlhf.engine_step import trainer_hardware
from store.activation_terms import GENERATION_WINDOWS
from store.errors import InputError
from store.framework_packages import packages_setting
from store.frameworks import ROLLOUT_ENGINES_RUN
from store.records import Hardware, ModelSpec, RLHFStrategy, Strategy, Workload


def _framework_launch(
    strategy: RLHFStrategy, workload: Workload, hardware: Hardware, coef: Coefficients = DEFAULT_COEFFICIENTS
) -> dict[str, dict[str, Any]]:
    """DeepSpeed-Chat, OpenRLHF 0.11, veRL and TRL launch flags and gaps, from the code that writes each
    framework's files (:func:`launch.frameworks.launch_entries`); a plan one of them cannot take gets its reason
    as the gap (the report is never refused for it). A framework that runs another rollout engine than the plan's
    (``store.frameworks.ROLLOUT_ENGINES_RUN``) gets its own engine at the budget memplan predicts for it
    (:func:`search.retarget.for_engine`), as ``planner export`` writes it."""

    try:
        entries = launch_entries(strategy, workload, hardware)
    except InputError as exc:
        return {"frameworks": {"flags": [], "gaps": [str(exc)]}}
    retargeted: dict[str, Retargeted] = {}
    for name, engines in ROLLOUT_ENGINES_RUN.items():
        if name in entries and strategy.rollout is not None and strategy.rollout.engine not in engines:
            engine = engines[0]
            if engine not in retargeted:
                retargeted[engine] = for_engine(workload, strategy, hardware, engine, coef)
            found = retargeted[engine]
            try:
                entry = launch_entries(found.strategy, workload, hardware)[name]
            except InputError as exc:
                entry = {"flags": [], "gaps": [str(exc)]}
            entries[name] = {"flags": entry["flags"], "gaps": [*found.lines, *entry["gaps"]]}
    return entries


def _formula_reason(spec: ModelSpec, dtype: str, attn_impl: str, windows: tuple[str, ...]) -> dict[str, str]:
    """``{"activations_reason": why}`` where a model's activations come from the formulas, else nothing."""
    why = formula_reason(spec, dtype, attn_impl, windows)
    return {} if why is None else {"activations_reason": why}


def predicted_block(prediction: Prediction) -> Predicted:
    """The ``predicted`` block of the JSON document."""
    return Predicted.model_validate(prediction.to_dict())


def alternative(strategy: Strategy | RLHFStrategy, prediction: Prediction) -> Alternative:
    return Alternative(strategy=PlanStrategy(strategy.to_dict()), predicted=predicted_block(prediction))


def _trainer(strategy: RLHFStrategy, hardware: Hardware) -> Hardware:
    """The GPUs DeepSpeed trains on: all of them, less those a separate rollout engine has to itself."""

    return hardware if strategy.rollout is None else trainer_hardware(hardware, strategy.rollout)


def prediction_report(
    job: ResolvedJob,
    strategy: Strategy | RLHFStrategy,
    prediction: Prediction,
    calibration: dict[str, Any] | None = None,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> PredictionReport:
    """Workload, hardware, strategy, prediction and the DeepSpeed config(s) that run it (and the calibration
    block of :func:`planner.job.calibrated.calibrated`, when one was looked up); ``coef``: the coefficients of the
    prediction, with which a framework's own rollout engine is re-solved (:func:`_framework_launch`)."""
    workload = job.workload.to_dict()
    workload["params"] = job.workload.model.total_params
    workload["roles"] = {role: spec.name for role, spec in job.workload.role_models().items()}
    # where each model's counts come from (traced module tree or formula), and its experts if it has any
    w = job.workload
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
    common: dict[str, Any] = {
        "workload": workload,
        "hardware": job.hardware.to_dict(),
        "strategy": strategy.to_dict(),
        "fits": prediction.fits,
        "predicted": predicted_block(prediction),
        "readings": list(job.readings),
        # the replay has no rollout engine's turn (its process, the cache emptied for it): none for such a plan
        "allocator_replay": None
        if isinstance(strategy, RLHFStrategy) and strategy.rollout is not None
        else replay_memory(job.workload, strategy, job.hardware).to_dict(),
        "calibration": calibration,
    }
    if isinstance(strategy, RLHFStrategy):
        launch_flags: dict[str, list[str]] = {}
        gaps: dict[str, list[str]] = {}
        for name, entry in _framework_launch(strategy, job.workload, job.hardware, coef).items():
            launch_flags[name], gaps[name] = entry["flags"], entry["gaps"]
        return PredictionReport(
            **common,
            ds_configs=render_rlhf_ds_configs(strategy, job.workload, _trainer(strategy, job.hardware)),
            outside_settings=rlhf_outside_settings(strategy),
            launch={name: flags for name, flags in launch_flags.items() if flags},
            launch_gaps={name: notes for name, notes in gaps.items() if notes},
        )
    return PredictionReport(
        **common,
        ds_config=render_ds_config(strategy, job.workload, job.hardware),
        # what the framework's step imports beyond its own install (store.framework_packages)
        outside_settings={**outside_settings(strategy), **packages_setting(job.workload.framework, strategy.loss)},
    )
