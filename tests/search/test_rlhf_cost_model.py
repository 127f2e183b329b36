"""Behaviour of the RLHF cost model: what the papers measured (Hydra-RLHF, ReMax, arXiv 2410.15651,
DeepSpeed-Chat's hybrid engine), the KV cache formula, and the accounting every prediction must keep."""

from __future__ import annotations

import pytest

from search import DEFAULT_COEFFICIENTS, RLHF_PHASES, predict, predict_rlhf
from search.rlhf.memory import kv_cache_bytes
from store.errors import InputError
from store.gpus import generic_gpu, get_gpu
from store.models import get_model
from store.records import (
    FrozenModelStrategy,
    Hardware,
    RLHFStrategy,
    Strategy,
    TrainedModelStrategy,
    Workload,
)

GiB = 2**30
DESIGN_KEYS = {
    "parameters",
    "gradients",
    "optimizer_states",
    "activations",
    "logits",
    "kv_cache",
    "buffers",
    "fragmentation",
}
Z0 = TrainedModelStrategy(zero_stage=0)


def _hw(gpu: str = "A100-80G", gpus: int = 1, mem_gib: int | None = None, host_gib: int = 512) -> Hardware:
    spec = generic_gpu(mem_gib * GiB) if mem_gib else get_gpu(gpu)
    return Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=gpus, cpu_memory_bytes=host_gib * GiB)


def _rlhf(
    kind: str = "ppo",
    model: str = "opt-1.3b",
    batch: int = 8,
    prompt: int = 256,
    gen: int = 256,
    critic: str | None = None,
    reward: str | None = None,
    **kw,
) -> Workload:
    return Workload(
        kind=kind,
        model=get_model(model),
        seq_len=prompt + gen,
        global_batch=batch,
        prompt_len=prompt,
        gen_len=gen,
        critic_model=get_model(critic) if critic else None,
        reward_model=get_model(reward) if reward else None,
        **kw,
    )


def _strategy(layout: TrainedModelStrategy = Z0, critic: bool = True, **kw) -> RLHFStrategy:
    defaults = {"hybrid_engine": False, "generation_batch": 8, "micro_batch": 8, "grad_accum": 1}
    defaults["empty_cache"] = "never"
    defaults.update(kw)
    return RLHFStrategy(actor=layout, critic=layout if critic else None, **defaults)


def _deepspeed_chat_pair() -> Workload:
    """DeepSpeed-Chat's example pairing: an OPT-1.3b actor with an OPT-350m critic and reward model."""
    return _rlhf("ppo", "opt-1.3b", critic="opt-350m", reward="opt-350m")


# --- the shape of every prediction -------------------------------------------------------------------------

STRATEGIES = [
    ("ppo", _strategy()),
    (
        "ppo",
        _strategy(
            TrainedModelStrategy(2, gradient_checkpointing=True), hybrid_engine=True, micro_batch=4, grad_accum=2
        ),
    ),
    (
        "ppo",
        _strategy(
            TrainedModelStrategy(3, "cpu", "cpu", True),
            reference=FrozenModelStrategy(3, "cpu"),
            reward=FrozenModelStrategy(3),
            generation_batch=4,
            micro_batch=2,
            grad_accum=4,
            empty_cache="after-generation",
            allocator="expandable-segments",
        ),
    ),
    ("remax", _strategy(TrainedModelStrategy(1, "cpu"), critic=False, empty_cache="every-step", hybrid_engine=True)),
    ("grpo", _strategy(TrainedModelStrategy(3), critic=False, micro_batch=4, grad_accum=8, empty_cache="after-phase")),
]


@pytest.mark.parametrize(("kind", "strategy"), STRATEGIES, ids=lambda v: v if isinstance(v, str) else v.describe())
def test_breakdown_sums_to_the_peak_phase_and_reserved_covers_allocated(kind: str, strategy: RLHFStrategy) -> None:
    extra = {"samples_per_prompt": 4} if kind == "grpo" else {}
    p = predict(_rlhf(kind, critic="opt-350m" if kind == "ppo" else None, **extra), strategy, _hw(gpus=1))
    names = [phase.name for phase in p.phases]
    assert names == (list(RLHF_PHASES) if kind == "ppo" else list(RLHF_PHASES[:3]))
    assert DESIGN_KEYS | {"hybrid_engine", "zero3_gathered", "ema"} <= set(p.breakdown)
    assert all(value >= 0 for value in p.breakdown.values())
    assert sum(p.breakdown.values()) == p.peak_reserved_bytes
    by_name = {phase.name: phase for phase in p.phases}
    assert by_name[p.peak_phase].peak_reserved_bytes == p.peak_reserved_bytes
    assert all(phase.peak_reserved_bytes >= phase.peak_allocated_bytes for phase in p.phases)
    assert p.peak_allocated_bytes == max(phase.peak_allocated_bytes for phase in p.phases)
    assert sum(p.time_breakdown.values()) == pytest.approx(p.step_time_s, rel=1e-12)
    # the phases' own seconds plus the calls to empty_cache and the per-call overhead make the step
    phase_seconds = sum(phase.time_s for phase in p.phases)
    rest = p.time_breakdown["empty_cache"] + p.time_breakdown["overhead"]
    assert phase_seconds + rest == pytest.approx(p.step_time_s, rel=1e-12)


