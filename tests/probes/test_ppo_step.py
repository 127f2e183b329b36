"""Integration: the probes' own PPO step (``probes.step.phases_rlhf.RLHFRun``) through real DeepSpeed engines, on the
CPU.

Each case runs in a fresh Python process (this file, run as a module forked from the preloaded starter by
``script_cases``), as in ``test_ds_initialize.py``:
the probes' child environment (``DS_ACCELERATOR=cpu``, a one-rank gloo group). The child builds the
``ProbeRequest`` that ``planner probe`` would send for a tiny actor (Llama or OPT) and a smaller Llama
critic / reward backbone, and hands it to the probe child's own ``probes.step.child.run``: that joins the
process group, rebuilds the records (``probes.model.build.plan_from_request``), starts the live-tensor
tracker, builds the four engines from ``render_rlhf_ds_configs`` (``RLHFRun``: ``build_causal_lm`` for
actor and reference, ``build_value_model`` for critic and reward) and runs two PPO steps (a warm-up and
a measured one) under its ``PhaseClock``: generation, scoring, actor training, critic training.

Nothing of the step is re-implemented here. The test only watches the production run, through spies
that change nothing it computes:

- ``probes.step.child._build`` is wrapped to keep the ``RLHFRun`` it returns and to copy the trainable
  weights and fp32 master weights before the first step;
- ``probes.step.phases.empties_after`` is wrapped to record every empty_cache decision of the clock;
- on the run: a forward pre-hook on the actor's model records the length of ``input_ids`` in each
  forward call during generation (with the KV cache: the prompt once, then one token a call), a forward
  hook on the reward model records its scores, ``_score`` keeps the experience, and each training
  engine's ``backward`` records the loss it is given.

It prints one ``MEMPLAN_RESULT <json>`` line; the test asserts the sequence shape, KV-cache decoding,
finite losses and rewards, changed parameters, the engines' parsed settings, the hybrid engine's fate
and the recorded empty_cache decisions.

Hybrid engine on the CPU accelerator (DeepSpeed 0.19.8, transformers 5): for Llama DeepSpeed has an
inference policy, and its fused inference module needs the ``transformer_inference`` op, which the CPU
accelerator lacks: ``deepspeed.initialize`` fails with ``ValueError: This op had not been implemented on
CPU backend.``, and ``RLHFRun`` (on the CPU only) rebuilds the actor with ``hybrid_engine.enabled``
false and says so in ``extra["hybrid_engine"]``. For OPT, DeepSpeed skips its injection policy when the
transformers layer takes ``past_key_values`` / ``cache_position`` (as in transformers 5), so the hybrid
engine starts with no inference containers and generation takes the model's native ``generate()``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from script_cases import report, run_script_case

pytestmark = pytest.mark.slow

CASE_TIMEOUT_S = 900  # generous: a fresh machine compiles DeepSpeed's CPU ops first
PROMPTS, PROMPT_LEN, GEN_LEN = 2, 8, 4
STEPS = 2  # a warm-up and a measured step
CPU_HYBRID_ERROR = "ValueError: This op had not been implemented on CPU backend."
# One PPO step under "after-inference", in the order the clock decides: each phase at its end, and the
# end of the step inside critic_training (the last phase), before that phase ends.
EXPECTED_CACHE_DECISIONS = [
    ["generation", True],
    ["scoring", True],
    ["actor_training", False],
    ["end_step", False],
    ["critic_training", False],
]

CASES: dict[str, dict[str, Any]] = {
    # ZeRO-2 actor (tiny Llama) with checkpointing and ZeRO-2 critic; whole frozen models. Hybrid engine
    # asked for, refused on the CPU (see the module docstring), so the step runs without it.
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

    # The probe's own outcome: every PPO phase measured, over the one measured step.
    assert result["phases"] == ["generation", "scoring", "actor_training", "critic_training"]
    assert all(peak > 0 for peak in result["phase_peaks"]), result["phase_peaks"]
    assert result["measured_steps"] == 1 and result["warmup_steps"] == 1
    assert result["layers"] == 2

    # Generation: exactly GEN_LEN new tokens per prompt, decoded with the KV cache (the prompt in one
    # forward, then one token per forward; without the cache each forward would read the whole sequence).
    assert result["sequence_shapes"] == [[PROMPTS, PROMPT_LEN + GEN_LEN]] * STEPS
    assert result["generation_input_lengths"] == [[PROMPT_LEN] + [1] * (GEN_LEN - 1)] * STEPS
    for key in ("kl_mean", "advantages_abs_max", "returns_abs_max"):
        assert all(math.isfinite(v) for v in result[key]), (key, result[key])
    assert len(result["reward_means"]) == STEPS and all(math.isfinite(v) for v in result["reward_means"])
    for role in ("actor", "critic"):
        losses = result["losses"][role]
        assert len(losses) == STEPS and all(math.isfinite(v) for v in losses), (role, losses)
    assert result["cache_decisions"] == EXPECTED_CACHE_DECISIONS * STEPS
    assert result["empty_cache_calls"] == 2 * STEPS

    engines = result["engines"]
    assert set(engines) == {"actor", "critic", "reference", "reward"}
    for role in ("actor", "critic", "reference", "reward"):
        assert engines[role]["zero_stage"] == case[role]["zero_stage"]
        assert engines[role]["bf16"] is True
        assert engines[role]["param_dtype"] == "torch.bfloat16"
        assert engines[role]["train_batch_size"] == PROMPTS
    assert engines["critic"]["offload_optimizer"] == case["critic"].get("offload_optimizer", "none")
    assert engines["reward"]["offload_param"] == case["reward"].get("offload", "none")
    assert engines["actor"]["max_out_tokens"] == PROMPT_LEN + GEN_LEN
    assert not any(engines[role]["hybrid_enabled"] for role in ("critic", "reference", "reward"))
    assert engines["actor"]["gradient_checkpointing"] == case["actor"].get("gradient_checkpointing", False)
    if case["critic"].get("offload_optimizer") == "cpu":
        assert engines["critic"]["inner_optimizer"] == "DeepSpeedCPUAdam"
    else:
        assert engines["critic"]["inner_optimizer"] != "DeepSpeedCPUAdam"

    # The hybrid engine: the exported config asks for it; on the CPU it runs for OPT (no inference
    # containers, native generate) and is refused for Llama with DeepSpeed's CPU error.
    if case["actor_model"] == "opt":
        assert result["hybrid_engine"] == "on"
        assert engines["actor"]["engine_class"] == "DeepSpeedHybridEngine"
        assert engines["actor"]["inference_containers"] == 0
        assert engines["actor"]["hybrid_enabled"] is True
    else:
        assert result["hybrid_engine"].startswith("refused on the CPU accelerator")
        assert CPU_HYBRID_ERROR in result["hybrid_engine"]
        assert engines["actor"]["engine_class"] == "DeepSpeedEngine"
        assert engines["actor"]["hybrid_enabled"] is False

    for role in ("actor", "critic"):
        changed = result["changed"][role]
        assert changed["global_steps"] == STEPS  # one optimizer step per PPO step (2 sequences, micro-batch 2)
        assert changed["masters_changed"] == changed["tensors"] > 0
        assert changed["weights_changed"] >= changed["tensors"] // 2  # bf16 rounding may hide a 1e-5 step
    # The engines hold the models the specs describe: the planner's counts (from the HF configs) and the
    # hand counts of tiny_models agree with the parameters DeepSpeed holds.
    for role in ("actor", "critic", "reference", "reward"):
        assert result["param_counts"][role] == result["plan_params"][role] == result["exact_params"][role], role


# --------------------------------------------------------------------------------------------------
# The child process: one case, the probe child's run with spies.


def _request(case: dict[str, Any]) -> Any:
    """The ProbeRequest of ``case``: tiny actor and reference, tiny critic and reward, two PPO steps."""
    from tiny_models import make_hardware, tiny_critic_spec, tiny_llama_hf_config, tiny_opt_hf_config

    from store.measurements import ProbeRequest

    actor_type = case["actor_model"]
    actor = {"model_type": actor_type, **(tiny_opt_hf_config() if actor_type == "opt" else tiny_llama_hf_config())}
    critic = {"model_type": "llama", **tiny_critic_spec().hf_config}
    workload = {
        "kind": "ppo",
        "model": f"tiny-{actor_type}",
        "ref_model": f"tiny-{actor_type}",
        "critic_model": "tiny-critic",
        "reward_model": "tiny-critic",
        "prompt_len": PROMPT_LEN,
        "gen_len": GEN_LEN,
        "global_batch": PROMPTS,
        "dtype": "bf16",
        "attn_impl": "sdpa",
        "hf_configs": {"model": actor, "ref_model": actor, "critic_model": critic, "reward_model": critic},
    }
    strategy = {
        "actor": case["actor"],
        "critic": case["critic"],
        "reference": case["reference"],
        "reward": case["reward"],
        "hybrid_engine": True,
        "generation_batch": PROMPTS,
        "micro_batch": PROMPTS,
        "grad_accum": 1,
        "empty_cache": "after-inference",
    }
    return ProbeRequest(workload, strategy, make_hardware().to_dict(), device="cpu", steps=STEPS, timeout_s=3600.0)


def _exact_params(case: dict[str, Any]) -> dict[str, int]:
    """Hand counts of tiny_models: causal LMs whole, value models their backbone plus a 1-output head."""
    from tiny_models import tiny_critic_spec, tiny_llama_spec, tiny_opt_spec

    actor = (tiny_opt_spec() if case["actor_model"] == "opt" else tiny_llama_spec()).total_params
    critic = tiny_critic_spec()
    value = critic.backbone_params + critic.hidden_size
    return {"actor": actor, "reference": actor, "critic": value, "reward": value}


def _plan_params(plan: Any) -> dict[str, int]:
    w = plan.workload
    return {
        "actor": w.model.total_params,
        "reference": w.ref_model.total_params,
        "critic": w.critic_model.backbone_params + w.critic_model.hidden_size,
        "reward": w.reward_model.backbone_params + w.reward_model.hidden_size,
    }


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


def _param_count(engine: Any) -> int:
    return sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.module.parameters())


def _engine_facts(engine: Any) -> dict[str, Any]:
    zero = engine._config.zero_config
    optimizer = getattr(engine, "optimizer", None)
    module = engine.module
    first = next(module.parameters())
    return {
        "engine_class": type(engine).__name__,
        "zero_stage": int(engine.zero_optimization_stage()),
        "bf16": bool(engine.bfloat16_enabled()),
        "param_dtype": str(first.dtype),
        "train_batch_size": engine.train_batch_size(),
        "offload_optimizer": str(zero.offload_optimizer.device) if zero.offload_optimizer else "none",
        "offload_param": str(zero.offload_param.device) if zero.offload_param else "none",
        "inner_optimizer": type(getattr(optimizer, "optimizer", optimizer)).__name__,
        "hybrid_enabled": bool(engine._config.hybrid_engine.enabled),
        "max_out_tokens": engine._config.hybrid_engine.max_out_tokens,
        "inference_containers": len(getattr(engine, "_inference_containers", [])),
        "gradient_checkpointing": bool(getattr(module, "is_gradient_checkpointing", False)),
    }


class Spies:
    """What the spies saw of the production run (see the module docstring)."""

    def __init__(self) -> None:
        self.run: Any = None
        self.plan: Any = None
        self.before: dict[str, tuple[list[Any], list[Any]]] = {}
        self.generating = False
        self.generation_input_lengths: list[list[int]] = []
        self.reward_means: list[float] = []
        self.experiences: list[dict[str, Any]] = []
        self.losses: dict[str, list[float]] = {"actor": [], "critic": []}
        self.cache_decisions: list[list[Any]] = []

    def watch(self, run: Any, plan: Any) -> None:
        """Spy on a freshly built RLHFRun (before its first step)."""
        self.run, self.plan = run, plan
        self.before = {role: (_gathered(e), _masters(e)) for role, e in (("actor", run.actor), ("critic", run.critic))}
        run.actor.module.register_forward_pre_hook(self._actor_forward, with_kwargs=True)
        run.reward.module.register_forward_hook(self._reward_output)
        generate, score = run._generate, run._score

        def spy_generate(prompts: Any) -> Any:
            self.generating = True
            self.generation_input_lengths.append([])
            try:
                return generate(prompts)
            finally:
                self.generating = False

        def spy_score(sequences: Any, baseline: Any) -> dict[str, Any]:
            experience = score(sequences, baseline)
            self.experiences.append(experience)
            return experience

        run._generate, run._score = spy_generate, spy_score
        for role in ("actor", "critic"):
            self._spy_backward(role, getattr(run, role))

    def _spy_backward(self, role: str, engine: Any) -> None:
        backward = engine.backward

        def spy(loss: Any, *args: Any, **kwargs: Any) -> Any:
            self.losses[role].append(float(loss.detach()))
            return backward(loss, *args, **kwargs)

        engine.backward = spy

    def _actor_forward(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if self.generating:
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.generation_input_lengths[-1].append(int(ids.shape[1]))

    def _reward_output(self, module: Any, args: Any, output: Any) -> None:
        self.reward_means.append(float(output.detach().float()[:, -1].mean()))

    def results(self) -> dict[str, Any]:
        import torch

        run = self.run
        changed = {}
        for role in ("actor", "critic"):
            engine = getattr(run, role)
            weights, masters = self.before[role]
            changed[role] = {
                "tensors": len(weights),
                "weights_changed": _changed(weights, _gathered(engine)),
                "masters_changed": _changed(masters, _masters(engine)),
                "global_steps": engine.global_steps,
            }
        engines = {"actor": run.actor, "critic": run.critic, "reference": run.reference, "reward": run.reward}

        def kl(exp: dict[str, Any]) -> float:
            mask = exp["mask"]
            return float(((exp["old_logp"] - exp["ref_logp"]) * mask).sum() / mask.sum())

        def abs_max(exp: dict[str, Any], key: str) -> float:
            return float(torch.max(torch.abs(exp[key])))

        return {
            "sequence_shapes": [list(exp["sequences"].shape) for exp in self.experiences],
            "generation_input_lengths": self.generation_input_lengths,
            "reward_means": self.reward_means,
            "kl_mean": [kl(exp) for exp in self.experiences],
            "advantages_abs_max": [abs_max(exp, "advantages") for exp in self.experiences],
            "returns_abs_max": [abs_max(exp, "returns") for exp in self.experiences],
            "losses": self.losses,
            "cache_decisions": self.cache_decisions,
            "engines": {role: _engine_facts(e) for role, e in engines.items()},
            "changed": changed,
            "param_counts": {role: _param_count(e) for role, e in engines.items()},
            "plan_params": _plan_params(self.plan),
        }


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    os.environ["DS_ACCELERATOR"] = "cpu"  # before deepspeed is imported
    import probes.step.child
    import probes.step.phases
    from probes.step.phases_rlhf import RLHFRun

    spies = Spies()
    build, empties_after = probes.step.child._build, probes.step.phases.empties_after

    def spy_build(plan: Any, extra: dict[str, Any]) -> Any:
        run = build(plan, extra)
        assert isinstance(run, RLHFRun), type(run)
        spies.watch(run, plan)
        return run

    def spy_empties_after(policy: str, event: str) -> bool:
        decision = empties_after(policy, event)
        spies.cache_decisions.append([event, decision])
        return decision

    probes.step.child._build = spy_build
    probes.step.phases.empties_after = spy_empties_after
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        phases, layers = probes.step.child.run(_request(case), probes.step.child.Reporter(Path(folder)), extra)
    return {
        **spies.results(),
        "phases": [p.name for p in phases],
        "phase_peaks": [p.peak_allocated_bytes for p in phases],
        "layers": layers,
        "measured_steps": extra["measured_steps"],
        "warmup_steps": extra["warmup_steps"],
        "empty_cache_calls": extra["empty_cache_calls"],
        "hybrid_engine": extra["hybrid_engine"],
        "exact_params": _exact_params(case),
    }


if __name__ == "__main__":
    report(run_case(json.loads(sys.argv[1])))
