"""The rollout block of an RLHF strategy: its JSON shape, shorthand and refusals (store.rollout)."""

from __future__ import annotations

import pytest

from store.errors import InputError
from store.records import RLHFStrategy
from store.rollout import RolloutStrategy

BLOCKS = {"actor": {}, "reference": {}, "reward": {}}


def test_engine_name_is_shorthand_for_the_default_block_and_turns_the_hybrid_engine_off() -> None:
    strategy = RLHFStrategy.from_dict({**BLOCKS, "rollout": "vllm"})
    assert strategy.rollout == RolloutStrategy(engine="vllm")
    assert strategy.hybrid_engine is False
    assert RLHFStrategy.from_dict(strategy.to_dict()) == strategy


@pytest.mark.parametrize("value", [None, "hybrid-engine", {"engine": "hybrid-engine"}])
def test_deepspeed_generation_has_no_block_and_older_documents_keep_their_shape(value: object) -> None:
    strategy = RLHFStrategy.from_dict({**BLOCKS, "rollout": value})
    assert strategy.rollout is None
    assert "rollout" not in strategy.to_dict()


def test_a_full_block_round_trips() -> None:
    block = {
        "engine": "sglang",
        "placement": "separate",
        "engine_gpus": 2,
        "tensor_parallel": 2,
        "gpu_memory_utilization": 0.85,
        "sleep_level": 0,
        "offload_training": False,
        "enforce_eager": True,
    }
    strategy = RLHFStrategy.from_dict({**BLOCKS, "rollout": block})
    assert strategy.to_dict()["rollout"] == block
    assert "SGLang separate 2 GPU/node tp2 u0.85 sleep0 eager" in strategy.describe()


@pytest.mark.parametrize(
    ("block", "phrase"),
    [
        ({"engine": "tgi"}, "engine must be one of"),
        ({"placement": "remote"}, "placement must be one of"),
        ({"tensor_parallel": 0}, "tensor_parallel must be a whole number from 1"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be a number in (0, 1]"),
        ({"gpu_memory_utilization": True}, "gpu_memory_utilization must be a number"),
        ({"sleep_level": 3}, "sleep_level must be 0, 1 or 2"),
        ({"engine_gpus": 2}, "engine_gpus is for the separate placement"),
        ({"placement": "separate"}, "needs engine_gpus >= 1"),
        ({"placement": "separate", "engine_gpus": 3, "tensor_parallel": 2}, "must divide engine_gpus"),
        (
            {"placement": "separate", "engine_gpus": 2, "sleep_level": 1, "offload_training": False},
            "sleep_level must be 0",
        ),
        ({"placement": "separate", "engine_gpus": 2, "sleep_level": 0}, "offload_training makes room"),
        ({"speed": "fast"}, "unknown key(s) speed"),
    ],
)
def test_impossible_blocks_are_one_clear_input_error(block: dict, phrase: str) -> None:
    with pytest.raises(InputError) as caught:
        RLHFStrategy.from_dict({**BLOCKS, "rollout": block})
    assert phrase in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_engine_and_the_hybrid_engine_together_are_refused() -> None:
    with pytest.raises(InputError, match="hybrid_engine must be false with a vllm rollout engine"):
        RLHFStrategy.from_dict({**BLOCKS, "hybrid_engine": True, "rollout": "vllm"})
