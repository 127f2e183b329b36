"""Issue 42 part 2: where each framework puts the frozen models, which trained layouts its flags say, and what
generates its rollout (``store.framework_placement``), each rule as its pinned source states it."""

from __future__ import annotations

import pytest

from store.framework_placement import (
    GENERATION_FAMILIES,
    frozen_blocks_run,
    generation_family,
    generations_run,
    trained_refusal,
)
from store.records import FrozenModelStrategy, TrainedModelStrategy

WHOLE, SHARDED, OFFLOADED = (
    FrozenModelStrategy(0, "none"),
    FrozenModelStrategy(3, "none"),
    FrozenModelStrategy(3, "cpu"),
)
Z1 = TrainedModelStrategy(1)
Z2 = TrainedModelStrategy(2)
Z2_ADAM_CPU = TrainedModelStrategy(2, "cpu")
Z3 = TrainedModelStrategy(3)
Z3_PARAMS_CPU = TrainedModelStrategy(3, "cpu", "cpu")
Z3_ADAM_CPU = TrainedModelStrategy(3, "cpu")


@pytest.mark.parametrize("role", ["reference", "reward"])
@pytest.mark.parametrize("actor", [TrainedModelStrategy(0), Z1, Z2])
def test_openrlhf_holds_frozen_models_whole_unless_the_actor_is_zero3(role: str, actor: TrainedModelStrategy) -> None:
    # get_ds_eval_config: stage = self.stage if self.stage == 3 else 0; offload_param is a ZeRO-3 mechanism
    assert frozen_blocks_run("openrlhf", role, actor, None) == (WHOLE,)


@pytest.mark.parametrize("role", ["reference", "reward"])
def test_openrlhf_shards_frozen_models_under_zero3_with_its_own_offload_flag(role: str) -> None:
    # --ref.offload / --reward.offload are flags of their own, whatever the actor offloads
    assert set(frozen_blocks_run("openrlhf", role, Z3, None) or ()) == {SHARDED, OFFLOADED}
    assert set(frozen_blocks_run("openrlhf", role, Z3_PARAMS_CPU, None) or ()) == {SHARDED, OFFLOADED}


@pytest.mark.parametrize("role", ["reference", "reward"])
def test_trl_prepares_frozen_models_with_the_trainers_config(role: str) -> None:
    # prepare_deepspeed: the trainer's config, stage 0 unless 3; under ZeRO-3 its offload_param carries over
    assert frozen_blocks_run("trl", role, Z2, None) == (WHOLE,)
    assert frozen_blocks_run("trl", role, Z1, None) == (WHOLE,)
    assert frozen_blocks_run("trl", role, Z3, None) == (SHARDED,)
    assert frozen_blocks_run("trl", role, Z3_ADAM_CPU, None) == (SHARDED,)  # Adam offload is no parameter offload
    assert frozen_blocks_run("trl", role, Z3_PARAMS_CPU, None) == (OFFLOADED,)


def test_deepspeed_chat_follows_the_actor_for_the_reference_and_the_critic_for_the_reward() -> None:
    # _init_ref: actor_zero_stage (0 unless 3), --offload_reference_model its own flag
    assert frozen_blocks_run("deepspeed-chat", "reference", Z2, Z3) == (WHOLE,)
    assert set(frozen_blocks_run("deepspeed-chat", "reference", Z3, Z2) or ()) == {SHARDED, OFFLOADED}
    # _init_reward: critic_zero_stage (0 unless 3), offloaded exactly with --offload (the optimizers' flag)
    assert frozen_blocks_run("deepspeed-chat", "reward", Z3, Z2) == (WHOLE,)
    assert frozen_blocks_run("deepspeed-chat", "reward", Z2, Z3) == (SHARDED,)
    assert frozen_blocks_run("deepspeed-chat", "reward", Z2_ADAM_CPU, Z3_PARAMS_CPU) == (OFFLOADED,)


def test_verl_serves_the_reward_model_whole_and_leaves_the_reference_to_the_plan() -> None:
    assert frozen_blocks_run("verl", "reward", Z3, None) == (WHOLE,)
    assert frozen_blocks_run("verl", "reference", Z3, None) is None


def test_memplans_own_loop_holds_any_block() -> None:
    assert frozen_blocks_run("deepspeed", "reference", Z2, None) is None
    assert frozen_blocks_run("deepspeed", "reward", Z2, None) is None


@pytest.mark.parametrize(
    ("framework", "runs"),
    [
        ("deepspeed-chat", {"hybrid-engine", "hf-generate"}),  # no vLLM or SGLang in DeepSpeed-Chat
        ("openrlhf", {"vllm"}),
        ("trl", {"hf-generate", "vllm"}),
        ("verl", {"vllm", "sglang"}),
        ("deepspeed", set(GENERATION_FAMILIES)),
    ],
)
def test_each_framework_generates_with_its_own_engines(framework: str, runs: set[str]) -> None:
    assert set(generations_run(framework)) == runs


def test_generation_family_names_the_option() -> None:
    assert generation_family(True, None) == "hybrid-engine"
    assert generation_family(False, None) == "hf-generate"
    assert generation_family(False, "sglang") == "sglang"


def test_openrlhf_refuses_what_its_flags_cannot_say() -> None:
    assert trained_refusal("openrlhf", Z2, Z2) is None
    assert trained_refusal("openrlhf", Z2_ADAM_CPU, Z2_ADAM_CPU) is None
    assert "one setting" in (trained_refusal("openrlhf", Z2, Z3) or "")  # one --ds.zero_stage
    assert "one setting" in (trained_refusal("openrlhf", Z2_ADAM_CPU, Z2) or "")  # one --ds.adam_offload
    assert "Adam states" in (trained_refusal("openrlhf", Z3_PARAMS_CPU, None) or "")  # no parameter offload
    assert trained_refusal("deepspeed", Z3_PARAMS_CPU, Z2) is None


def test_deepspeed_chat_offload_is_one_flag_for_both_optimizers() -> None:
    assert trained_refusal("deepspeed-chat", Z2_ADAM_CPU, Z2_ADAM_CPU) is None
    assert trained_refusal("deepspeed-chat", Z2_ADAM_CPU, Z2) is not None
    assert trained_refusal("deepspeed-chat", Z3_ADAM_CPU, Z3_ADAM_CPU) is not None  # --offload moves the params too
    assert trained_refusal("deepspeed-chat", Z3_PARAMS_CPU, Z3_PARAMS_CPU) is None