# --- what the papers measured ------------------------------------------------------------------------------


def test_ppo_needs_far_more_memory_than_sft_of_the_same_actor() -> None:
    """Hydra-RLHF: PPO takes more than 3x the memory of SFT. Its baselines are LoRA-tuned, where the 16-bit
    weights of four models (actor, critic, reference, reward) against one dominate: > 2.5x. With full
    fine-tuning and no ZeRO the optimizer states of two trained models against one bound the ratio near
    2x: (16 + 16 + 2 + 2 bytes/param + the critic step's 6) / (16 + SFT's step 6) = 42/22."""
    hw, seq, batch = _hw(), 512, 4
    model = get_model("opt-1.3b")
    sft_workload = Workload(kind="sft", model=model, seq_len=seq, global_batch=batch)
    ppo_workload = _rlhf("ppo", "opt-1.3b", batch=batch)
    for lora, least in ((16, 2.5), (0, 1.8)):
        layout = TrainedModelStrategy(0, gradient_checkpointing=True, lora_rank=lora)
        sft = predict(
            sft_workload, Strategy(lora_rank=lora, gradient_checkpointing=True, micro_batch=1, grad_accum=batch), hw
        )
        ppo = predict(ppo_workload, _strategy(layout, generation_batch=1, micro_batch=1, grad_accum=batch), hw)
        assert ppo.peak_allocated_bytes > least * sft.peak_allocated_bytes, lora


def test_remax_drops_the_critic_and_about_half_the_memory() -> None:
    """ReMax (arXiv 2310.10505) saves about half of PPO's GPU memory by dropping the critic."""
    hw = _hw()
    strategy = _strategy(generation_batch=2, micro_batch=2, grad_accum=4)
    ppo = predict(_rlhf("ppo"), strategy, hw)
    remax = predict(_rlhf("remax"), strategy.with_(critic=None), hw)
    assert remax.peak_allocated_bytes < 0.8 * ppo.peak_allocated_bytes
    assert remax.peak_reserved_bytes < 0.8 * ppo.peak_reserved_bytes


def test_remax_generates_twice_per_prompt() -> None:
    """ReMax's baseline is a greedy generation of every prompt: generation work doubles, its memory does not."""
    hw = _hw()
    ppo = {ph.name: ph for ph in predict(_rlhf("ppo"), _strategy(), hw).phases}
    remax = {ph.name: ph for ph in predict(_rlhf("remax"), _strategy(critic=False), hw).phases}
    assert remax["generation"].time_s == pytest.approx(2 * ppo["generation"].time_s, rel=1e-12)
    assert remax["generation"].count == 2 * ppo["generation"].count


def test_lora_brings_ppo_far_below_full_fine_tuning() -> None:
    """LoRA on actor and critic leaves no fp32 master weights or Adam moments of the base models (Hydra-RLHF:
    LoRA brings PPO under full-fine-tuning SFT)."""
    hw = _hw()
    full = predict(_rlhf(), _strategy(), hw)
    lora = predict(_rlhf(), _strategy(TrainedModelStrategy(0, lora_rank=16)), hw)
    sft = predict(
        Workload(kind="sft", model=get_model("opt-1.3b"), seq_len=512, global_batch=8), Strategy(micro_batch=8), hw
    )
    assert lora.peak_allocated_bytes < 0.5 * full.peak_allocated_bytes
    assert lora.peak_allocated_bytes < sft.peak_allocated_bytes


