"""The Python API: ``recommend``, ``predict``, ``check``, ``export`` and ``plans``.

Each function takes the same job keywords as the CLI (see ``planner.inputs.JobSpec``), returns a typed
pydantic result and raises ``store.errors.InputError`` for bad input. The CLI is a thin loop over these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.inputs import JobSpec, ResolvedJob, resolve
from planner.reports import alternative, prediction_report
from planner.results import CheckResult, Plan, PredictionReport
from planner.suggest import what_would_fit
from probes.ds_config_read import dtype_of_ds_config, strategy_from_ds_config
from search import DEFAULT_COEFFICIENTS, Coefficients, Prediction
from search import predict as predict_strategy
from search import search as run_search
from store.errors import InputError
from store.records import Hardware, RLHFStrategy, Strategy, Workload

DEFAULT_LORA_RANK = 16


def _job(model: str | JobSpec, job: dict[str, Any]) -> ResolvedJob:
    spec = model if isinstance(model, JobSpec) else JobSpec(model=model, **job)
    return resolve(spec)


def _lora_ranks(lora_rank: int | str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ranks to search first, ranks to fall back to when nothing fits)."""
    if lora_rank == "auto":
        return (0,), (DEFAULT_LORA_RANK,)
    try:
        rank = int(lora_rank)
    except (TypeError, ValueError):
        raise InputError(f"--lora-rank must be auto or a whole number >= 0, not {lora_rank!r}") from None
    if rank < 0:
        raise InputError(f"--lora-rank must be auto or a whole number >= 0, not {lora_rank!r}")
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
    **job: Any,
) -> Plan:
    """The fastest strategy predicted to fit, with its DeepSpeed config and the next best.

    ``lora_rank="auto"`` fine-tunes every weight when some strategy fits, and falls back to LoRA
    (rank 16) only when none does; an integer fixes the rank (0 = full fine-tune). The plan is saved
    to the database (``db`` URL, ``PLANNER_DB``, or the user's data folder) unless ``save`` is False.
    """
    if not isinstance(top, int) or top < 0:
        raise InputError(f"--top must be a whole number >= 0, not {top!r}")
    resolved = _job(model, job)
    workload, hardware = resolved.workload, resolved.hardware
    first, fallback = _lora_ranks(lora_rank)
    result = run_search(workload, hardware, coefficients, lora_ranks=first, seed=seed)
    used_fallback = False
    if result.best is None and fallback:
        retry = run_search(workload, hardware, coefficients, lora_ranks=fallback, seed=seed)
        if retry.best is not None:
            result, used_fallback = retry, True
    chosen = result.best or result.ranked[0]
    suggestions: list[str] = []
    if used_fallback:
        suggestions.append(
            f"no full fine-tune fits, so this plan trains LoRA rank {DEFAULT_LORA_RANK} adapters "
            "(pass --lora-rank 0 to see the closest full fine-tune)"
        )
    if result.best is None or used_fallback:
        suggestions.extend(what_would_fit(resolved, coefficients, include_lora=not used_fallback))
    fastest = result.fastest_ignoring_memory
    overhead = None
    if fastest is not None and result.best is not None:
        overhead = chosen.prediction.step_time_s / fastest.prediction.step_time_s - 1.0
    report = prediction_report(resolved, chosen.strategy, chosen.prediction)
    others = [c for c in result.feasible if c is not chosen][:top]
    plan = Plan(
        **dict(report),
        empty_cache_effect=empty_cache_effect(workload, chosen.strategy, hardware, chosen.prediction, coefficients),
        alternatives=[alternative(c.strategy, c.prediction) for c in others],
        fastest_ignoring_memory=alternative(fastest.strategy, fastest.prediction) if fastest else None,
        overhead_vs_fastest=overhead,
        suggestions=suggestions,
        search={"sampler": result.sampler, "trials": result.trials, "seed": seed, "lora_fallback": used_fallback},
    )
    if save:
        plan = _save(plan, db)
    return plan


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
        policy = "after-inference" if workload.is_rlhf or workload.kind == "dpo" else "every-step"
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


def _save(plan: Plan, db: str | None) -> Plan:
    from store.db import open_storage

    storage = open_storage(db)
    try:
        record = storage.save_plan(
            kind=plan.workload["kind"],
            model=plan.workload["model"],
            fits=plan.fits,
            workload=plan.workload,
            hardware=plan.hardware,
            strategy=plan.strategy,
            predicted=plan.predicted.model_dump(),
            ds_config=plan.ds_config if plan.ds_config is not None else plan.ds_configs,
            document=plan.model_dump(exclude={"plan_id"}),
        )
    finally:
        storage.close()
    return plan.model_copy(update={"plan_id": record.plan_id})


