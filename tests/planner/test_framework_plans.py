"""Issue 42's cases end to end: ``recommend --framework X`` chooses a plan that X runs as planned (its frozen models'
ZeRO stage and offload, its own rollout engine at a tensor-parallel size the engine accepts), and the export for X
names no such gap."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import CliResult

from search.rollout.engine_accepts import tensor_parallel_refusal
from store.framework_placement import frozen_blocks_run, generations_run
from store.models import get_model
from store.records import FrozenModelStrategy, TrainedModelStrategy

Cli = Callable[..., CliResult]
# The GRPO job: qwen2.5-7b (28 attention heads, 4 KV heads) on 8 x H100
GRPO = ("--model", "qwen2.5-7b", "--gpu", "H100-80G", "--gpus", "8", "--workload", "grpo", "--cpu-mem", "1T")
# what each export says of a plan whose frozen models or engine the framework runs otherwise
FROZEN_GAPS = {"openrlhf": "OpenRLHF holds the", "trl": "TRL prepares the"}
OUTPUTS = {"openrlhf": "run_openrlhf.sh", "trl": "trl_config.py"}
ENGINE_GAPS = ("engine differs", "runs here as", "runs vLLM engines only", "generates with vLLM or transformers only")


def _frozen(block: dict) -> FrozenModelStrategy:  # type: ignore[type-arg]
    return FrozenModelStrategy(block["zero_stage"], block["offload"])


@pytest.mark.parametrize("framework", ["openrlhf", "trl"])
def test_grpo_plan_runs_as_the_framework_builds_it(cli: Cli, db: Path, framework: str) -> None:
    planned = cli("recommend", *GRPO, "--framework", framework, "--top", "0", "--json", "--db", db)
    assert planned.rc == 0, planned.err
    document = planned.json()
    assert document["fits"]
    strategy = document["strategy"]
    actor = TrainedModelStrategy(
        **{k: v for k, v in strategy["actor"].items() if k in TrainedModelStrategy.__annotations__}
    )
    roles = document["workload"].get("roles") or {}
    for role in ("reference", "reward"):
        if roles.get(role) is None and role == "reference" and framework == "trl":
            continue  # TRL's GRPO holds no reference at its default beta 0
        expected = frozen_blocks_run(framework, role, actor, None)
        assert expected is not None and _frozen(strategy[role]) in expected, (role, strategy)
    rollout = strategy.get("rollout")
    if rollout is not None:
        assert rollout["engine"] in generations_run(framework)
        assert tensor_parallel_refusal(rollout["engine"], get_model("qwen2.5-7b"), rollout["tensor_parallel"]) is None
        assert rollout["tensor_parallel"] != 8  # 28 heads do not divide by 8
    exported = cli("export", "--format", framework, "-o", db.parent / OUTPUTS[framework], "--db", db)
    assert exported.rc == 0, exported.err
    assert FROZEN_GAPS[framework] not in exported.out
    assert not any(gap in exported.out for gap in ENGINE_GAPS), exported.out


def test_deepspeed_chat_ppo_generates_with_deepspeed(cli: Cli, db: Path) -> None:
    job = ("--model", "opt-1.3b", "--critic-model", "opt-350m", "--reward-model", "opt-350m", "--gpu-mem", "24G")
    planned = cli("recommend", *job, "--gpus", "8", "--workload", "ppo", "--framework", "deepspeed-chat", "--json")
    assert planned.rc == 0, planned.err
    document = planned.json()
    strategy = document["strategy"]
    assert strategy.get("rollout") is None  # no vLLM or SGLang in DeepSpeed-Chat
    for candidate in document.get("alternatives", []):
        assert candidate["strategy"].get("rollout") is None
    actor = TrainedModelStrategy(
        **{k: v for k, v in strategy["actor"].items() if k in TrainedModelStrategy.__annotations__}
    )
    critic = TrainedModelStrategy(
        **{k: v for k, v in strategy["critic"].items() if k in TrainedModelStrategy.__annotations__}
    )
    for role in ("reference", "reward"):
        assert _frozen(strategy[role]) in (frozen_blocks_run("deepspeed-chat", role, actor, critic) or ()), role


def test_export_of_a_plan_saved_at_a_refused_size_says_the_engine_would_not_start() -> None:
    from planner.job.inputs import JobSpec, resolve
    from planner.planning.exporting import _framework_engine
    from store.records import RLHFStrategy
    from store.rollout import RolloutStrategy

    job = resolve(
        JobSpec(model="qwen2.5-7b", workload="grpo", gpu="H100-80G", gpus=8, cpu_mem="1T", framework="openrlhf")
    )
    saved = RLHFStrategy(
        actor=TrainedModelStrategy(3),
        critic=None,
        reference=FrozenModelStrategy(3),
        reward=FrozenModelStrategy(3),
        hybrid_engine=False,
        rollout=RolloutStrategy(engine="sglang", placement="colocate", tensor_parallel=8, sleep_level=2),
        generation_batch=8,
        micro_batch=8,
        grad_accum=4,
    )
    _, lines = _framework_engine({}, job, saved, "openrlhf", None)
    assert len(lines) == 1 and "vLLM refuses tensor parallel 8 for qwen2.5-7b" in lines[0]
    accepted = saved.with_(rollout=RolloutStrategy(engine="vllm", placement="colocate", tensor_parallel=4))
    assert _framework_engine({}, job, accepted, "openrlhf", None) == (accepted, ())