def test_kv_cache_is_the_formula_for_a_grouped_query_model() -> None:
    """2 x layers x (prompts per call x samples) x (prompt + generation) x kv_heads x head_dim x 2 bytes.

    Long GRPO generations with the hybrid engine make generation the peak phase, so the breakdown shows it.
    """
    model = get_model("llama-3.2-1b")
    assert (model.num_layers, model.num_heads, model.num_kv_heads, model.head_dim) == (16, 32, 8, 64)
    workload = _rlhf("grpo", "llama-3.2-1b", batch=4, prompt=1024, gen=7168, samples_per_prompt=4)
    strategy = _strategy(
        TrainedModelStrategy(2, gradient_checkpointing=True),
        critic=False,
        hybrid_engine=True,
        generation_batch=2,
        micro_batch=1,
        grad_accum=16,
    )
    p = predict(workload, strategy, _hw())
    assert p.peak_phase == "generation"
    expected = 2 * 16 * (2 * 4) * (1024 + 7168) * 8 * 64 * 2
    assert p.breakdown["kv_cache"] == expected
    assert kv_cache_bytes(model, 8, 8192, "bf16") == expected


def test_empty_cache_after_inference_trades_a_little_time_for_memory() -> None:
    """arXiv 2410.15651: fragments of the inference phases accumulate into training; empty_cache after each
    inference phase lowered memory (about 25%) for about 2% more time. DeepSpeed-Chat's pairing on 24 GB."""
    workload, hw = _deepspeed_chat_pair(), _hw(mem_gib=24)
    base = _strategy(TrainedModelStrategy(1, "cpu"), hybrid_engine=True)
    never = predict(workload, base, hw)
    after = predict(workload, base.with_(empty_cache="after-inference"), hw)
    assert after.peak_reserved_bytes < never.peak_reserved_bytes
    assert after.peak_allocated_bytes == never.peak_allocated_bytes  # only fragments move
    assert 0 < after.step_time_s - never.step_time_s < 0.10 * never.step_time_s
    # releasing at more places keeps fewer fragments
    reserved = {
        policy: predict(workload, base.with_(empty_cache=policy), hw).peak_reserved_bytes
        for policy in ("never", "after-generation", "after-inference", "after-phase", "every-step")
    }
    assert reserved["after-phase"] <= min(reserved["after-inference"], reserved["after-generation"])
    assert max(reserved["after-inference"], reserved["after-generation"]) < reserved["never"]
    # replayed, the largest fragments are the generation's (the KV cache grows over what training left cached):
    # releasing after generation frees them; releasing after the scoring forwards as well changes under 1%
    assert abs(reserved["after-inference"] - reserved["after-generation"]) < 0.01 * reserved["never"]
    assert reserved["every-step"] <= reserved["never"]
    expandable = predict(workload, base.with_(allocator="expandable-segments"), hw)
    assert expandable.peak_reserved_bytes < never.peak_reserved_bytes
    assert expandable.step_time_s == never.step_time_s


def test_zero3_generation_needs_the_hybrid_engine() -> None:
    """Without the hybrid engine ZeRO-3 gathers the actor for every generated token over the GPUs' links; the
    hybrid engine gathers it once per call, at the price of holding the whole 16-bit actor while generating."""
    workload = _rlhf(batch=16)
    hw = _hw("A100-80G", gpus=4)
    z3 = _strategy(TrainedModelStrategy(3), generation_batch=4, micro_batch=4)
    with_he = {ph.name: ph for ph in predict(workload, z3.with_(hybrid_engine=True), hw).phases}
    without = {ph.name: ph for ph in predict(workload, z3, hw).phases}
    # every generated token waits for a gather of the 16-bit actor over the links: at least gen_len x the
    # ring bytes at the links' bandwidth more than gathering once per call
    ring = (hw.world_size - 1) / hw.world_size * 2 * workload.model.total_params
    per_token = ring / (hw.gpu.interconnect_gbps * 1e9)
    assert without["generation"].time_s - with_he["generation"].time_s > (workload.gen_len - 1) * per_token
    pcie = _hw("A10", gpus=4)
    gathered_once = predict_rlhf(workload, z3.with_(hybrid_engine=True), pcie, DEFAULT_COEFFICIENTS).phases[0]
    gathered_per_token = predict_rlhf(workload, z3, pcie, DEFAULT_COEFFICIENTS).phases[0]
    assert gathered_per_token.time_s > 3 * gathered_once.time_s
    actor_16bit = 2 * workload.model.total_params
    gap = with_he["generation"].peak_allocated_bytes - without["generation"].peak_allocated_bytes
    assert gap > 0.9 * actor_16bit
    # the other phases do not see it: released after generation (release_inference_cache)
    assert with_he["actor_training"].peak_allocated_bytes == without["actor_training"].peak_allocated_bytes