def predict(model: str | JobSpec, strategy: Strategy | dict[str, Any], **job: Any) -> PredictionReport:
    """The prediction of one fixed strategy (the DESIGN.md single-model shape) for the job."""
    resolved = _job(model, job)
    if resolved.workload.is_rlhf:
        fixed: Strategy | RLHFStrategy = (
            strategy if isinstance(strategy, RLHFStrategy) else RLHFStrategy.from_dict(dict(strategy))
        )
    else:
        fixed = strategy if isinstance(strategy, Strategy) else Strategy.from_dict(strategy)
        given = isinstance(model, JobSpec) or job.get("batch") is not None
        resolved = _with_batch_of(resolved, fixed, given=given)
    prediction = predict_strategy(resolved.workload, fixed, resolved.hardware)
    return prediction_report(resolved, fixed, prediction)


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


def check(ds_config: dict[str, Any] | str | Path, model: str | JobSpec, **job: Any) -> CheckResult:
    """Whether a DeepSpeed config (dict or file) is predicted to fit the job's GPU and host memory.

    Knobs that are not DeepSpeed keys (gradient checkpointing, LoRA rank, ``empty_cache``, allocator)
    come from ``job`` keywords ``gradient_checkpointing``, ``lora_rank``, ``empty_cache``, ``allocator``.
    """
    from planner.files import read_json_file

    config = read_json_file(ds_config, "ds_config") if isinstance(ds_config, (str, Path)) else ds_config
    outside = {k: job.pop(k) for k in ("gradient_checkpointing", "lora_rank", "empty_cache", "allocator") if k in job}
    if isinstance(config, dict):
        config_dtype = dtype_of_ds_config(config)
        if job.get("dtype") not in (None, config_dtype):
            raise InputError(f"--dtype {job['dtype']} contradicts the config, which trains in {config_dtype}")
        job["dtype"] = config_dtype
    resolved = _job(model, job)
    strategy, _ = strategy_from_ds_config(config, resolved.hardware.world_size, **outside)
    resolved = _with_batch_of(resolved, strategy, given=False)
    prediction = predict_strategy(resolved.workload, strategy, resolved.hardware)
    report = prediction_report(resolved, strategy, prediction)
    reasons: list[str] = []
    if not prediction.fits_gpu:
        reasons.append(
            f"GPU: predicted peak reserved {prediction.peak_reserved_bytes / 2**30:.2f} GiB exceeds the usable "
            f"{prediction.gpu_budget_bytes / 2**30:.2f} GiB"
        )
    if not prediction.fits_host:
        reasons.append(
            f"host: predicted {prediction.host_bytes / 2**30:.2f} GiB exceeds --cpu-mem "
            f"{prediction.host_budget_bytes / 2**30:.2f} GiB"
        )
    return CheckResult(fits=prediction.fits, reasons=reasons, report=report)


def plans(db: str | None = None, limit: int = 20, kind: str | None = None) -> list[Any]:
    """Saved plans, newest first (frozen ``store.db.PlanRecord`` values)."""
    from store.db import open_storage

    storage = open_storage(db)
    try:
        return storage.list_plans(limit=limit, kind=kind)
    finally:
        storage.close()


def export(
    plan_id: str | None = None, output: str | Path = "ds_config.json", *, force: bool = False, db: str | None = None
) -> tuple[list[Path], dict[str, Any]]:
    """Write the DeepSpeed config of a saved plan (the latest by default) to ``output``.

    RLHF plans write one config per model beside it (``ds_config.actor.json``, ``ds_config.critic.json``,
    ...). Returns the paths written and the plan's document (whose ``outside_settings`` name what is not a
    DeepSpeed key). Refuses to overwrite an existing file unless ``force``.
    """
    from planner.files import write_configs
    from store.db import open_storage

    storage = open_storage(db)
    try:
        record = storage.get_plan(plan_id) if plan_id else storage.latest_plan()
    finally:
        storage.close()
    if record is None:
        raise InputError("no plans saved yet: run `planner recommend ...` first")
    paths = write_configs(Path(output), record.ds_config, force=force)
    return paths, record.document


def probe(model: str | JobSpec, **options: Any) -> Any:
    """Run strategies for a few real steps and compare with the prediction (see ``planner.probing.probe``)."""
    from planner.probing import probe as run

    return run(model, **options)
