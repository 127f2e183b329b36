"""Issue 31, TRL's GRPO scoring (TRL 1.16, trl/trainer/grpo_trainer.py): each mechanism as a pure function of the
plan, the TRL plan against memplan's own loop on the same strategy.

- ``_get_per_token_logps_and_entropies(..., batch_size=per_device_train_batch_size)``: micro-batch forwards
  through the fused head, never the ``(batch, seq, vocab)`` logits;
- ``_generate_and_score_completions``: the old policy's forward only when ``gradient_accumulation_steps %
  (steps_per_generation * num_iterations) != 0`` or vLLM with importance sampling (GRPOConfig's defaults);
- ``__init__``: ``self.ref_model = None`` for a PEFT model; the reference pass runs the actor, adapters off.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from launch.frameworks import trl as trl_export
from search import DEFAULT_COEFFICIENTS
from search.model.fused_head import trl_fused_head
from search.rlhf.job import rlhf_context
from search.rlhf.memory import forward_live
from search.rlhf.models import place_models
from search.rlhf.scoring_phase import scoring_half
from search.rlhf.step import step_halves, step_of
from search.rlhf.timing import trained_forward_time
from search.streams.phases import LIVE_PARTS
from store.frameworks import scores_old_policy, trl_old_logps_forward
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, RLHFStrategy, TrainedModelStrategy, Workload

GIB = 2**30
C = DEFAULT_COEFFICIENTS
QWEN = get_model("qwen2.5-1.5b")
A100 = Hardware(get_gpu("A100-80G"), 80 * GIB, gpus=1, nodes=1, cpu_memory_bytes=128 * GIB)
# 4 prompts x 4 samples = 16 sequences per step; 2 prompts per generate call; 4 sequences per micro-batch
RLHF: dict[str, Any] = dict(seq_len=512, global_batch=4, prompt_len=256, gen_len=256, samples_per_prompt=4)
LOGITS, ACTIVATIONS = LIVE_PARTS.index("logits"), LIVE_PARTS.index("activations")


def _workload(framework: str, **changes: Any) -> Workload:
    base = Workload("grpo", QWEN, framework=framework, rule_reward=True, kl_coef=0.0, **RLHF)
    return replace(base, **changes)


def _strategy(lora_rank: int = 0) -> RLHFStrategy:
    actor = TrainedModelStrategy(zero_stage=2, lora_rank=lora_rank)
    return RLHFStrategy(actor=actor, critic=None, micro_batch=4, grad_accum=4, generation_batch=2)


def _scoring(framework: str, **changes: Any) -> Any:
    ctx = rlhf_context(_workload(framework, **changes), A100, C)
    _, inference, _ = step_halves(ctx, _strategy())
    return ctx, {p.name: p for p in inference.phases}["scoring"], inference


def test_trl_scores_in_micro_batches_through_the_fused_head() -> None:
    """Two iterations make both programs run the old policy's forward: memplan's over a generate call's 8
    sequences with their logits, TRL's over 4 sequences (``batch_size``) with the fused head's tile in their
    place, the same forward otherwise; 4 forwards per step instead of 2."""
    ctx, ours, _ = _scoring("deepspeed", ppo_epochs=2)
    trl_ctx, trl, _ = _scoring("trl", ppo_epochs=2)
    (own,), (theirs,) = ours.moments, trl.moments
    head = trl_fused_head(QWEN, 4 * 256, "bf16", head_trainable=False, outputs=("log_probs", "entropy"))
    assert theirs.parts[LOGITS] == head.forward  # the completion's hidden copy, one tile, fp32 vectors
    assert own.parts[LOGITS] == forward_live(QWEN, True, 0, 8, 512, "bf16", "sdpa", C).parts[LOGITS]
    assert own.parts[LOGITS] > 20 * theirs.parts[LOGITS]  # the (8, 512, 151936) logits and their fp32 copy
    assert theirs.parts[ACTIVATIONS] == forward_live(QWEN, True, 0, 4, 512, "bf16", "sdpa", C).parts[ACTIVATIONS]
    actor = place_models(trl_ctx, _strategy().actor, None, _strategy().reference, _strategy().reward, False).actor
    assert trl.time_s == 4 * trained_forward_time(actor, 4, 512, "bf16", A100, C)
    assert ours.time_s == 2 * trained_forward_time(actor, 8, 512, "bf16", A100, C)


def _grpo_config(tmp_path: Path, **kwargs: Any) -> Any:
    from trl import GRPOConfig

    # bf16 off: GRPOConfig defaults to bf16, which TrainingArguments refuses on a CPU; it plays no part here
    return GRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, **kwargs)


@pytest.mark.parametrize(("epochs", "vllm"), [(1, False), (2, False), (1, True)])
def test_old_policy_forward_follows_trls_condition_on_the_exported_config(
    tmp_path: Path, epochs: int, vllm: bool
) -> None:
    """The export sets num_iterations, use_vllm and the batch sizes and leaves steps_per_generation and the
    importance sampling correction to GRPOConfig; the plan runs the old policy's forward exactly when TRL's own
    condition on that config does."""
    workload = _workload("trl", ppo_epochs=epochs)
    kwargs = trl_export.config_kwargs(_strategy(), workload, A100, None)
    assert not {"steps_per_generation", "generation_batch_size", "vllm_importance_sampling_correction"} & set(kwargs)
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_iterations", "num_generations")
    config = _grpo_config(tmp_path, use_vllm=vllm, **{key: kwargs[key] for key in keys})
    assert config.steps_per_generation == config.gradient_accumulation_steps  # __post_init__'s default
    expected = trl_old_logps_forward(
        config.gradient_accumulation_steps,
        config.steps_per_generation,
        config.num_iterations,
        config.use_vllm,
        config.vllm_importance_sampling_correction,
    )
    assert expected == (epochs > 1 or vllm)
    assert scores_old_policy("trl", "grpo", epochs, config.gradient_accumulation_steps, vllm) is expected
    ctx = rlhf_context(workload, A100, C)
    s = _strategy()
    models = place_models(ctx, s.actor, None, s.reference, s.reward, False)
    if vllm:  # the scoring half of an engine step (search.rlhf.engine_step.engine_step_of)
        half = scoring_half(ctx, models, s.generation_batch, 2, s.micro_batch, s.grad_accum, rollout_engine=True)
    else:  # the step with transformers' generate
        half = step_halves(ctx, s)[1]
    scoring = {p.name: p for p in half.phases}["scoring"]
    ours = rlhf_context(_workload("deepspeed", ppo_epochs=epochs), A100, C)
    own = scoring_half(ours, place_models(ours, s.actor, None, s.reference, s.reward, False), 2, 2, 4, 4, vllm)
    assert own.role_time["actor"] > 0  # memplan's own loop always scores the old policy
    assert (half.role_time["actor"] > (0 if vllm else half.time["generation"])) is expected
    assert (scoring.time_s > 0) is expected and (scoring.live > 0) is expected  # no reference, rule-based rewards


def test_trl_lora_reference_is_the_actor_with_adapters_off() -> None:
    """LoRA with a KL coefficient: TRL holds no reference copy, and its pass runs through the actor's placement
    (same bytes as the actor's scoring forward, its seconds the actor's); memplan's loop holds the copy. A full
    fine-tune under TRL still loads one (``create_model_from_path``)."""
    s = _strategy(lora_rank=16)
    trl_ctx = rlhf_context(_workload("trl", kl_coef=0.04), A100, C)
    ours_ctx = rlhf_context(_workload("deepspeed", kl_coef=0.04), A100, C)
    trl_models = place_models(trl_ctx, s.actor, None, s.reference, s.reward, False)
    ours_models = place_models(ours_ctx, s.actor, None, s.reference, s.reward, False)
    assert trl_models.reference is None and "reference_model" not in trl_models.resident
    assert ours_models.reference is not None and ours_models.resident["reference_model"] > 2 * GIB
    assert (
        sum(ours_models.resident.values()) - sum(trl_models.resident.values())
        == ours_models.resident["reference_model"]
    )
    scoring = scoring_half(trl_ctx, trl_models, 2, 2, 4, 4, rollout_engine=False)
    (reference,) = scoring.phases[0].moments  # one iteration, no vLLM: the reference pass alone
    old_policy = scoring_half(
        rlhf_context(_workload("trl", kl_coef=0.04, ppo_epochs=2), A100, C), trl_models, 2, 2, 4, 4, False
    )
    assert old_policy.phases[0].moments == (reference, reference)  # the actor's forward, twice
    assert scoring.role_time["reference"] == 0 and scoring.role_time["actor"] == scoring.time["scoring"] > 0
    full = TrainedModelStrategy(zero_stage=2)
    assert place_models(trl_ctx, full, None, s.reference, s.reward, False).reference is not None
    step = step_of(trl_ctx, s)
    assert any("adapters disabled" in note for note in step.notes)
