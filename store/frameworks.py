"""The programs a plan can be made for (``--framework``), the workloads each runs, and their own settings.

A plan is made for the program that will run it: memplan's own DeepSpeed loop (``deepspeed``, the default:
today's predictions), DeepSpeed-Chat, transformers' ``Trainer`` (``hf``), an accelerate loop, TRL's trainers,
OpenRLHF or veRL. The cost model follows each one's code where it differs (``search.frameworks`` lists the
differences). Plain data, no project imports beyond ``store``: the cost model (search), the exports (probes)
and the CLI (planner) read the same table.
"""

from __future__ import annotations

from typing import Any

from store.choices import Framework, values
from store.ds_buckets import ZeroBuckets, buckets_from_zero_config
from store.errors import InputError
from store.records import RLHF_WORKLOADS, SINGLE_MODEL_WORKLOADS
from store.workload_kinds import traits

DEFAULT_FRAMEWORK: str = Framework.DEEPSPEED.value
FRAMEWORKS: tuple[str, ...] = values(Framework)
# The pinned release whose code each framework's differences are read from.
VERSIONS: dict[str, str] = {
    "deepspeed": "deepspeed 0.19.8",
    "hf": "transformers 5.23",
    "accelerate": "accelerate 1.15",
    "trl": "TRL 1.16",
    "openrlhf": "OpenRLHF 0.11.2",
    "verl": "veRL 0.9.1",
    "deepspeed-chat": "DeepSpeed-Chat",
}
# The workloads each program runs (as memplan's workload kinds name them).
WORKLOADS: dict[str, tuple[str, ...]] = {
    "deepspeed": RLHF_WORKLOADS + SINGLE_MODEL_WORKLOADS,
    "deepspeed-chat": RLHF_WORKLOADS + SINGLE_MODEL_WORKLOADS,
    # transformers' Trainer: the causal LM's own loss and sequence classification; no preference loss
    "hf": ("sft", "reward"),
    "accelerate": SINGLE_MODEL_WORKLOADS,
    # trl/trainer: SFTTrainer, RewardTrainer, DPOTrainer, GRPOTrainer (no PPO or ReMax trainer in 1.16)
    "trl": ("sft", "reward", "dpo", "grpo"),
    "openrlhf": RLHF_WORKLOADS,
    "verl": RLHF_WORKLOADS,
}
# The workloads whose LM head TRL 1.16 replaces by its fused, tiled log-prob head (trl/trainer/utils.py
# ``add_fused_lm_head``, called in the __init__ of SFTTrainer, DPOTrainer and GRPOTrainer).
TRL_FUSED_HEAD_WORKLOADS: tuple[str, ...] = ("sft", "dpo", "grpo")
# The per-token outputs each TRL trainer asks the fused head for (its ``outputs=`` argument): each is one fp32
# (``is_top1``: bool) vector per scored token, beside ``log_probs`` which is always computed.
TRL_HEAD_OUTPUTS: dict[str, tuple[str, ...]] = {
    "sft": ("log_probs", "entropy", "is_top1"),  # sft_trainer.py
    "dpo": ("log_probs", "entropy", "mean_logits", "is_top1"),  # dpo_trainer.py (no WPO weighting by default)
    "grpo": ("log_probs", "entropy"),  # grpo_trainer.py
}
# The workloads whose TRL 1.16 config defaults to ``disable_dropout=True`` (``DPOConfig``, ``RewardConfig``; the
# trainers' __init__ call ``trl.trainer.utils.disable_dropout_in_model``; ``GRPOConfig`` defaults to False,
# ``SFTConfig`` has no such key): the model runs with its ``nn.Dropout`` modules at p = 0 (``store.module_dropout``).
TRL_NO_DROPOUT_WORKLOADS: tuple[str, ...] = ("dpo", "reward")
# GRPOConfig's default (trl/trainer/grpo_config.py, TRL 1.16): with vLLM the old policy's log-probs are always
# computed, to correct for the engine's sampling distribution (GRPOTrainer._generate_and_score_completions)
TRL_VLLM_IMPORTANCE_SAMPLING_CORRECTION = True
# train_ppo_ray's --ds.attn_implementation default (openrlhf/cli/train_ppo_ray.py, 0.11.2)
DEFAULT_ATTENTION: dict[str, str] = {"openrlhf": "flash_attention_2"}
# The KL coefficient each program runs an RLHF workload with when the user gives none (``--kl-coef``); 0 loads no
# reference model. A program not listed holds a reference at a coefficient it has no setting for (memplan's own
# loop follows DeepSpeed-Chat: its None).
# - trl: GRPOConfig ``beta: float = field(default=0.0, ...)`` (trl/trainer/grpo_config.py, TRL 1.16), and
#   GRPOTrainer.__init__ ``if self.beta == 0.0: self.ref_model = None`` (trl/trainer/grpo_trainer.py).
# - openrlhf: ``--algo.kl.init_coef`` default 0.01 (openrlhf/cli/train_ppo_ray.py, 0.11.2); ``train`` builds the
#   ReferenceModelActor group only ``if args.algo.kl.init_coef > 0``.
# - verl: ``actor_rollout_ref.actor.use_kl_loss: false`` and ``algorithm.use_kl_in_reward: false``
#   (verl/trainer/config/_generated_ppo_trainer.yaml, 0.9.1), and ``need_reference_policy`` is their ``or``
#   (verl/trainer/ppo/utils.py): no reference by default.
DEFAULT_KL_COEF: dict[str, float] = {"trl": 0.0, "openrlhf": 0.01, "verl": 0.0}
# The rollout engines each program runs (``store.rollout.INFERENCE_ENGINES`` names): OpenRLHF 0.11.2 creates vLLM
# engines only (``create_vllm_engines``, openrlhf/trainer/ray/vllm_engine.py); TRL 1.16's GRPOTrainer vLLM only
# (``use_vllm``, ``vllm_mode`` colocate or server); veRL 0.9.1 vLLM or SGLang (``actor_rollout_ref.rollout.name``).
ROLLOUT_ENGINES_RUN: dict[str, tuple[str, ...]] = {
    "openrlhf": ("vllm",),
    "trl": ("vllm",),
    "verl": ("vllm", "sglang"),
}
# Programs that cannot run an RLHF option: why, one clause each (the CLI's line for a refused --kl-coef or
# --reward-model none). DeepSpeed-Chat's step 3 (dschat/rlhf/ppo_trainer.py, DeepSpeedPPOTrainer.__init__):
# ``self.reward_model = self.rlhf_engine.reward`` scores every rollout, ``self.kl_ctl = 0.1`` is fixed, and
# ``self.ref_model = self.rlhf_engine.ref`` is always loaded.
RULE_REWARD_REFUSED: dict[str, str] = {
    "deepspeed-chat": "DeepSpeed-Chat's step 3 always scores with its reward model (ppo_trainer.py: "
    "self.reward_model = self.rlhf_engine.reward); plan rule-based rewards for openrlhf, verl, trl or deepspeed",
}
KL_COEF_REFUSED: dict[str, str] = {
    "deepspeed-chat": "DeepSpeed-Chat's step 3 fixes its KL coefficient (ppo_trainer.py: self.kl_ctl = 0.1) and "
    "always loads the reference; plan another coefficient for openrlhf, verl, trl or deepspeed",
}


