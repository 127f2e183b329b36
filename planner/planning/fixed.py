"""A fixed strategy on a job (``predict``, ``check``): a strategy document completed to run the job's global
batch, and the job's global batch set by a strategy that runs another."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from planner.job.inputs import ResolvedJob
from search import per_gpu_batch
from store.errors import InputError
from store.records import RLHFStrategy, Strategy

# The knobs of the single-model strategy that an RLHF strategy keeps per model (in its actor/critic blocks).
SINGLE_MODEL_KNOBS = tuple(sorted({f.name for f in fields(Strategy)} - {f.name for f in fields(RLHFStrategy)}))


def as_dict(strategy: Strategy | RLHFStrategy | dict[str, Any]) -> dict[str, Any]:
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


def with_batch_of(job: ResolvedJob, strategy: Strategy, *, given: bool) -> ResolvedJob:
    """The job with the global batch a fixed strategy runs; a --batch the strategy does not cover is an error."""
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
