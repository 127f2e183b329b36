"""Plans for a job: ``recommend`` (the search), ``predict`` (one fixed strategy) and ``check`` (a DeepSpeed
config), each on the model and job keywords of ``planner.job.inputs.JobSpec`` (or a JobSpec), with the
calibration in force. ``planner.api`` exports them; the calibration from records files calls them here.

Each returns a typed pydantic result and raises ``store.errors.InputError`` for bad input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from functools import partial
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from launch.ds_config_deepspeed import check_with_deepspeed, read_as_deepspeed
from launch.ds_config_read import dtype_of_ds_config, strategy_from_ds_config
from planner.files.atomic import read_json_file
from planner.job.calibrated import calibrated
from planner.job.inputs import CONFIG_WORKLOAD, JobKeywords, JobSpec, ResolvedJob, resolve
from planner.planning.outside import merged_settings, read_sidecar
from planner.planning.program_spread import applied_spread, program_spread
from planner.planning.saved import save_plan
from planner.planning.suggest import what_would_fit
from planner.report.prediction import alternative, prediction_report
from planner.report.results import CheckResult, Plan, PredictionReport
from search import DEFAULT_COEFFICIENTS, Coefficients, Prediction
from search import predict as predict_strategy
from search import search as run_search
from search.batches import per_gpu_batch
from search.choose.rollout_space import ROLLOUT_FAMILIES
from store.errors import InputError
from store.quantization import QUANTIZATIONS
from store.records import MAX_COUNT, Hardware, RLHFStrategy, Strategy, Workload
from store.workload_kinds import traits

DEFAULT_LORA_RANK = 16
JOB_FIELDS = tuple(f.name for f in fields(JobSpec))
# The knobs of the single-model strategy that an RLHF strategy keeps per model (in its actor/critic blocks).
SINGLE_MODEL_KNOBS = tuple(sorted({f.name for f in fields(Strategy)} - {f.name for f in fields(RLHFStrategy)}))


def job_spec(model: str | JobSpec, job: Mapping[str, Any]) -> JobSpec:
    """The JobSpec of an API call: ``model`` and the job keywords, or a JobSpec with keywords over its fields."""
    if isinstance(model, JobSpec):
        return replace(model, **job) if job else model
    return JobSpec(model=model, **job)


def _job(model: str | JobSpec, job: Mapping[str, Any], db: str | None = None) -> ResolvedJob:
    return resolve(job_spec(model, job), db)


def rollout_families(rollout: str) -> tuple[str, ...]:
    """``--rollout``: ``auto`` (every family) or a comma-separated list of them; InputError otherwise."""
    if not isinstance(rollout, str):
        raise InputError(f"--rollout must be auto or a comma-separated list of {', '.join(ROLLOUT_FAMILIES)}")
    if rollout.strip() == "auto":
        return ROLLOUT_FAMILIES
    parts = [name.strip() for name in rollout.split(",")]
    if len(parts) > 1 and not all(parts):  # vllm,,sglang or vllm, : an empty item is a typo, not "nothing"
        shown = rollout if len(rollout) <= 40 else rollout[:37] + "..."
        raise InputError(f"--rollout has an empty item in {shown!r}: name each family once, comma-separated")
    names = tuple(dict.fromkeys(name for name in parts if name))
    unknown = [name for name in names if name not in ROLLOUT_FAMILIES]
    if unknown or not names:
        shown = ", ".join(unknown) or repr(rollout)
        raise InputError(f"--rollout takes auto or any of {', '.join(ROLLOUT_FAMILIES)} (comma-separated), not {shown}")
    return names


QUANTIZATION_CHOICES: tuple[str, ...] = ("auto", *QUANTIZATIONS)  # store.choices.Quantization, or auto


def _lora_ranks(lora_rank: int | str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ranks to search first, ranks to fall back to when nothing fits)."""
    if lora_rank == "auto":
        return (0,), (DEFAULT_LORA_RANK,)
    try:
        rank = int(lora_rank)
    except (TypeError, ValueError):
        raise InputError(f"--lora-rank must be auto or a whole number >= 0, not {lora_rank!r}") from None
    if not 0 <= rank <= MAX_COUNT:  # checked before the search: an RLHF search would fail one trial per rank
        shown = str(lora_rank) if len(str(lora_rank)) <= 24 else str(lora_rank)[:21] + "..."
        raise InputError(f"--lora-rank must be auto or a whole number from 0 to {MAX_COUNT}, not {shown}")
    return (rank,), ()


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
    reading line and ``search.program_spread`` say which.
    """

    if not isinstance(top, int) or top < 0:
        raise InputError(f"--top must be a whole number >= 0, not {top!r}")
    if program is not None and (not isinstance(program, str) or not program.strip()):
        raise InputError("--program takes a program id (as planner probe -- CMD prints it) or your script's file")
    resolved = _job(model, job, db)
    resolved, coefficients, calibration_block = calibrated(resolved, coefficients, choice=calibration, db=db)
    spread_block: dict[str, Any] | None = None
    if program is not None:
        found = program_spread(program, db)
        applied, line, spread_block = applied_spread(found, resolved.hardware.gpu.name)
        coefficients = replace(coefficients, program_reserved_factor=1.0 + applied)
        resolved = replace(resolved, readings=(*resolved.readings, line))
    workload, hardware = resolved.workload, resolved.hardware
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        shown = str(seed) if len(str(seed)) <= 24 else str(seed)[:21] + "..."
        raise InputError(f"--seed must be a whole number from 0 to {2**32 - 1} (the sampler's range), not {shown}")
    if quantization not in QUANTIZATION_CHOICES:
        raise InputError(f"--quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, not {quantization!r}")
    first, fallback = _lora_ranks(lora_rank)
    bases: tuple[str, ...] = ("none",)
    if quantization in ("nf4", "int8"):
        if workload.is_rlhf:
            raise InputError("--quantization: QLoRA is planned for sft, reward and dpo, not for RLHF's trained models")
        if first == (0,) and not fallback:
            raise InputError("--quantization needs LoRA adapters: QLoRA trains adapters over 4-bit weights")
        first, fallback, bases = fallback or first, (), (quantization,)
    rollouts = rollout_families(rollout)
    # with a LoRA fallback, the closest full fine-tune is ranked only if LoRA does not fit either
    # the RLHF bound walk ranks the best and ``top`` alternatives exactly
    searching = partial(run_search, workload, hardware, coefficients, seed=seed, rollouts=rollouts, alternatives=top)
    if bases != ("none",):
        searching = partial(searching, quantizations=bases)
    result = searching(lora_ranks=first, closest=not fallback)
    searched = {first: result}
    used_fallback = False
    if result.best is None and fallback:
        retry = searched[fallback] = searching(lora_ranks=fallback, closest=False)
        if retry.best is not None:
            result, used_fallback = retry, True
        elif not result.ranked:  # its bounds proved that nothing fits: rank the closest now
            result = searched[first] = searching(lora_ranks=first)
    # QLoRA (4-bit base weights, a different recipe) only where no 16-bit plan fits, LoRA included
    adapters = fallback or tuple(r for r in first if r > 0)
    used_qlora = False
    if result.best is None and adapters and not workload.is_rlhf and quantization == "auto":
        quantized = searching(lora_ranks=adapters, closest=False, quantizations=("nf4",))
        if quantized.best is not None:
            result, used_qlora = quantized, True
    chosen = result.best or result.ranked[0]
    suggestions: list[str] = []
    if used_qlora:
        suggestions.append(
            f"no 16-bit plan fits, LoRA included, so this plan trains QLoRA: NF4 4-bit base weights (bitsandbytes) "
            f"with LoRA rank {adapters[0]} adapters, a different recipe from 16-bit LoRA "
            "(pass --lora-rank 0 to see the closest full fine-tune)"
        )
    elif used_fallback:
        suggestions.append(
            f"no full fine-tune fits, so this plan trains LoRA rank {DEFAULT_LORA_RANK} adapters "
            "(pass --lora-rank 0 to see the closest full fine-tune)"
        )
    if result.best is None or used_fallback or used_qlora:
        include_lora = not (used_fallback or used_qlora)
        suggestions.extend(what_would_fit(resolved, coefficients, include_lora=include_lora, searched=searched))
    fastest = result.fastest_ignoring_memory  # a yardstick of time: its memory is the screen's (not replayed)
    overhead = None
    if fastest is not None and result.best is not None:
        overhead = chosen.prediction.step_time_s / fastest.prediction.step_time_s - 1.0
    report = prediction_report(resolved, chosen.strategy, chosen.prediction, calibration_block, coefficients)
    others = [c for c in result.feasible if c is not chosen][:top]
    result_plan = Plan(
        **dict(report),
        empty_cache_effect=empty_cache_effect(workload, chosen.strategy, hardware, chosen.prediction, coefficients),
        alternatives=[alternative(c.strategy, c.prediction) for c in others],
        fastest_ignoring_memory=alternative(fastest.strategy, fastest.prediction) if fastest else None,
        overhead_vs_fastest=overhead,
        suggestions=suggestions,
        search={
            "sampler": result.sampler,
            "trials": result.trials,
            "replays": result.replays,
            "seed": seed,
            "lora_fallback": used_fallback,
        }
        | ({"program_spread": spread_block} if spread_block is not None else {}),
    )
    return save_plan(result_plan, db) if save else result_plan


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
            strategy if isinstance(strategy, RLHFStrategy) else RLHFStrategy.from_dict(_as_dict(strategy))
        )
    else:
        fixed = strategy if isinstance(strategy, Strategy) else Strategy.from_dict(_as_dict(strategy))
        resolved = _with_batch_of(resolved, fixed, given=spec.batch is not None)
    prediction = predict_strategy(resolved.workload, fixed, resolved.hardware, coef)
    return prediction_report(resolved, fixed, prediction, calibration_block, coef)


def _as_dict(strategy: Strategy | RLHFStrategy | dict[str, Any]) -> dict[str, Any]:
    """A strategy document: a dictionary as given, or the shape's own (a strategy of the other shape)."""
    return dict(strategy) if isinstance(strategy, dict) else strategy.to_dict()


