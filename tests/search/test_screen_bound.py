"""The search's screen never rules out a plan the allocator replay fits (issue 42).

The confirmation (search.choose.confirm) replays only points that :func:`near_fit` keeps; that is sound when
its floor (the screen's peak allocated less ``FLOOR_SLACK``) is a lower bound of the replay's peak reserved. Held
here as a property over every strategy of small jobs (ZeRO 0-3, offload, checkpointing, LoRA, micro-batches,
``empty_cache`` policies, allocators) for programs that build a ZeRO-3 model whole and under zero.Init. The
screen's reserved bytes (fragment coefficients, init-time cache) only order the replays.
"""

from __future__ import annotations

import pytest

from planner.planning.predicting import _job
from search import DEFAULT_COEFFICIENTS as C
from search import predict
from search.choose.confirm import near_fit, replay_floor
from search.choose.single_space import all_strategies
from search.single.predict import screen_single_model

JOBS = [
    ("opt-125m", "3G", "sft", "deepspeed"),
    ("gpt2", "4G", "dpo", "trl"),
    ("opt-125m", "3G", "reward", "hf"),
]
EVERY = 23  # every 23rd strategy of the space: each knob value is met, at a few dozen replays a job


@pytest.mark.parametrize(("model", "gpu", "kind", "framework"), JOBS)
def test_the_screens_floor_is_below_the_replay_and_keeps_every_fitting_plan(
    model: str, gpu: str, kind: str, framework: str
) -> None:
    job = _job(model, {"gpu_mem": gpu, "gpus": 2, "workload": kind, "framework": framework, "cpu_mem": "64G"})
    w, hw = job.workload, job.hardware
    strategies = list(all_strategies(w, hw, (0, 8)))[::EVERY]
    assert {s.zero_stage for s in strategies} == {0, 1, 2, 3}
    fitting = 0
    for strategy in strategies:
        screened = screen_single_model(w, strategy, hw, C)
        replayed = predict(w, strategy, hw, C)
        assert replay_floor(screened) <= replayed.peak_reserved_bytes, strategy.describe()
        if replayed.fits:
            fitting += 1
            assert near_fit(screened), strategy.describe()  # the confirmation would replay it
    assert 0 < fitting < len(strategies)  # the jobs sit at the boundary: some fit, some do not
