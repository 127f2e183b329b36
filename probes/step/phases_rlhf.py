"""The RLHF probe step (ppo, remax, grpo): four engines from the exported configs, one rollout and training.

Engines (``render_rlhf_ds_configs``, passed unchanged to ``deepspeed.initialize``): the actor (causal LM,
with its ``hybrid_engine`` block), for PPO the critic, the frozen reference (causal LM) and reward model;
critic and reward are a backbone plus a scalar head (:func:`probes.model.build.build_value_model`). Each step:

1. ``generation``: ``actor.module.generate(..., use_cache=True)`` (the KV cache) of ``generation_batch``
   prompts of ``prompt_len`` random tokens, exactly ``gen_len`` new tokens each, sampled; GRPO samples
   ``samples_per_prompt`` answers per prompt, ReMax adds its greedy baseline rollout.
2. ``scoring`` (no grad, actor and critic in eval mode): the actor's and the reference's token
   log-probs, the reward model's score at the last token (ReMax: of the baseline too), PPO's critic
   values; KL-penalized rewards and the advantages (PPO: GAE; ReMax: score minus baseline; GRPO: scores
   normalized within each prompt's group).
3. ``actor_training``: ``ppo_epochs`` passes over the experience in micro-batches of ``micro_batch``
   sequences (rounded up to whole optimizer steps of ``grad_accum`` micro-steps, so every step steps the
   optimizer), each ``engine.backward`` + ``engine.step``: PPO's clipped-ratio loss, ReMax's REINFORCE,
   GRPO's clipped ratio with a KL term to the reference.
4. ``critic_training`` (PPO): the clipped value loss, the same micro-steps.

The hybrid engine on DeepSpeed's CPU accelerator: for models DeepSpeed has an inference policy for
(Llama) ``deepspeed.initialize`` fails with "This op had not been implemented on CPU backend." (no
``transformer_inference`` op on the CPU). On the CPU only, the probe then rebuilds the actor and runs
with ``hybrid_engine.enabled`` false, and says so in ``extra["hybrid_engine"]``. On CUDA the error
stands (outcome "error"): the exported config must run as is there.
"""

from __future__ import annotations

import gc
import math
from typing import Any

from launch.rlhf_config import model_specs, render_rlhf_ds_configs
from probes.model.build import ProbePlan, build_causal_lm, build_value_model, init_engine, prepare_trained
from probes.model.generation import generate_kwargs
from probes.model.logprobs import token_logprobs
from probes.step.phases import PhaseClock
from probes.step.phases_sft import build_device
from store.records import RLHFStrategy
from store.workload_kinds import traits

CPU_HYBRID_ERROR = "not been implemented on CPU backend"
KL_COEF = 0.1
CLIP = 0.2
GAE_LAMBDA = 0.95