def check_framework(framework: Any, kind: str) -> str:
    """``framework`` if it names a program that runs workload ``kind``; one InputError line otherwise."""
    if not isinstance(framework, str) or framework not in FRAMEWORKS:
        shown = repr(framework) if len(repr(framework)) <= 32 else repr(framework)[:29] + "..."
        raise InputError(f"--framework must be one of {', '.join(FRAMEWORKS)}, not {shown}")
    if kind not in WORKLOADS[framework]:
        runs = ", ".join(WORKLOADS[framework])
        others = ", ".join(f for f in FRAMEWORKS if kind in WORKLOADS[f])
        raise InputError(f"--framework {framework} runs {runs}, not {kind}: plan {kind} for one of {others}")
    return framework


def default_kl_coef(framework: str) -> float | None:
    """The KL coefficient ``framework`` runs RLHF with when the user gives none (None: a reference held at a
    coefficient the program fixes: memplan's own loop and DeepSpeed-Chat's ``kl_ctl``); see
    :data:`DEFAULT_KL_COEF`."""
    return DEFAULT_KL_COEF.get(framework)


def default_attention(framework: str) -> str | None:
    """The attention implementation the framework loads models with when the user says none (None: the
    planner's own default)."""
    return DEFAULT_ATTENTION.get(framework)


