"""``export --format``: a saved plan written as the files of the framework that runs it.

``deepspeed`` (the default) writes the plan's DeepSpeed config(s) as stored; a single-model plan's config gets
``<stem>.memplan.json`` beside it, the settings outside the DeepSpeed config that ``planner check`` reads back
(``planner.planning.outside``). The other formats
(:data:`launch.frameworks.FORMATS`) rebuild the plan's workload, hardware and strategy from its document and
render them with :mod:`launch.frameworks`: the files go beside ``-o`` (all or none), and what the framework
cannot express of the plan comes back with them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch.frameworks import DEFAULT_OUTPUTS, check_format, file_layout, render
from planner.files.atomic import checked_output, write_configs, write_texts
from planner.job.inputs import ResolvedJob, resolve
from planner.planning.outside import sidecar_document, sidecar_path
from planner.planning.saved import plan, plan_job, planned_coefficients
from search import for_engine, tensor_parallel_refusal
from search import framework_differences as differences
from store.frameworks import DEFAULT_FRAMEWORK, ROLLOUT_ENGINES_RUN
from store.records import RLHF_WORKLOADS, RLHFStrategy, Strategy

if TYPE_CHECKING:
    from store.db import PlanRecord


def default_output(fmt: str) -> str:
    """The file ``-o`` names when left out, by format (``ds_config.json`` for ``deepspeed``)."""
    return DEFAULT_OUTPUTS[check_format(fmt)]


def write_export(
    record: PlanRecord, fmt: str, output: str | Path | None, *, force: bool, db: str | None
) -> tuple[list[Path], dict[str, Any]]:
    """Write ``record`` in format ``fmt``; returns the paths written and the plan's document, which for a
    framework format carries ``plan_id`` and an ``export`` block (format, files by role, gaps, notes). A plan
    made for another framework (its workload's ``framework``) gets ``framework_differences``: one line per way
    in which its prediction followed that framework's code and not ``fmt``'s (:func:`framework_differences`)."""
    check_format(fmt)
    target = checked_output(default_output(fmt) if output is None else output)
    differ = framework_differences(record.document, fmt)
    extra: dict[str, Any] = {"framework_differences": differ} if differ else {}
    if fmt == "deepspeed":
        if record.kind in RLHF_WORKLOADS:  # one config per model
            return write_configs(target, record.ds_config, force=force), {**record.document, **extra}
        outside = sidecar_document(record.strategy, plan_id=record.plan_id, config=target, model=record.model)
        texts = {target: _json(record.ds_config), sidecar_path(target): _json(outside)}
        return write_texts(texts, force=force), {**record.document, **extra}

    document = record.document
    job = resolve(plan_job(document, record.plan_id), db)
    parse = RLHFStrategy.from_dict if job.workload.is_rlhf else Strategy.from_dict
    strategy = parse(document["strategy"])
    layout = file_layout(fmt, str(target))
    engine_lines: tuple[str, ...] = ()
    if isinstance(strategy, RLHFStrategy):  # the engine the framework runs, at memplan's budget for it
        strategy, engine_lines = _framework_engine(document, job, strategy, fmt, db)
    rendered = render(fmt, strategy, job.workload, job.hardware, layout, engine_lines)
    paths = write_texts({Path(layout[role]): text for role, text in rendered.files.items()}, force=force)
    block = {"format": fmt, "files": layout, "gaps": list(rendered.gaps), "notes": list(rendered.notes)}
    return paths, {**document, "plan_id": record.plan_id, "export": block, **extra}


def _framework_engine(
    document: dict[str, Any], job: ResolvedJob, strategy: RLHFStrategy, fmt: str, db: str | None
) -> tuple[RLHFStrategy, tuple[str, ...]]:
    """The plan's strategy with its rollout engine as ``fmt`` runs it (``store.frameworks.ROLLOUT_ENGINES_RUN``):
    an engine the framework does not run becomes the framework's, at the utilization memplan predicted for it
    when it made the plan, with the line that says so: read from the plan's ``framework_rollouts``
    (:func:`planner.planning.figures.framework_rollouts`, the plan's own coefficients)."""
    engines = ROLLOUT_ENGINES_RUN.get(fmt)
    rollout = strategy.rollout
    if rollout is None:
        return strategy, ()
    engine = rollout.engine if not engines or rollout.engine in engines else engines[0]
    stored = document.get("framework_rollouts")
    if engine != rollout.engine and isinstance(stored, dict) and fmt in stored:
        entry = stored[fmt]
        return RLHFStrategy.from_dict(entry["strategy"]), tuple(entry.get("lines", ()))
    refused = tensor_parallel_refusal(engine, job.workload.model, rollout.tensor_parallel)
    if refused:  # a plan saved before the engine's rule (search.rollout.engine_accepts): the engine would not start
        return strategy, (f"{refused}: plan this job again (memplan now plans only sizes the engine accepts)",)
    if engine == rollout.engine:
        return strategy, ()
    return _solved_before(document, job, strategy, engines[0] if engines else engine, db)


def _solved_before(
    document: dict[str, Any], job: ResolvedJob, strategy: RLHFStrategy, engine: str, db: str | None
) -> tuple[RLHFStrategy, tuple[str, ...]]:
    """A plan saved before it kept ``framework_rollouts``: the framework's engine solved now, under the plan's
    calibration looked up again by its id (:func:`search.retarget.for_engine`)."""
    job, coef = planned_coefficients(document, job, db)
    found = for_engine(job.workload, strategy, job.hardware, engine, coef)
    return found.strategy, found.lines


def _json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def framework_differences(document: dict[str, Any], fmt: str) -> list[str]:
    """What differs between the framework a saved plan was made for and the one format ``fmt`` runs
    (``search.frameworks.differences``); empty for a plan made for ``fmt`` itself."""

    workload = document.get("workload") or {}
    planned = workload.get("framework", DEFAULT_FRAMEWORK)
    kind = workload.get("kind")
    if not isinstance(planned, str) or not isinstance(kind, str):
        return []
    return differences(planned, fmt, kind)


def export(
    plan_id: str | None = None,
    output: str | Path | None = None,
    *,
    force: bool = False,
    db: str | None = None,
    format: str = "deepspeed",
) -> tuple[list[Path], dict[str, Any]]:
    """Write a saved plan (the latest by default) in ``format`` to ``output``.

    ``format="deepspeed"`` (the default; ``output`` defaults to ``ds_config.json``) writes the DeepSpeed config,
    and beside it ``ds_config.memplan.json``: the plan's settings outside DeepSpeed's keys (LoRA rank,
    checkpointing, ``empty_cache``, allocator), which ``check`` of that config reads back; RLHF plans write one
    config per model beside ``output`` (``ds_config.actor.json``, ``ds_config.critic.json``, ...).
    ``openrlhf``, ``verl`` (RLHF), ``trl``, ``hf`` and ``accelerate`` (single-model; ``trl`` also GRPO) write that
    framework's files (a launch script, a config and the DeepSpeed config it points at: ``launch.frameworks``);
    the returned document then has an ``export`` block whose ``gaps`` say what the framework cannot express of
    the plan. Returns the paths written and the plan's document (whose ``outside_settings`` name what is not a
    DeepSpeed key). Refuses to overwrite an existing file unless ``force``; writes all files or none.
    """
    return write_export(plan(plan_id, db), format, output, force=force, db=db)
