"""An RLHF step whose rollout runs on a vLLM or SGLang engine (search.rollout): its phases, bytes, seconds and
the utilization the planner solves for, each checked against the rule it follows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from search import DEFAULT_COEFFICIENTS, predict_rlhf, screen_rlhf
from search.rlhf.engine import engine_limits, resolve_engine
from search.rlhf.engine_step import engine_step, offloadable_states, trainer_hardware
from search.rlhf.job import rlhf_context
from search.rlhf.models import place_models
from search.rollout.timing import engine_weight_bytes, sleep_wake_seconds
from search.step.assemble import gpu_budget_bytes
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, RLHFStrategy, TrainedModelStrategy, Workload
from store.rollout import RolloutStrategy

C = DEFAULT_COEFFICIENTS
GiB = 2**30


def _job(gpus: int = 8, batch: int = 64) -> tuple[Workload, Hardware]:
    gpu = get_gpu("H100-80G")
    hardware = Hardware(gpu=gpu, gpu_memory_bytes=gpu.memory_bytes, gpus=gpus, cpu_memory_bytes=1024 * GiB)
    workload = Workload(
        kind="grpo",
        model=get_model("qwen2.5-1.5b"),
        seq_len=1024,
        global_batch=batch,
        prompt_len=512,
        gen_len=512,
        samples_per_prompt=4,
    )
    return workload, hardware


def _strategy(rollout: RolloutStrategy, zero_stage: int = 3, micro_batch: int = 8, sequences: int = 32) -> RLHFStrategy:
    return RLHFStrategy(
        actor=TrainedModelStrategy(zero_stage, gradient_checkpointing=True),
        critic=None,
        hybrid_engine=False,
        generation_batch=8,
        micro_batch=micro_batch,
        grad_accum=sequences // micro_batch,
        empty_cache="never",
        rollout=rollout,
    )


def _phases(prediction) -> dict:  # type: ignore[no-untyped-def]
    return {phase.name: phase for phase in prediction.phases}


def test_the_phases_follow_the_colocated_loop() -> None:
    workload, hardware = _job()
    prediction = predict_rlhf(workload, _strategy(RolloutStrategy()), hardware, C)
    assert [phase.name for phase in prediction.phases] == ["generation", "scoring", "actor_training", "weight_sync"]
    assert prediction.rollout["engine"] == "vllm"
    assert "weight_sync" in prediction.time_breakdown


def test_offload_states_frees_the_trainers_optimizer_states_for_the_rollout_only() -> None:
    """DeepSpeed's offload_states moves the fp32 master and Adam moments (and ZeRO-3's gradient partition) off
    the GPU while the engine generates; the 16-bit weights stay (OpenRLHF#808). With the utilization fixed, the
    generation phase holds exactly those bytes less, and the training phases the same bytes."""
    workload, hardware = _job()
    fixed = RolloutStrategy(gpu_memory_utilization=0.4, sleep_level=2)
    kept = predict_rlhf(workload, _strategy(fixed.with_(offload_training=False)), hardware, C)
    moved = predict_rlhf(workload, _strategy(fixed.with_(offload_training=True)), hardware, C)
    ctx = rlhf_context(workload, hardware, C)
    s = _strategy(fixed)
    models = place_models(ctx, s.actor, s.critic, s.reference, s.reward, s.ema)
    states = models.actor.states.optimizer_states + models.actor.persistent_gradients
    assert offloadable_states(models, fixed) == states > 0
    a, b = _phases(kept)["generation"], _phases(moved)["generation"]
    assert a.peak_allocated_bytes - b.peak_allocated_bytes == states
    # training holds the same bytes; what it reserves differs with where the reloaded states land (the replay)
    assert _phases(kept)["actor_training"].peak_allocated_bytes == _phases(moved)["actor_training"].peak_allocated_bytes
    # and it costs the states over PCIe both ways
    expected = 2 * states / (hardware.gpu.pcie_gbps * 1e9 * hardware.gpu.pcie_efficiency)
    assert moved.time_breakdown["offload_states"] == pytest.approx(expected, rel=1e-9)


def test_sleeping_hands_the_kv_cache_and_weights_back_to_training() -> None:
    """Level 0 keeps the engine's whole budget beside training; levels 1 and 2 keep only what sleep does not
    release (vLLM CuMemAllocator.sleep: weights and KV cache leave, graphs and context stay)."""
    workload, hardware = _job()
    fixed = RolloutStrategy(gpu_memory_utilization=0.3, offload_training=False)
    awake = predict_rlhf(workload, _strategy(fixed.with_(sleep_level=0)), hardware, C)
    asleep = predict_rlhf(workload, _strategy(fixed.with_(sleep_level=2)), hardware, C)
    engine = awake.rollout
    freed = engine["awake_bytes"] - asleep.rollout["asleep_bytes"]
    assert freed >= engine["kv_cache_bytes"] + engine["weights_bytes"]
    train_awake = _phases(awake)["actor_training"].peak_allocated_bytes
    train_asleep = _phases(asleep)["actor_training"].peak_allocated_bytes
    assert train_awake - train_asleep == freed
    # the generation phase is the same engine either way
    assert _phases(awake)["generation"].peak_allocated_bytes == _phases(asleep)["generation"].peak_allocated_bytes


def test_level_one_backs_the_weights_up_in_host_memory_per_node() -> None:
    workload, hardware = _job()
    fixed = RolloutStrategy(gpu_memory_utilization=0.3, offload_training=False)
    one = predict_rlhf(workload, _strategy(fixed.with_(sleep_level=1)), hardware, C)
    two = predict_rlhf(workload, _strategy(fixed.with_(sleep_level=2)), hardware, C)
    weights = one.rollout["weights_bytes"]
    assert one.host_phases["steady"] - two.host_phases["steady"] == hardware.gpus * weights
    # and the copies over PCIe each way, plus the release and remap of the KV cache
    copies = 2 * weights / (hardware.gpu.pcie_gbps * 1e9 * hardware.gpu.pcie_efficiency)
    assert one.time_breakdown["engine_sleep"] == pytest.approx(copies + C.engine_sleep_wake_s, rel=1e-9)
    assert two.time_breakdown["engine_sleep"] == pytest.approx(C.engine_sleep_wake_s, rel=1e-9)


def test_the_solved_utilization_is_the_middle_of_what_holds_the_rollout_and_fits() -> None:
    workload, hardware = _job()
    prediction = predict_rlhf(workload, _strategy(RolloutStrategy()), hardware, C)
    r = prediction.rollout
    low, high = r["fitting_utilization"]
    assert low <= r["gpu_memory_utilization"] <= high
    assert -1e-9 <= (high - r["gpu_memory_utilization"]) - (r["gpu_memory_utilization"] - low) <= 0.011
    assert r["kv_cache_tokens"] >= r["needed_kv_tokens"]
    # sequences a replica generates: 8 prompts x 4 samples per GPU, one GPU per replica at tp 1
    assert r["sequences_per_replica"] == 32
    assert prediction.fits
    # at the top of the range the engine fills the room the trainer leaves, as the search's screen counts it:
    # still within the budget there (the replay finds some of the trainer's segments held by live tensors
    # after the cache is emptied for the engine: the chosen middle keeps half the range for that)
    top = screen_rlhf(workload, _strategy(RolloutStrategy(gpu_memory_utilization=high)), hardware, C)
    assert top.peak_reserved_bytes <= top.gpu_budget_bytes


def test_a_given_utilization_is_kept_and_too_much_does_not_fit() -> None:
    workload, hardware = _job()
    kept = predict_rlhf(workload, _strategy(RolloutStrategy(gpu_memory_utilization=0.35)), hardware, C)
    assert kept.rollout["gpu_memory_utilization"] == 0.35
    greedy = predict_rlhf(workload, _strategy(RolloutStrategy(gpu_memory_utilization=0.99)), hardware, C)
    assert not greedy.fits
    assert any("refuse to start" in note for note in greedy.notes)


def test_tensor_parallel_shards_the_engine_and_serves_more_sequences_per_replica() -> None:
    workload, hardware = _job()
    one = predict_rlhf(workload, _strategy(RolloutStrategy(gpu_memory_utilization=0.3)), hardware, C).rollout
    two = predict_rlhf(
        workload, _strategy(RolloutStrategy(tensor_parallel=2, gpu_memory_utilization=0.3)), hardware, C
    ).rollout
    assert two["sequences_per_replica"] == 2 * one["sequences_per_replica"]
    assert two["weights_bytes"] < one["weights_bytes"]


def test_a_separate_engine_takes_gpus_from_the_trainer() -> None:
    """engine_gpus of each node run only the engine: the trainer's world shrinks, its GPUs hold no engine, and the
    engine's GPUs hold only the engine (what the plan's peak also covers)."""
    workload, hardware = _job()
    rollout = RolloutStrategy(placement="separate", engine_gpus=4, sleep_level=0, offload_training=False)
    step = engine_step(workload, _strategy(rollout, micro_batch=8, sequences=64), hardware, C)
    assert trainer_hardware(hardware, rollout).gpus == 4
    assert step.separate_gpu_bytes == step.rollout["awake_bytes"] > 0
    generation = next(phase for phase in step.phases if phase.name == "generation")
    assert generation.live == 0  # the trainer's GPUs wait, holding their resident bytes only
    # 64 prompts x 4 samples over 4 replicas
    assert step.rollout["sequences_per_replica"] == 64


def test_the_budget_the_engine_solves_against_is_what_the_trainer_leaves() -> None:
    workload, hardware = _job()
    ctx = rlhf_context(workload, hardware, C)
    budget = gpu_budget_bytes(hardware, C)
    roomy = resolve_engine(ctx, RolloutStrategy(), budget, 10 * GiB, 40 * GiB)
    tight = resolve_engine(ctx, RolloutStrategy(), budget, 30 * GiB, 40 * GiB)
    assert tight.fitting is not None and roomy.fitting is not None
    assert tight.fitting[0] == roomy.fitting[0]  # what holds the KV cache does not depend on the trainer
    assert tight.fitting[1] < roomy.fitting[1]
    # an engine that never sleeps must fit beside the trainer's peak instead
    never = resolve_engine(ctx, RolloutStrategy(sleep_level=0), budget, 10 * GiB, 40 * GiB)
    assert never.fitting is not None and never.fitting[1] < roomy.fitting[1]
    limits = engine_limits("vllm", hardware.gpu_memory_bytes, hardware.gpu.name)
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (1024, 16384)  # vllm.LLM on an H100


def test_sleep_and_weight_copies_cost_what_pcie_moves() -> None:
    workload, hardware = _job()
    weights = int(engine_weight_bytes(workload.model, workload.dtype, 1))
    assert sleep_wake_seconds(weights, 0, hardware, C) == 0.0
    assert sleep_wake_seconds(weights, 1, hardware, C) > sleep_wake_seconds(weights, 2, hardware, C)
    faster = replace(hardware.gpu, pcie_gbps=2 * hardware.gpu.pcie_gbps)
    quicker = replace(hardware, gpu=faster)
    copies = sleep_wake_seconds(weights, 1, hardware, C) - C.engine_sleep_wake_s
    assert sleep_wake_seconds(weights, 1, quicker, C) - C.engine_sleep_wake_s == pytest.approx(copies / 2)