def batch_of_job(job: ResolvedJob, data: dict[str, Any]) -> dict[str, Any]:
    """A strategy document completed to run the job's global batch, when it leaves ``grad_accum`` out.

    ``micro_batch`` defaults to everything one GPU takes per step (samples; for RLHF the prompts per GPU
    times the samples per prompt) and ``grad_accum`` is what makes up the rest. A strategy with
    ``grad_accum`` is returned as is. Single-model knobs under an RLHF workload are an InputError naming
    both ways out.
    """
    w = job.workload
    if w.is_rlhf:
        single = [k for k in SINGLE_MODEL_KNOBS if k in data]
        if single:
            raise InputError(
                f"{', '.join(single)}: single-model knobs; --workload {w.kind} takes an RLHF strategy with "
                "actor/critic/reference/reward blocks (--strategy), or pass --workload sft, reward or dpo"
            )
    if "grad_accum" in data:
        return data
    per_gpu = per_gpu_batch(w, job.hardware) * (w.samples_per_prompt if w.is_rlhf else 1)
    unit = "sequences" if w.is_rlhf else "samples"
    micro = data.get("micro_batch", per_gpu)
    if isinstance(micro, bool) or not isinstance(micro, int) or micro <= 0 or per_gpu % micro:
        raise InputError(
            f"--micro-batch {micro} does not divide the {per_gpu} {unit} per GPU of the global batch "
            f"(--batch {w.global_batch} over {job.hardware.world_size} GPUs)"
        )
    return {**data, "micro_batch": micro, "grad_accum": per_gpu // micro}


def _with_batch_of(job: ResolvedJob, strategy: Strategy, *, given: bool) -> ResolvedJob:
    """The job with the global batch a fixed strategy runs; a --batch the strategy does not cover is an error."""
    from dataclasses import replace

    batch = strategy.micro_batch * strategy.grad_accum * job.hardware.world_size
    if batch == job.workload.global_batch:
        return job
    if given:
        raise InputError(
            f"the strategy runs micro_batch {strategy.micro_batch} x grad_accum {strategy.grad_accum} x "
            f"{job.hardware.world_size} GPUs = {batch} samples per step, not --batch {job.workload.global_batch}"
        )
    readings = tuple(r for r in job.readings if not r.startswith("global batch"))
    return ResolvedJob(
        workload=replace(job.workload, global_batch=batch),
        hardware=job.hardware,
        readings=readings + (f"global batch: {batch} (micro_batch x grad_accum x GPUs of the strategy)",),
    )


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
    spec = job_spec(model, job)
    # DeepSpeed's own reading where deepspeed is installed (None: memplan's reader, which refuses the same)
    as_deepspeed_reads = read_as_deepspeed(raw) if isinstance(raw, dict) else None
    config = raw if as_deepspeed_reads is None else as_deepspeed_reads
    if isinstance(config, dict):
        config_dtype = dtype_of_ds_config(config)  # None: "auto", the job's dtype as transformers fills it
        if config_dtype is not None and spec.dtype not in (None, config_dtype):
            raise InputError(f"--dtype {spec.dtype} contradicts the config, which trains in {config_dtype}")
        spec = replace(spec, dtype=config_dtype or spec.dtype)
    resolved, coef, calibration_block = calibrated(resolve(spec, db), DEFAULT_COEFFICIENTS, choice=calibration, db=db)
    if exported is not None:
        settings, where = exported
        shown = ", ".join(
            f"{name} {str(value).lower() if isinstance(value, bool) else value}" for name, value in settings.items()
        )
        resolved = replace(resolved, readings=(*resolved.readings, f"outside the DeepSpeed config: {shown} ({where})"))
    strategy, _ = strategy_from_ds_config(
        config,
        resolved.hardware.world_size,
        hidden_size=resolved.workload.model.hidden_size,
        auto_batch=resolved.workload.global_batch,  # "auto" batch keys: the job's --batch
        **outside,
    )
    if isinstance(raw, dict):  # the whole config, its batch at this world size, as deepspeed.initialize reads it
        check_with_deepspeed(raw, resolved.hardware.world_size, strategy.micro_batch, strategy.grad_accum)
    resolved = _with_batch_of(resolved, strategy, given=spec.batch is not None)
    prediction = predict_strategy(resolved.workload, strategy, resolved.hardware, coef)
    report = prediction_report(resolved, strategy, prediction, calibration_block, coef)
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
    return CheckResult(fits=prediction.fits, reasons=reasons, report=report)
