"""One rule for which model plays each RLHF role, and every face agrees with it.

For every combination of given/absent ``--critic-model``, ``--reward-model`` and ``--ref-model`` (PPO with a
1.3B actor; the other models are distinct sizes so a wrong pick shows), the cost model, the config
renderer, the probe's rebuilt workload and the report all use the models of ``Workload.model_for``.
Old behaviour this pins: with only ``--reward-model`` the cost model took the actor for the critic while
the configs built the reward model's shape.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from launch.rlhf_config import render_rlhf_ds_configs
from planner import predict
from planner.job.inputs import JobSpec, resolve
from planner.probing.plan import workload_payload
from probes.model.build import plan_from_request
from search import DEFAULT_COEFFICIENTS
from search import predict as predict_records
from store.ds_defaults import zero3_buckets
from store.measurements import ProbeRequest
from store.records import FrozenModelStrategy, RLHFStrategy, TrainedModelStrategy

ACTOR = "opt-1.3b"
GIVEN = {"critic_model": "opt-350m", "reward_model": "opt-125m", "ref_model": "opt-2.7b"}
COMBINATIONS = [
    dict(zip(GIVEN, chosen, strict=True)) for chosen in itertools.product(*[(None, name) for name in GIVEN.values()])
]
ZERO3 = TrainedModelStrategy(3, gradient_checkpointing=True)
STRATEGY = RLHFStrategy(
    actor=ZERO3,
    critic=ZERO3,
    reference=FrozenModelStrategy(3),
    reward=FrozenModelStrategy(3),
    generation_batch=1,
    micro_batch=1,
    grad_accum=1,
)
JOB = dict(workload="ppo", gpu_mem="80G", cpu_mem="256G", batch=1, prompt_len=16, gen_len=16)


def _expected(given: dict[str, str | None]) -> dict[str, str]:
    """DeepSpeed-Chat's convention, written out: critic from the reward model, reward from the critic."""
    critic = given["critic_model"] or given["reward_model"] or ACTOR
    reward = given["reward_model"] or given["critic_model"] or ACTOR
    return {"actor": ACTOR, "critic": critic, "reference": given["ref_model"] or ACTOR, "reward": reward}


def _id(given: dict[str, str | None]) -> str:
    return "+".join(role.split("_")[0] for role, name in given.items() if name) or "actor-only"


@pytest.mark.parametrize("given", COMBINATIONS, ids=[_id(g) for g in COMBINATIONS])
def test_every_face_uses_the_same_model_for_each_role(given: dict[str, Any]) -> None:
    job = resolve(JobSpec(model=ACTOR, **{k: v for k, v in given.items() if v}, **JOB))
    workload, hardware = job.workload, job.hardware
    expected = _expected(given)
    assert {role: spec.name for role, spec in workload.role_models().items()} == expected

    # cost model: the implicit roles predict exactly what the explicit ones do
    explicit = replace(
        workload,
        critic_model=workload.model_for("critic"),
        reward_model=workload.model_for("reward"),
        ref_model=workload.model_for("reference"),
    )
    implicit_prediction = predict_records(workload, STRATEGY, hardware, DEFAULT_COEFFICIENTS)
    assert (
        implicit_prediction.to_dict() == predict_records(explicit, STRATEGY, hardware, DEFAULT_COEFFICIENTS).to_dict()
    )

    # config renderer: ZeRO-3 buckets follow each model's hidden size
    configs = render_rlhf_ds_configs(STRATEGY, workload, hardware)
    for role, config in configs.items():
        model = workload.model_for(role)
        assert model.name == expected[role]
        bucket = config["zero_optimization"]["stage3_prefetch_bucket_size"]
        assert bucket == zero3_buckets(model).prefetch_bucket_size, role

    # probe: the workload the child rebuilds from the request has the same model in every role
    request = ProbeRequest(
        workload=workload_payload(workload), strategy=STRATEGY.to_dict(), hardware=hardware.to_dict(), device="cpu",
        steps=2,
    )  # fmt: skip
    rebuilt = plan_from_request(request).workload
    for role, name in expected.items():
        assert rebuilt.model_for(role).name == name
        assert rebuilt.model_for(role).total_params == workload.model_for(role).total_params

    # report: the JSON names the model of every role
    report = predict(ACTOR, STRATEGY.to_dict(), **{k: v for k, v in given.items() if v}, **JOB)
    assert report.model_dump()["workload"]["roles"] == expected
