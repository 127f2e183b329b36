"""``check``: whether a DeepSpeed config the user wrote (or ``planner export`` wrote) fits the job."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from launch.ds_config_deepspeed import check_with_deepspeed, read_as_deepspeed
from launch.ds_config_read import dtype_of_ds_config, strategy_from_ds_config
from planner.files.atomic import read_json_file
from planner.job.calibrated import calibrated
from planner.job.inputs import CONFIG_WORKLOAD, JobKeywords, JobSpec, resolve
from planner.planning.figures import prediction_report
from planner.planning.fixed import with_batch_of
from planner.planning.job_call import job_spec
from planner.planning.outside import merged_settings, read_sidecar
from planner.report.results import CheckResult
from search import DEFAULT_COEFFICIENTS, Prediction
from search import predict as predict_strategy
from store.errors import InputError


def check(
    ds_config: dict[str, Any] | str | Path,
    model: str | JobSpec,
    *,
    gradient_checkpointing: bool | None = None,
    lora_rank: int | None = None,
    empty_cache: str | None = None,
    allocator: str | None = None,
    loss: str | None = None,
    quantization: str | None = None,
    calibration: str = "auto",
    db: str | None = None,
    **job: Unpack[JobKeywords],
) -> CheckResult:
    """Whether a DeepSpeed config (dict or file) is predicted to fit the job's GPU and host memory.

    A config runs one trained model, so the workload defaults to ``CONFIG_WORKLOAD`` (sft) rather than the
    JobSpec's. The knobs that are not DeepSpeed keys are keywords: ``gradient_checkpointing``, ``lora_rank``,
    ``empty_cache``, ``allocator``, ``loss``, ``quantization`` (QLoRA's base weights: none, nf4 or int8). One
    left out (None) is the strategy's default or, for a config file
    that ``planner export`` wrote, the plan's own, read from the ``<stem>.memplan.json`` beside it
    (``planner.planning.outside``); one given that contradicts that file is an InputError. The dtype is the
    config's (a ``dtype`` that contradicts it is an InputError; "auto", as transformers writes it, is the job's);
    the global batch is the config's (the job's where its batch keys are "auto"). ``calibration`` and ``db`` as
    for ``recommend``. The config means what it means to DeepSpeed: where deepspeed is installed its own parser
    reads it (and an InputError says where it refuses it); elsewhere memplan's reader, which refuses the same in
    the blocks it reads.
    """

    raw = read_json_file(ds_config, "ds_config") if isinstance(ds_config, (str, Path)) else ds_config
    given = {
        "gradient_checkpointing": gradient_checkpointing,
        "lora_rank": lora_rank,
        "empty_cache": empty_cache,
        "allocator": allocator,
        "loss": loss,
        "quantization": quantization,
    }
    exported = read_sidecar(Path(ds_config)) if isinstance(ds_config, (str, Path)) else None
    outside = merged_settings(given, exported)
    if not isinstance(model, JobSpec):
        job.setdefault("workload", CONFIG_WORKLOAD)
    spec, config = _as_deepspeed_reads(raw, job_spec(model, job))
    resolved, coef, calibration_block = calibrated(resolve(spec, db), DEFAULT_COEFFICIENTS, choice=calibration, db=db)
    if exported is not None:
        resolved = replace(resolved, readings=(*resolved.readings, _outside_reading(*exported)))
    strategy, _ = strategy_from_ds_config(
        config,
        resolved.hardware.world_size,
        hidden_size=resolved.workload.model.hidden_size,
        auto_batch=resolved.workload.global_batch,  # "auto" batch keys: the job's --batch
        **outside,
    )
    if isinstance(raw, dict):  # the whole config, its batch at this world size, as deepspeed.initialize reads it
        check_with_deepspeed(raw, resolved.hardware.world_size, strategy.micro_batch, strategy.grad_accum)
    resolved = with_batch_of(resolved, strategy, given=spec.batch is not None)
    prediction = predict_strategy(resolved.workload, strategy, resolved.hardware, coef)
    report = prediction_report(resolved, strategy, prediction, calibration_block, coef)
    return CheckResult(fits=prediction.fits, reasons=_reasons(prediction), report=report)


def _as_deepspeed_reads(raw: Any, spec: JobSpec) -> tuple[JobSpec, Any]:
    """The config as DeepSpeed reads it where deepspeed is installed (else as given: memplan's reader refuses the
    same), and the job with the config's dtype (InputError where ``--dtype`` contradicts it)."""
    as_deepspeed_reads = read_as_deepspeed(raw) if isinstance(raw, dict) else None
    config = raw if as_deepspeed_reads is None else as_deepspeed_reads
    if isinstance(config, dict):
        config_dtype = dtype_of_ds_config(config)  # None: "auto", the job's dtype as transformers fills it
        if config_dtype is not None and spec.dtype not in (None, config_dtype):
            raise InputError(f"--dtype {spec.dtype} contradicts the config, which trains in {config_dtype}")
        spec = replace(spec, dtype=config_dtype or spec.dtype)
    return spec, config


def _outside_reading(settings: dict[str, Any], where: str) -> str:
    """The reading line of the settings an exported config's ``.memplan.json`` holds."""
    shown = ", ".join(
        f"{name} {str(value).lower() if isinstance(value, bool) else value}" for name, value in settings.items()
    )
    return f"outside the DeepSpeed config: {shown} ({where})"


def _reasons(prediction: Prediction) -> list[str]:
    """Why a prediction does not fit: the GPU, the host, or both (empty when it fits)."""
    reasons: list[str] = []
    if not prediction.fits_gpu:
        reasons.append(
            f"GPU: predicted peak reserved {prediction.peak_reserved_bytes / 2**30:.2f} GiB exceeds the usable "
            f"{prediction.gpu_budget_bytes / 2**30:.2f} GiB"
        )
    if not prediction.fits_host:
        parts = prediction.host_breakdown
        largest = max(parts, key=lambda name: parts[name]) if parts else ""
        reasons.append(
            f"host: predicted {prediction.host_bytes / 2**30:.2f} GiB per node exceeds --cpu-mem "
            f"{prediction.host_budget_bytes / 2**30:.2f} GiB"
            + (f" (largest part: {largest.replace('_', ' ')} {parts[largest] / 2**30:.2f} GiB)" if largest else "")
        )
    return reasons
