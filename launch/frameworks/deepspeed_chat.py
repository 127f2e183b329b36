"""DeepSpeed-Chat's step 3 (``training/step3_rlhf_finetuning/main.py``): the flags that run an RLHF strategy
there, and what of the strategy they cannot say. Its DeepSpeed configs are the ones
:func:`launch.rlhf_config.render_rlhf_ds_configs` renders (DeepSpeed-Chat builds the same from its flags)."""

from __future__ import annotations

from launch.common import check_rlhf
from launch.rlhf_config import HYBRID_ENGINE_SETTINGS
from store.records import Hardware, RLHFStrategy, Workload
from store.workload_kinds import traits

# DeepSpeed-Chat's LoRA target: a substring of module names; "layers." matches OPT's
# "model.decoder.layers.N" and Llama-style "model.layers.N" (its default "decoder.layers." fits OPT only).
DSCHAT_LORA_MODULE_NAME = "layers."


def deepspeed_chat_flags(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> list[str]:
    """Flags for DeepSpeed-Chat's ``training/step3_rlhf_finetuning/main.py`` (model and data paths not included).

    DeepSpeed-Chat's step 3 trains PPO only: for ``remax`` and ``grpo`` this returns ``[]`` (the planner
    says it does not apply). What the flags cannot say is listed by :func:`deepspeed_chat_gaps`:

    - ``--offload`` is one switch for actor *and* critic, and offloads parameters too under ZeRO-3
      (DeepSpeed-Chat's train config sets ``offload_param`` and ``offload_optimizer`` to the same device);
      it also offloads the reward model when that is ZeRO-3. It is emitted when either trained model
      offloads its optimizer.
    - The frozen models' stage is not a flag: the reference (and the EMA copy) is ZeRO-3 exactly when the
      actor is, the reward model exactly when the critic is. ``--offload_reference_model`` offloads the
      reference (and EMA). There is no reward-model offload flag in DeepSpeed-Chat (the reward model
      follows ``--offload``), so none is emitted.
    - ``--dtype`` takes ``fp16`` or ``bf16``; fp32 cannot be asked for (DeepSpeed-Chat's default is fp16).
    - NVMe offload, ``allocator`` and ``empty_cache`` have no flag (set PYTORCH_CUDA_ALLOC_CONF and call
      ``torch.cuda.empty_cache()`` yourself; see :func:`rlhf_outside_settings`).
    - DeepSpeed-Chat refuses ZeRO-2 actor + ZeRO-2 critic + hybrid engine + ``--offload`` without actor
      LoRA ("currently unsupported due to training instability").
    - ``--generation_batches`` is left at its default 1 (one generation call per experience batch).

    LoRA: ``--actor_lora_dim`` / ``--critic_lora_dim`` with ``--*_lora_module_name layers.`` (matches
    OPT and Llama-style block names) and ``--only_optimize_lora`` (the planner's LoRA trains the adapters
    only; without the flag DeepSpeed-Chat trains the base weights too).
    """
    check_rlhf(strategy, workload)
    if not traits(workload.kind).trains_critic:  # step 3 trains PPO only
        return []
    actor, critic = strategy.actor, strategy.critic
    assert critic is not None  # check_rlhf: ppo has a critic block
    flags = ["--actor_zero_stage", str(actor.zero_stage), "--critic_zero_stage", str(critic.zero_stage)]
    if actor.offload_optimizer != "none" or critic.offload_optimizer != "none":
        flags.append("--offload")
    if strategy.reference.offload != "none":
        flags.append("--offload_reference_model")
    if actor.gradient_checkpointing:
        flags.append("--actor_gradient_checkpointing")
    if critic.gradient_checkpointing:
        flags.append("--critic_gradient_checkpointing")
    if strategy.hybrid_engine:
        flags.append("--enable_hybrid_engine")
        if HYBRID_ENGINE_SETTINGS["release_inference_cache"]:
            flags.append("--release_inference_cache")
    for role, block in (("actor", actor), ("critic", critic)):
        if block.lora_rank:
            flags += [f"--{role}_lora_dim", str(block.lora_rank), f"--{role}_lora_module_name", DSCHAT_LORA_MODULE_NAME]
    if actor.lora_rank or critic.lora_rank:
        flags.append("--only_optimize_lora")
    flags += [
        "--per_device_generation_batch_size",
        str(strategy.generation_batch),
        "--per_device_training_batch_size",
        str(strategy.micro_batch),
        "--gradient_accumulation_steps",
        str(strategy.grad_accum),
        "--ppo_epochs",
        str(workload.ppo_epochs),
        "--max_prompt_seq_len",
        str(workload.prompt_len),
        "--max_answer_seq_len",
        str(workload.gen_len),
    ]
    if strategy.ema:
        flags.append("--enable_ema")
    if workload.dtype in ("fp16", "bf16"):
        flags += ["--dtype", workload.dtype]
    return flags


def deepspeed_chat_gaps(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> list[str]:
    """What of this strategy :func:`deepspeed_chat_flags` cannot express, one sentence each (empty: nothing)."""
    check_rlhf(strategy, workload)
    if not traits(workload.kind).trains_critic:
        return [f"DeepSpeed-Chat's step 3 trains PPO only; it has no {workload.kind} trainer"]
    actor, critic = strategy.actor, strategy.critic
    assert critic is not None
    gaps: list[str] = []
    if strategy.rollout is not None:
        gaps.append(
            f"DeepSpeed-Chat generates with DeepSpeed (its hybrid engine or HF generate); it has no "
            f"{strategy.rollout.engine} rollout engine"
        )
    offload = actor.offload_optimizer != "none" or critic.offload_optimizer != "none"
    if offload and (actor.offload_optimizer == "none" or critic.offload_optimizer == "none"):
        gaps.append("--offload offloads the optimizer of both actor and critic; the strategy offloads only one")
    for role, block in (("actor", actor), ("critic", critic)):
        if "nvme" in (block.offload_optimizer, block.offload_param):
            gaps.append(f"the {role}'s NVMe offload has no DeepSpeed-Chat flag (--offload means cpu)")
        if offload and block.zero_stage == 3 and block.offload_param == "none":
            gaps.append(f"--offload also offloads the ZeRO-3 {role}'s parameters; the strategy keeps them on the GPU")
    ref_stage = 3 if actor.zero_stage == 3 else 0
    if strategy.reference.zero_stage != ref_stage:
        gaps.append(
            f"DeepSpeed-Chat holds the reference at ZeRO-{ref_stage} (ZeRO-3 exactly when the actor is); "
            f"the strategy asks for ZeRO-{strategy.reference.zero_stage}"
        )
    reward_stage = 3 if critic.zero_stage == 3 else 0
    if strategy.reward.zero_stage != reward_stage:
        gaps.append(
            f"DeepSpeed-Chat holds the reward model at ZeRO-{reward_stage} (ZeRO-3 exactly when the critic is); "
            f"the strategy asks for ZeRO-{strategy.reward.zero_stage}"
        )
    reward_offloaded = offload and reward_stage == 3
    if (strategy.reward.offload != "none") != reward_offloaded:
        gaps.append(
            "DeepSpeed-Chat has no reward-model offload flag: the reward model is offloaded exactly when "
            f"--offload is given and the critic is ZeRO-3 (here: {'yes' if reward_offloaded else 'no'})"
        )
    if workload.dtype == "fp32":
        gaps.append("DeepSpeed-Chat's --dtype takes fp16 or bf16 only (default fp16); fp32 cannot be asked for")
    if actor.zero_stage == 2 and critic.zero_stage == 2 and strategy.hybrid_engine and offload and actor.lora_rank == 0:
        gaps.append(
            "DeepSpeed-Chat refuses ZeRO-2 actor and critic with --enable_hybrid_engine and --offload without "
            "actor LoRA (training instability)"
        )
    if workload.samples_per_prompt > 1:
        gaps.append("DeepSpeed-Chat generates one answer per prompt; samples_per_prompt > 1 has no flag")
    return gaps
