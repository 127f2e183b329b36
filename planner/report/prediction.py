"""Building the typed results from records and predictions (no I/O)."""

from __future__ import annotations

from typing import Any

from launch.ds_config import outside_settings, render_ds_config
from launch.frameworks import launch_entries
from launch.rlhf_config import render_rlhf_ds_configs, rlhf_outside_settings
from planner.job.inputs import ResolvedJob
from planner.report.results import Alternative, Predicted, PredictionReport
from search import Prediction, replay_memory
from search.model.activations import source as activation_source
from search.model.activations import variant_sources
from search.rollout.step import trainer_hardware
from store.activation_terms import GENERATION_WINDOWS
from store.errors import InputError
from store.records import Hardware, RLHFStrategy, Strategy, Workload


def _framework_launch(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> dict[str, dict[str, Any]]:
    """DeepSpeed-Chat, OpenRLHF 0.11, veRL and TRL launch flags and gaps, from the code that writes each
    framework's files (:func:`launch.frameworks.launch_entries`); a plan one of them cannot take gets its reason
    as the gap (the report is never refused for it)."""

    try:
        return launch_entries(strategy, workload, hardware)
    except InputError as exc:
        return {"frameworks": {"flags": [], "gaps": [str(exc)]}}


def predicted_block(prediction: Prediction) -> Predicted:
    """The ``predicted`` block of the JSON document."""
    return Predicted.model_validate(prediction.to_dict())


def alternative(strategy: Strategy | RLHFStrategy, prediction: Prediction) -> Alternative:
    return Alternative(strategy=strategy.to_dict(), predicted=predicted_block(prediction))


def _trainer(strategy: RLHFStrategy, hardware: Hardware) -> Hardware:
    """The GPUs DeepSpeed trains on: all of them, less those a separate rollout engine has to itself."""

    return hardware if strategy.rollout is None else trainer_hardware(hardware, strategy.rollout)


def prediction_report(
    job: ResolvedJob,
    strategy: Strategy | RLHFStrategy,
    prediction: Prediction,
    calibration: dict[str, Any] | None = None,
) -> PredictionReport:
    """Workload, hardware, strategy, prediction and the DeepSpeed config(s) that run it (and the calibration
    block of :func:`planner.job.calibrated.calibrated`, when one was looked up)."""
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
        for name, entry in _framework_launch(strategy, job.workload, job.hardware).items():
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
        outside_settings=outside_settings(strategy),
    )