def openrlhf_buckets(zero_stage: int, overlap_comm: bool, hidden_size: int) -> ZeroBuckets:
    """The buckets DeepSpeed runs OpenRLHF 0.11.2's trained models with.

    OpenRLHF builds its own DeepSpeed config (``openrlhf/utils/deepspeed/deepspeed_utils.py``,
    ``get_train_ds_config``): ``reduce_bucket_size``, the ZeRO-3 prefetch, persistence, live-parameter and reuse
    keys and ``sub_group_size`` are ``"auto"``, which DeepSpeed drops (``deepspeed/runtime/config_utils.py``,
    ``DeepSpeedConfigModel.__init__``) for its own defaults; ``overlap_comm`` and ``contiguous_gradients`` are set
    only with ``--ds.overlap_comm``, else DeepSpeed's dynamic default (on for ZeRO-3) holds."""
    zero: dict[str, Any] = {"overlap_comm": True, "contiguous_gradients": True} if overlap_comm else {}
    return buckets_from_zero_config(zero, zero_stage, hidden_size)


def framework_buckets(framework: str, zero_stage: int, hidden_size: int, overlap_comm: bool) -> ZeroBuckets | None:
    """The ZeRO buckets a framework runs a trained model with where it builds its own DeepSpeed config (None:
    the plan's exported config, whose buckets are memplan's). ``overlap_comm``: the plan's, which the export
    passes on (OpenRLHF's ``--ds.overlap_comm``)."""
    if framework == "openrlhf":
        return openrlhf_buckets(zero_stage, overlap_comm, hidden_size)
    return None


def runs_without_module_dropout(framework: str, kind: str) -> bool:
    """Whether ``framework`` runs workload ``kind`` with its ``nn.Dropout`` modules at p = 0 (TRL's
    ``disable_dropout`` default, :data:`TRL_NO_DROPOUT_WORKLOADS`)."""
    return framework == "trl" and kind in TRL_NO_DROPOUT_WORKLOADS


def openrlhf_eval_buckets(hidden_size: int) -> ZeroBuckets:
    """The ZeRO settings DeepSpeed runs OpenRLHF 0.11.2's frozen models (reference, reward) with.

    ``DeepspeedStrategy.get_ds_eval_config`` (``openrlhf/utils/deepspeed/deepspeed.py``) calls
    ``get_eval_ds_config`` (``openrlhf/utils/deepspeed/deepspeed_utils.py``) with ``stage=self.stage if
    self.stage == 3 else 0`` and ``offload=--ref.offload`` / ``--reward.offload``; its ``zero_optimization`` holds
    ``stage3_max_live_parameters``, ``stage3_max_reuse_distance``, ``stage3_param_persistence_threshold`` and
    ``stage3_prefetch_bucket_size`` as ``"auto"`` and no ``overlap_comm``, bucket or ``sub_group_size`` key.
    DeepSpeed drops the ``"auto"`` values for its own defaults (``DeepSpeedZeroConfig``: a prefetch bucket of 5e7
    elements, persistence 1e5, live parameters and reuse distance 1e9) and turns ``overlap_comm`` on for stage 3
    (``overlap_comm_valid``); ``--ds.overlap_comm`` reaches only ``get_train_ds_config``. memplan's own frozen
    configs (``launch.rlhf_config``) hold transformers' sizes (0.9 hidden^2 prefetch, 10 hidden persistence)."""
    zero = {
        key: "auto"
        for key in (
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
            "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size",
        )
    }
    # DeepSpeed, not transformers, reads these "auto" values: OpenRLHF calls deepspeed.initialize itself
    kept = {key: value for key, value in zero.items() if value != "auto"}
    return buckets_from_zero_config(kept, 3, hidden_size)  # overlap_comm: DeepSpeed's stage-3 default (on)


def framework_frozen_buckets(framework: str, hidden_size: int) -> ZeroBuckets | None:
    """The ZeRO-3 settings a framework runs a frozen model with where it builds its own DeepSpeed config (None:
    the plan's exported config, memplan's sizes for the model: ``store.ds_defaults.zero3_buckets``)."""
    if framework == "openrlhf":
        return openrlhf_eval_buckets(hidden_size)
    return None


# veRL 0.9.1 passes its rollout config's batch limits to vLLM (``vllm_async_server.py``,
# ``vLLMHttpServer.launch_server``: ``"max_num_seqs": self.config.max_num_seqs``, ``"max_num_batched_tokens":
# self.config.max_num_batched_tokens``); ``_generated_ppo_trainer.yaml`` ``actor_rollout_ref.rollout``: 8192 and
# 256, where ``vllm.LLM`` alone takes 16384 and 1024 on a GPU of 70 GiB or more other than the A100.
VERL_VLLM_BATCH: tuple[int, int] = (8192, 256)  # (max_num_batched_tokens, max_num_seqs)