class RLHFRun:
    """Engines of one RLHF probe; :meth:`step` runs generation, scoring and training."""

    def __init__(self, plan: ProbePlan, extra: dict[str, Any]) -> None:
        import torch

        strategy = plan.strategy
        assert isinstance(strategy, RLHFStrategy)
        workload = plan.workload
        self.plan, self.strategy, self.workload, self.device = plan, strategy, workload, plan.device
        attn, dtype = extra.get("attn_impl", workload.attn_impl), workload.dtype
        self.specs = model_specs(workload)
        self.configs = render_rlhf_ds_configs(strategy, workload, plan.hardware)

        def trained(role: str, value: bool) -> Any:
            block = getattr(strategy, role)
            torch.manual_seed(0 if role == "actor" else 1)
            build = build_value_model if value else build_causal_lm
            model = build(self.specs[role], dtype, attn, build_device(plan.device, block.offload_param))
            extra[f"{role}_prepared"] = prepare_trained(model, block.gradient_checkpointing, block.lora_rank)
            return model

        try:
            self.actor = init_engine(trained("actor", False), self.configs["actor"], trained=True)
            extra["hybrid_engine"] = "on" if strategy.hybrid_engine else "off"
        except ValueError as exc:
            if plan.device != "cpu" or CPU_HYBRID_ERROR not in str(exc) or not strategy.hybrid_engine:
                raise
            extra["hybrid_engine"] = (
                f"refused on the CPU accelerator ({type(exc).__name__}: {exc}); ran with hybrid_engine.enabled false"
            )
            gc.collect()
            he = {**self.configs["actor"]["hybrid_engine"], "enabled": False}
            self.configs["actor"] = {**self.configs["actor"], "hybrid_engine": he}
            self.actor = init_engine(trained("actor", False), self.configs["actor"], trained=True)
        self.critic = None
        if "critic" in self.specs:
            self.critic = init_engine(trained("critic", True), self.configs["critic"], trained=True)
        # a KL coefficient of 0 loads no reference, rule-based rewards no reward model (Workload.role_models)
        self.reference = self._frozen("reference", build_causal_lm, attn, seed=2) if "reference" in self.specs else None
        self.reward = self._frozen("reward", build_value_model, attn, seed=3) if "reward" in self.specs else None
        self.kl_coef = KL_COEF if workload.kl_coef is None else workload.kl_coef
        engines = {"actor": self.actor, "critic": self.critic, "reference": self.reference, "reward": self.reward}
        extra["engines"] = {role: type(engine).__name__ for role, engine in engines.items() if engine is not None}
        self.generator = torch.Generator(device=self.device).manual_seed(1234)
        samples = workload.samples_per_prompt if traits(workload.kind).group_samples else 1
        self.experience = strategy.generation_batch * samples
        passes = workload.ppo_epochs * math.ceil(self.experience / strategy.micro_batch)
        self.micro_steps = math.ceil(passes / strategy.grad_accum) * strategy.grad_accum
        extra["experience_sequences"] = self.experience
        extra["training_micro_steps"] = self.micro_steps
        pad = getattr(self.actor.module.config, "pad_token_id", None)
        self.pad = 0 if pad is None else pad

    def _frozen(self, role: str, build: Any, attn: str, seed: int) -> Any:
        import torch

        block = getattr(self.strategy, role)
        torch.manual_seed(seed)
        where = "cpu" if block.offload != "none" else self.device
        model = build(self.specs[role], self.workload.dtype, attn, where)
        model.requires_grad_(False)
        engine = init_engine(model, self.configs[role], trained=False)
        engine.eval()
        return engine

    # --- the step ------------------------------------------------------------------------------------

    def step(self, clock: PhaseClock) -> None:
        import torch

        w, s = self.workload, self.strategy
        low = min(3, w.model.vocab_size - 1)
        prompts = torch.randint(
            low, w.model.vocab_size, (s.generation_batch, w.prompt_len), generator=self.generator, device=self.device
        )
        with clock.phase("generation"):
            sequences, baseline = self._generate(prompts)
        with clock.phase("scoring"), torch.no_grad():
            experience = self._score(sequences, baseline)
        with clock.phase("actor_training"):
            self.actor.train()
            for index in self._micro_batches():
                self._actor_micro_step(experience, index)
            if self.critic is None:
                clock.end_step()
        if self.critic is not None:
            with clock.phase("critic_training"):
                self.critic.train()
                for index in self._micro_batches():
                    self._critic_micro_step(experience, index)
                clock.end_step()

    def _generate(self, prompts: Any) -> tuple[Any, Any]:
        import torch

        w = self.workload
        self.actor.eval()
        if self.critic is not None:
            self.critic.eval()
        kwargs = generate_kwargs(prompts, w.gen_len, self.pad)  # what probes.trace.generation traces
        samples = w.samples_per_prompt if traits(w.kind).group_samples else 1
        with torch.no_grad():
            sequences = self.actor.module.generate(
                input_ids=prompts, do_sample=True, num_return_sequences=samples, **kwargs
            )
            baseline = None
            if traits(w.kind).greedy_baseline:
                baseline = self.actor.module.generate(input_ids=prompts, do_sample=False, **kwargs)
        return sequences, baseline

    def _score(self, sequences: Any, baseline: Any) -> dict[str, Any]:
        import torch

        w = self.workload
        mask = torch.zeros(sequences.shape[0], sequences.shape[1] - 1, device=sequences.device)
        mask[:, w.prompt_len - 1 :] = 1.0  # log-prob positions of the generated tokens
        old_logp = token_logprobs(self.actor(input_ids=sequences, use_cache=False).logits, sequences)
        # no reference (KL coefficient 0): no reference log-probs, the KL terms vanish
        ref_logp = (
            old_logp
            if self.reference is None
            else token_logprobs(self.reference(input_ids=sequences, use_cache=False).logits, sequences)
        )
        score = self._reward(sequences)
        kl = (old_logp - ref_logp) * mask
        out = {"sequences": sequences, "mask": mask, "old_logp": old_logp, "ref_logp": ref_logp}
        if traits(w.kind).gae_advantages:
            values = self.critic(sequences).float()[:, :-1]
            rewards = -self.kl_coef * kl
            rewards[:, -1] += score
            advantages = torch.zeros_like(rewards)
            last = torch.zeros(rewards.shape[0], device=rewards.device)
            for t in reversed(range(w.prompt_len - 1, rewards.shape[1])):  # GAE, gamma 1
                next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(last)
                last = rewards[:, t] + next_value - values[:, t] + GAE_LAMBDA * last
                advantages[:, t] = last
            out.update(advantages=advantages, old_values=values, returns=advantages + values)
        elif traits(w.kind).greedy_baseline:
            base = self._reward(baseline)
            advantage = (score - base) - self.kl_coef * kl.sum(-1)
            out["advantages"] = advantage.unsqueeze(-1) * mask
        else:  # grpo: normalize within each prompt's group of samples
            groups = score.view(-1, w.samples_per_prompt)
            normed = (groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, keepdim=True, unbiased=False) + 1e-6)
            out["advantages"] = normed.reshape(-1).unsqueeze(-1) * mask
        return out

    def _reward(self, sequences: Any) -> Any:
        """One score per sequence: the reward model's last value, or with rule-based rewards (no reward model) a
        rule on the text: whether the last token is even (a few elementwise kernels, as a verifier's are)."""
        if self.reward is None:
            return (sequences[:, -1] % 2 == 0).float()
        return self.reward(sequences).float()[:, -1]

    def _micro_batches(self) -> list[list[int]]:
        mb = self.strategy.micro_batch
        return [[(i * mb + j) % self.experience for j in range(mb)] for i in range(self.micro_steps)]

    def _actor_micro_step(self, exp: dict[str, Any], index: list[int]) -> None:
        import torch

        seqs, mask = exp["sequences"][index], exp["mask"][index]
        old, adv = exp["old_logp"][index], exp["advantages"][index]
        logp = token_logprobs(self.actor(input_ids=seqs, use_cache=False).logits, seqs)
        if not traits(self.workload.kind).clipped_ratio:
            per_token = -adv * logp
        else:
            ratio = torch.exp(logp - old)
            per_token = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP, 1 + CLIP))
            if traits(self.workload.kind).kl_in_loss and self.reference is not None:  # TRL: only if beta != 0
                delta = exp["ref_logp"][index] - logp
                per_token = per_token + self.kl_coef * (torch.exp(delta) - delta - 1)
        loss = (per_token * mask).sum() / mask.sum()
        self.actor.backward(loss)
        self.actor.step()

    def _critic_micro_step(self, exp: dict[str, Any], index: list[int]) -> None:
        import torch

        seqs, mask = exp["sequences"][index], exp["mask"][index]
        old, returns = exp["old_values"][index], exp["returns"][index]
        values = self.critic(seqs).float()[:, :-1]
        clipped = old + (values - old).clamp(-CLIP, CLIP)
        loss = 0.5 * ((torch.max((values - returns) ** 2, (clipped - returns) ** 2) * mask).sum() / mask.sum())
        self.critic.backward(loss)
        self.critic.step()
