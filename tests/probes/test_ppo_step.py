"""Integration: one PPO step through real DeepSpeed engines built from the exported RLHF configs, on the CPU.

Each case runs in a fresh Python process (this file, run as a script), as in ``test_ds_initialize.py``:
``DS_ACCELERATOR=cpu`` before deepspeed is imported, a one-rank gloo group, tiny models with random
weights built from their configs. The child renders ``render_rlhf_ds_configs(...)`` and passes each
config unchanged to ``deepspeed.initialize``: a causal LM for actor and reference, and a smaller Llama
backbone with a scalar value head for critic and reward (``tiny_models.build_value_model``). Then one
PPO-shaped step, its phases marked with ``planner.runtime.EmptyCachePolicy("after-inference")``:

1. generation: ``actor.module.generate(..., use_cache=True)`` (KV cache), a few tokens per prompt;
2. scoring (no grad): the actor's old log-probs, the reference's log-probs, the reward model's score at
   the last token, the critic's values; KL-penalized token rewards and GAE advantages;
3. actor training: clipped-ratio policy loss, ``engine.backward`` + ``engine.step``;
4. critic training: clipped value loss, ``engine.backward`` + ``engine.step``; then ``end_step()``.

It prints one ``MEMPLAN_RESULT <json>`` line; the test asserts finite losses, changed parameters, the
engines' parsed settings and the recorded empty_cache decisions.

Hybrid engine on the CPU accelerator (DeepSpeed 0.19.8, transformers 5): ``deepspeed.initialize`` with
``hybrid_engine.enabled`` builds a ``DeepSpeedHybridEngine``, which replaces each decoder layer that it has
an inference policy for with DeepSpeed's fused inference module. For Llama that module needs the
``transformer_inference`` op, which the CPU accelerator does not provide: initialization fails with
``ValueError: This op had not been implemented on CPU backend.`` (``deepspeed/ops/op_builder/cpu/no_impl.py``,
raised from ``QKVGemmOp`` in ``ds_attention.py``). So the Llama case tries the exported config first,
records that error, and runs the step with ``hybrid_engine.enabled`` set to false on a fresh model. For
OPT, DeepSpeed skips its injection policy when the transformers layer takes ``past_key_values`` /
``cache_position`` (as in transformers 5), so the hybrid engine starts with no inference containers and
generation takes the model's native ``generate()``: the OPT case runs with the hybrid engine enabled.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import pytest
from script_cases import report, run_script_case

pytestmark = pytest.mark.slow

CASE_TIMEOUT_S = 900  # generous: a fresh machine compiles DeepSpeed's CPU ops first
PROMPTS, PROMPT_LEN, GEN_LEN = 2, 8, 4
CPU_HYBRID_ERROR = "This op had not been implemented on CPU backend."
EXPECTED_CACHE_CALLS = [
    ["generation", True],
    ["scoring", True],
    ["actor_training", False],
    ["critic_training", False],
    ["end_step", False],
]

CASES: dict[str, dict[str, Any]] = {
    # ZeRO-2 actor (tiny Llama) and ZeRO-2 critic; whole frozen models. Hybrid engine asked for, refused
    # on the CPU (see the module docstring), so the step runs without it.
    "llama-z2-critic_z2": {
        "actor_model": "llama",
        "actor": {"zero_stage": 2, "gradient_checkpointing": True},
        "critic": {"zero_stage": 2},
        "reference": {"zero_stage": 0},
        "reward": {"zero_stage": 0},
    },
    # ZeRO-3 actor (tiny OPT) with the hybrid engine, ZeRO-3 reference, critic optimizer offloaded to the
    # CPU, reward model ZeRO-3 with its parameters offloaded.
    "opt-z3-hybrid-ref_z3-critic_opt_cpu-reward_z3_offload": {
        "actor_model": "opt",
        "actor": {"zero_stage": 3},
        "critic": {"zero_stage": 2, "offload_optimizer": "cpu"},
        "reference": {"zero_stage": 3},
        "reward": {"zero_stage": 3, "offload": "cpu"},
    },
}


@pytest.mark.parametrize("name", list(CASES))
def test_ppo_step_through_exported_configs(name: str) -> None:
    case = CASES[name]
    result = run_script_case(__file__, name, case, CASE_TIMEOUT_S)

    assert result["sequence_shape"] == [PROMPTS, PROMPT_LEN + GEN_LEN]
    assert result["kv_cache_used"] is True
    for key in ("actor_loss", "critic_loss", "reward_mean", "kl_mean"):
        assert math.isfinite(result[key]), (key, result[key])
    assert result["cache_calls"] == EXPECTED_CACHE_CALLS

    engines = result["engines"]
    assert set(engines) == {"actor", "critic", "reference", "reward"}
    for role in ("actor", "critic", "reference", "reward"):
        assert engines[role]["zero_stage"] == case[role]["zero_stage"]
        assert engines[role]["bf16"] is True
        assert engines[role]["train_batch_size"] == PROMPTS
    assert engines["critic"]["offload_optimizer"] == case["critic"].get("offload_optimizer", "none")
    assert engines["reward"]["offload_param"] == case["reward"].get("offload", "none")
    assert engines["actor"]["max_out_tokens"] == PROMPT_LEN + GEN_LEN
    if case["critic"].get("offload_optimizer") == "cpu":
        assert engines["critic"]["inner_optimizer"] == "DeepSpeedCPUAdam"

    # The hybrid engine: the exported config asks for it; on the CPU it runs for OPT (no inference
    # containers, native generate) and is refused for Llama with DeepSpeed's CPU error.
    if case["actor_model"] == "opt":
        assert result["hybrid_error"] is None
        assert engines["actor"]["engine_class"] == "DeepSpeedHybridEngine"
        assert engines["actor"]["inference_containers"] == 0
    else:
        assert result["hybrid_error"] == f"ValueError: {CPU_HYBRID_ERROR}"
        assert engines["actor"]["engine_class"] == "DeepSpeedEngine"

    for role in ("actor", "critic"):
        changed = result["changed"][role]
        assert changed["global_steps"] == 1
        assert changed["masters_changed"] == changed["tensors"] > 0
        assert changed["weights_changed"] >= changed["tensors"] // 2  # bf16 rounding may hide a 1e-5 step
    assert result["param_counts"]["actor"] == result["spec_params"]["actor"]
    assert result["param_counts"]["critic"] == result["spec_params"]["critic"]


# --------------------------------------------------------------------------------------------------
# The child process: one case, four engines, one PPO step.


def _gathered(engine: Any) -> list[Any]:
    """Full fp32 copies of every trainable parameter (gathered from the ZeRO-3 partitions)."""
    import deepspeed

    params = [p for p in engine.module.parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None, enabled=engine.zero_optimization_stage() == 3):
        return [p.detach().float().clone() for p in params]


def _masters(engine: Any) -> list[Any]:
    from deepspeed.utils import safe_get_full_fp32_param

    out = []
    for param in engine.module.parameters():
        if param.requires_grad:
            master = safe_get_full_fp32_param(param)
            out.append(None if master is None else master.detach().clone())
    return out


def _changed(before: list[Any], after: list[Any]) -> int:
    import torch

    return sum(1 for a, b in zip(before, after, strict=True) if a is not None and not torch.equal(a, b))


def _logprobs(logits: Any, sequences: Any) -> Any:
    """Log-probability of each next token: shape (batch, seq - 1), in fp32."""
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)


def _engine_facts(engine: Any, config: dict[str, Any]) -> dict[str, Any]:
    zero = engine._config.zero_config
    optimizer = getattr(engine, "optimizer", None)
    return {
        "engine_class": type(engine).__name__,
        "zero_stage": int(engine.zero_optimization_stage()),
        "bf16": bool(engine.bfloat16_enabled()),
        "train_batch_size": engine.train_batch_size(),
        "offload_optimizer": str(zero.offload_optimizer.device) if zero.offload_optimizer else "none",
        "offload_param": str(zero.offload_param.device) if zero.offload_param else "none",
        "inner_optimizer": type(getattr(optimizer, "optimizer", optimizer)).__name__,
        "max_out_tokens": engine._config.hybrid_engine.max_out_tokens if "hybrid_engine" in config else None,
        "inference_containers": len(getattr(engine, "_inference_containers", [])),
    }


def _init(model: Any, config: dict[str, Any], trained: bool) -> Any:
    import deepspeed

    params = [p for p in model.parameters() if p.requires_grad] if trained else None
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    return engine


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    os.environ["DS_ACCELERATOR"] = "cpu"  # before deepspeed is imported
    import deepspeed
    import torch
    from tiny_models import (
        build_tiny_model,
        build_value_model,
        make_hardware,
        make_rlhf_strategy,
        make_rlhf_workload,
        tiny_critic_spec,
        tiny_llama_spec,
        tiny_opt_spec,
    )

    from planner.runtime import EmptyCachePolicy
    from probes.rlhf_config import render_rlhf_ds_configs

    deepspeed.init_distributed(dist_backend="gloo")
    actor_spec = tiny_opt_spec() if case["actor_model"] == "opt" else tiny_llama_spec()
    critic_spec = tiny_critic_spec()
    workload = make_rlhf_workload(
        "ppo", actor_spec, critic_spec, dtype="bf16", prompt_len=PROMPT_LEN, gen_len=GEN_LEN, global_batch=PROMPTS
    )
    strategy = make_rlhf_strategy(
        case["actor"],
        case["critic"],
        case["reference"],
        case["reward"],
        hybrid_engine=True,
        generation_batch=PROMPTS,
        micro_batch=PROMPTS,
        grad_accum=1,
        empty_cache="after-inference",
    )
    configs = render_rlhf_ds_configs(strategy, workload, make_hardware())

    def actor_model() -> Any:
        torch.manual_seed(0)
        model = build_tiny_model(actor_spec)
        if strategy.actor.gradient_checkpointing:
            # transformers 5 renamed gradient_checkpointing_enable (now a deprecated alias).
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    hybrid_error = None
    try:
        actor = _init(actor_model(), configs["actor"], trained=True)
    except ValueError as exc:  # the CPU accelerator has no fused inference op (module docstring)
        hybrid_error = f"{type(exc).__name__}: {exc}"
        config = {**configs["actor"], "hybrid_engine": {**configs["actor"]["hybrid_engine"], "enabled": False}}
        configs["actor"] = config
        actor = _init(actor_model(), config, trained=True)
    torch.manual_seed(1)
    critic = _init(build_value_model(critic_spec), configs["critic"], trained=True)
    torch.manual_seed(2)
    reference = _init(build_tiny_model(actor_spec), configs["reference"], trained=False)
    torch.manual_seed(3)
    reward = _init(build_value_model(critic_spec), configs["reward"], trained=False)
    reference.eval()
    reward.eval()

    before = {role: (_gathered(e), _masters(e)) for role, e in (("actor", actor), ("critic", critic))}
    cache = EmptyCachePolicy(strategy)
    generator = torch.Generator().manual_seed(4)
    prompts = torch.randint(3, actor_spec.vocab_size, (PROMPTS, PROMPT_LEN), generator=generator)

    with cache.phase("generation"):
        actor.eval()
        with torch.no_grad():
            out = actor.module.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=GEN_LEN,
                min_new_tokens=GEN_LEN,
                do_sample=True,
                use_cache=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
        sequences = out.sequences
        kv_cache_used = out.past_key_values is not None

    mask = torch.zeros(PROMPTS, sequences.shape[1] - 1)
    mask[:, PROMPT_LEN - 1 :] = 1.0  # log-prob positions of the generated tokens
    with cache.phase("scoring"), torch.no_grad():
        old_logp = _logprobs(actor(input_ids=sequences).logits, sequences)
        ref_logp = _logprobs(reference(input_ids=sequences).logits, sequences)
        score = reward(sequences).float()[:, -1]
        old_values = critic(sequences).float()[:, :-1]
        token_rewards = -0.1 * (old_logp - ref_logp) * mask
        token_rewards[:, -1] += score
        advantages = torch.zeros_like(token_rewards)
        last = torch.zeros(PROMPTS)
        for t in reversed(range(PROMPT_LEN - 1, token_rewards.shape[1])):  # GAE, gamma 1, lambda 0.95
            next_value = old_values[:, t + 1] if t + 1 < token_rewards.shape[1] else torch.zeros(PROMPTS)
            delta = token_rewards[:, t] + next_value - old_values[:, t]
            last = delta + 0.95 * last
            advantages[:, t] = last
        returns = advantages + old_values

    def masked_mean(x: Any) -> Any:
        return (x * mask).sum() / mask.sum()

    with cache.phase("actor_training"):
        actor.train()
        ratio = torch.exp(_logprobs(actor(input_ids=sequences).logits, sequences) - old_logp)
        actor_loss = masked_mean(torch.max(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)))
        actor.backward(actor_loss)
        actor.step()

    with cache.phase("critic_training"):
        critic.train()
        values = critic(sequences).float()[:, :-1]
        clipped = old_values + (values - old_values).clamp(-0.2, 0.2)
        critic_loss = 0.5 * masked_mean(torch.max((values - returns) ** 2, (clipped - returns) ** 2))
        critic.backward(critic_loss)
        critic.step()
    cache.end_step()

    changed = {}
    for role, engine in (("actor", actor), ("critic", critic)):
        weights, masters = before[role]
        changed[role] = {
            "tensors": len(weights),
            "weights_changed": _changed(weights, _gathered(engine)),
            "masters_changed": _changed(masters, _masters(engine)),
            "global_steps": engine.global_steps,
        }
    engines = {"actor": actor, "critic": critic, "reference": reference, "reward": reward}
    return {
        "sequence_shape": list(sequences.shape),
        "kv_cache_used": kv_cache_used,
        "actor_loss": float(actor_loss.detach()),
        "critic_loss": float(critic_loss.detach()),
        "reward_mean": float(score.mean()),
        "kl_mean": float(masked_mean(old_logp - ref_logp)),
        "cache_calls": [[d.event, d.called] for d in cache.calls],
        "hybrid_error": hybrid_error,
        "engines": {role: _engine_facts(e, configs[role]) for role, e in engines.items()},
        "changed": changed,
        "param_counts": {
            "actor": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in actor.module.parameters()),
            "critic": sum(p.numel() for p in critic.module.parameters()),
        },
        "spec_params": {
            "actor": actor_spec.total_params,
            "critic": critic_spec.backbone_params + critic_spec.hidden_size,
        },
    }


if __name__ == "__main__":
    report(run_case(json.loads(sys.argv[1])))