def framework_engine_batch(framework: str, engine: str) -> tuple[int, int] | None:
    """``(max_num_batched_tokens, max_num_seqs)`` a framework starts its rollout engine with (None: the engine's
    own defaults for the GPU, as memplan's export leaves them)."""
    if framework == "verl" and engine == "vllm":
        return VERL_VLLM_BATCH
    return None


def framework_sleep_level(framework: str, sleep_level: int, lora_rank: int) -> int:
    """The sleep level a framework puts its colocated engine to when the plan lets it sleep (``sleep_level`` > 0).

    veRL 0.9.1 (``free_cache_engine=True``, a hybrid worker): ``vLLMHttpServer._sleep_hybrid`` sleeps at
    ``_resolve_sleep_level()``: 2, or 1 when LoRA is served as an adapter (``vllm_async_server.py``); its SGLang
    rollout the same (``sglang_rollout.py``: ``1 if lora_served_as_adapter(...) else 2``). Elsewhere the plan's."""
    if framework == "verl" and sleep_level > 0:
        return 1 if lora_rank else 2
    return sleep_level


def trl_grpo(framework: str, kind: str) -> bool:
    """Whether the step is TRL's GRPOTrainer: TRL 1.16 has no other RLHF trainer (FRAMEWORK_WORKLOADS), so an RLHF
    kind planned for TRL is its GRPO."""
    return framework == "trl" and traits(kind).rlhf


def trl_old_logps_forward(
    gradient_accumulation_steps: int,
    steps_per_generation: int,
    num_iterations: int,
    use_vllm: bool,
    vllm_importance_sampling_correction: bool,
) -> bool:
    """Whether TRL 1.16's GRPOTrainer runs the old policy's log-prob forward over a generation batch, its own
    condition (trl/trainer/grpo_trainer.py, ``GRPOTrainer._generate_and_score_completions``)::

        generate_every = self.args.steps_per_generation * self.num_iterations
        if self.args.gradient_accumulation_steps % generate_every != 0 or (
            self.use_vllm and self.vllm_importance_sampling_correction
        ):

    Otherwise ``old_per_token_logps = None`` and ``_compute_loss`` takes ``per_token_logps.detach()``."""
    generate_every = steps_per_generation * num_iterations
    return gradient_accumulation_steps % generate_every != 0 or (use_vllm and vllm_importance_sampling_correction)


def scores_old_policy(framework: str, kind: str, ppo_epochs: int, grad_accum: int, rollout_engine: bool) -> bool:
    """Whether the step runs the actor's no-grad scoring forward (the old policy's log-probs). memplan's own loop
    and the other programs always do; TRL's GRPO as :mod:`launch.frameworks.trl` exports it decides by
    :func:`trl_old_logps_forward` with ``num_iterations = ppo_epochs``, ``use_vllm`` = a rollout engine,
    ``gradient_accumulation_steps = grad_accum``, and ``steps_per_generation`` left unset, which
    ``GRPOConfig.__post_init__`` makes ``gradient_accumulation_steps``; ``vllm_importance_sampling_correction`` at
    its default (:data:`TRL_VLLM_IMPORTANCE_SAMPLING_CORRECTION`). So TRL skips it at one iteration without vLLM."""
    if not trl_grpo(framework, kind):
        return True
    return trl_old_logps_forward(
        grad_accum, grad_accum, ppo_epochs, rollout_engine, TRL_VLLM_IMPORTANCE_SAMPLING_CORRECTION
    )


def reference_through_actor(framework: str, kind: str, holds_reference: bool, lora_rank: int) -> bool:
    """Whether the reference's log-probs come from the LoRA actor with its adapters off, with no copy of its own.

    TRL 1.16's ``GRPOTrainer.__init__`` (trl/trainer/grpo_trainer.py): ``elif is_peft_model(model): ...
    self.ref_model = None``; ``_generate_and_score_completions`` then scores the reference with ``self.model``
    under ``use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None)`` (adapters disabled
    for a new adapter). The pass runs as long as ``beta != 0.0`` (``holds_reference``)."""
    return trl_grpo(framework, kind) and holds_reference and lora_rank > 0