def test_frozen_models_are_partitioned_or_offloaded() -> None:
    hw = _hw("A100-80G", gpus=4)
    workload = _rlhf(batch=16)
    params = workload.model.total_params
    whole = predict(workload, _strategy(generation_batch=4, micro_batch=4), hw)
    parted = _strategy(generation_batch=4, micro_batch=4, reference=FrozenModelStrategy(3))
    partitioned = predict(workload, parted, hw)
    offloaded = predict(workload, parted.with_(reference=FrozenModelStrategy(3, "cpu")), hw)
    assert whole.breakdown["reference_model"] == 2 * params
    assert partitioned.breakdown["reference_model"] == 2 * params // 4
    assert offloaded.breakdown["reference_model"] == 0
    assert offloaded.host_bytes >= partitioned.host_bytes
    assert offloaded.step_time_s > partitioned.step_time_s > whole.step_time_s


def test_ema_keeps_a_16bit_copy_of_the_actor_placed_like_it() -> None:
    hw = _hw("A100-80G", gpus=2)
    workload = _rlhf(batch=16)
    params = workload.model.total_params
    for layout, share in ((TrainedModelStrategy(2), 1), (TrainedModelStrategy(3), 2)):
        base = _strategy(layout, micro_batch=8)
        off = predict(workload, base, hw)
        on = predict(workload, base.with_(ema=True), hw)
        assert off.breakdown["ema"] == 0
        assert on.breakdown["ema"] == 2 * params // share
        assert on.step_time_s > off.step_time_s


def test_grpo_samples_multiply_sequences() -> None:
    """k samples per prompt: k times the sequences to train on, and k times the KV cache per generate call
    (decoding stays bound by weights and launches, so the generate call itself barely slows down)."""
    hw, workload = _hw(), _rlhf("grpo", batch=4, samples_per_prompt=4)
    one = predict(_rlhf("grpo", batch=4), _strategy(critic=False, generation_batch=4, micro_batch=4), hw)
    four = predict(workload, _strategy(critic=False, generation_batch=4, micro_batch=4, grad_accum=4), hw)
    assert four.time_breakdown["training"] > 3 * one.time_breakdown["training"]
    gen_one, gen_four = one.phases[0], four.phases[0]
    assert gen_four.peak_allocated_bytes - gen_one.peak_allocated_bytes >= 3 * kv_cache_bytes(
        workload.model, 4, 512, "bf16"
    )
    assert gen_four.time_s < 2 * gen_one.time_s
    with pytest.raises(InputError, match="sequences per GPU"):
        predict(workload, _strategy(critic=False, generation_batch=4, micro_batch=4), hw)


def test_offloaded_states_need_host_memory() -> None:
    hw = _hw()
    workload = _rlhf()
    resident = predict(workload, _strategy(TrainedModelStrategy(2)), hw)
    offloaded = predict(workload, _strategy(TrainedModelStrategy(2, "cpu")), hw)
    trainable = workload.model.total_params + workload.model.total_params  # actor and same-shape critic
    assert offloaded.host_bytes >= DEFAULT_COEFFICIENTS.host_buffer_factor * 16 * trainable * 0.99
    assert resident.host_bytes < offloaded.host_bytes
    assert offloaded.breakdown["optimizer_states"] == 0


# --- input errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "strategy", "message"),
    [
        ("remax", _strategy(), "trains no critic"),
        ("grpo", _strategy(), "trains no critic"),
        ("ppo", _strategy(critic=False), "needs a critic"),
        ("ppo", _strategy(generation_batch=3), "generation_batch 3 does not divide"),
        ("ppo", _strategy(micro_batch=4, grad_accum=1), "must equal the 8 sequences"),
        ("ppo", Strategy(micro_batch=8), "RLHF strategy"),
    ],
)
def test_inconsistent_strategies_are_input_errors(kind: str, strategy: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        predict(_rlhf(kind), strategy, _hw())  # type: ignore[arg-type]


def test_batches_must_split_and_kinds_must_match() -> None:
    with pytest.raises(InputError, match="does not split over 3 GPUs"):
        predict(_rlhf(batch=8), _strategy(), _hw(gpus=3))
    sft = Workload(kind="sft", model=get_model("opt-125m"), seq_len=512, global_batch=8)
    with pytest.raises(InputError, match="single-model strategy"):
        predict(sft, _strategy(), _hw())
    with pytest.raises(InputError, match="not an RLHF workload"):
        predict_rlhf(sft, _strategy(), _hw(), DEFAULT_COEFFICIENTS)
