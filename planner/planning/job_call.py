"""The job of an API call: the model and the job keywords of ``planner.job.inputs.JobSpec``, or a JobSpec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from planner.job.inputs import JobSpec, ResolvedJob, resolve

JOB_FIELDS = tuple(f.name for f in fields(JobSpec))


def job_spec(model: str | JobSpec, job: Mapping[str, Any]) -> JobSpec:
    """The JobSpec of an API call: ``model`` and the job keywords, or a JobSpec with keywords over its fields."""
    if isinstance(model, JobSpec):
        return replace(model, **job) if job else model
    return JobSpec(model=model, **job)


def resolved_job(model: str | JobSpec, job: Mapping[str, Any], db: str | None = None) -> ResolvedJob:
    """The call's job resolved (``planner.job.inputs.resolve``) against the database ``db``."""
    return resolve(job_spec(model, job), db)
