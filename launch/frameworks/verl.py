"""veRL 0.9 (``python3 -m verl.trainer.main_ppo``): Hydra overrides of ``ppo_trainer.yaml`` for a plan.

veRL trains with FSDP (its default ``model_engine: dp``), not DeepSpeed. The ZeRO layouts map as:

- ZeRO-3: FSDP full shard (veRL's default); parameter offload -> ``fsdp_config.param_offload``, optimizer
  offload -> ``fsdp_config.optimizer_offload``. veRL parks the offloaded shards in host memory between phases
  and brings them back to the GPU to compute and step (no CPU Adam), unlike DeepSpeed's offload: a gap.
- ZeRO-2: ``reshard_after_forward=false`` (FSDP1 ``SHARD_GRAD_OP``, FSDP2 keeps the gathered weights from
  forward to backward): weights are sharded at rest, where ZeRO-2 keeps them whole: an approximation (gap).
- ZeRO-1: veRL has no optimizer-only sharding; approximated like ZeRO-2 (gap).
- ZeRO-0: ``fsdp_size=1`` (shard groups of one rank: every rank holds everything, as DDP).

Rollout: ``actor_rollout_ref.rollout.*`` (vLLM or SGLang; ``free_cache_engine`` for a sleeping engine, which veRL
puts to sleep at level 2, level 1 with LoRA). A separate engine is veRL's ``separate_async`` trainer with a
standalone rollout pool (``rollout.nnodes`` x ``rollout.n_gpus_per_node``). The reference is kept by
``use_kl_loss`` (GRPO) or ``use_kl_in_reward`` (PPO, ReMax), both off for a plan whose KL coefficient is 0
(``need_reference_policy`` in verl/trainer/ppo/utils.py is their ``or``: no reference worker); the coefficient is
``actor_rollout_ref.actor.kl_loss_coef`` or ``algorithm.kl_ctrl.kl_coef`` (veRL's 0.001 for a plan made without
one). The reward model is served by an inference engine (``reward.reward_model``), so its ZeRO layout does not
carry over; rule-based rewards are ``reward.reward_model.enable=False``, veRL's default, whose reward manager
scores with its rule-based ``default_compute_score`` or the user's ``reward.custom_reward_function``.
"""

from __future__ import annotations

import math
from typing import Any

from launch.common import (
    MODEL_VARS,
    Rendered,
    allocator_gaps,
    check_rlhf,
    comment_block,
    gap_comments,
    max_out_tokens,
    require_vars,
    rlhf_only,
    shell_command,
    train_sequences,
    trainer_gpus_per_node,
)
from store.records import DTYPE_BYTES, FrozenModelStrategy, Hardware, RLHFStrategy, TrainedModelStrategy, Workload
from store.workload_kinds import traits

VERSION = "0.9.1"
ESTIMATORS = {"ppo": "gae", "remax": "remax", "grpo": "grpo"}
FSDP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def _trained(
    prefix: str, model_prefix: str, role: str, block: TrainedModelStrategy, offload_training: bool
) -> tuple[list[str], list[str]]:
    """Overrides and gaps of one trained model's FSDP layout (``prefix``: its fsdp config's path)."""
    out = [f"{model_prefix}.enable_gradient_checkpointing={_bool(block.gradient_checkpointing)}"]
    out += [f"{model_prefix}.lora_rank={block.lora_rank}"] if block.lora_rank else []
    gaps: list[str] = []
    if block.zero_stage == 0:
        out.append(f"{prefix}.fsdp_size=1")
    elif block.zero_stage in (1, 2):
        out.append(f"{prefix}.reshard_after_forward=False")
        what = (
            "veRL has no ZeRO-1 (FSDP always shards gradients and weights too)"
            if block.zero_stage == 1
            else "veRL has no ZeRO-2"
        )
        gaps.append(
            f"{what}: the {role} is approximated by FSDP with reshard_after_forward=False (SHARD_GRAD_OP), which "
            "keeps the weights sharded at rest where ZeRO-2 keeps them whole (less memory for weights, more "
            "all-gathers)"
        )
    param_offload = block.offload_param != "none"
    optimizer_offload = block.offload_optimizer != "none" or offload_training
    out += [f"{prefix}.param_offload={_bool(param_offload)}", f"{prefix}.optimizer_offload={_bool(optimizer_offload)}"]
    if "nvme" in (block.offload_param, block.offload_optimizer):
        gaps.append(f"veRL offloads the {role}'s FSDP shards to host memory only, not NVMe")
    if block.offload_param != "none" or block.offload_optimizer != "none":
        gaps.append(
            f"veRL's param_offload/optimizer_offload park the {role}'s shards in host memory between phases and "
            "bring them back to compute and step on the GPU; DeepSpeed's offload keeps them (and Adam) on the host"
        )
    return out, gaps


def _bool(value: bool) -> str:
    return "True" if value else "False"


def _reference(block: FrozenModelStrategy) -> list[str]:
    prefix = "actor_rollout_ref.ref.fsdp_config"
    out = [f"{prefix}.param_offload={_bool(block.offload != 'none')}"]
    return out + ([f"{prefix}.fsdp_size=1"] if block.zero_stage == 0 else [])


def overrides(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> list[str]:
    """The ``key=value`` Hydra overrides for the plan (model and data paths not included)."""
    return _build(strategy, workload, hardware)[0]


def gaps(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> list[str]:
    """What veRL's overrides cannot express of the plan, one sentence each."""
    return _build(strategy, workload, hardware)[1]


def _build(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> tuple[list[str], list[str]]:
    check_rlhf(strategy, workload)
    rollout = strategy.rollout
    k = workload.samples_per_prompt
    offload_training = rollout is not None and rollout.colocated and rollout.offload_training
    out = [
        f"algorithm.adv_estimator={ESTIMATORS[workload.kind]}",
        f"data.train_batch_size={workload.global_batch}",
        f"data.max_prompt_length={workload.prompt_len}",
        f"data.max_response_length={workload.gen_len}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={workload.global_batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={strategy.micro_batch}",
        f"actor_rollout_ref.actor.ppo_epochs={workload.ppo_epochs}",
    ]
    layout, found = _trained(
        "actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.model", "actor", strategy.actor, offload_training
    )
    out += layout
    out += _kl(workload)
    scoring = strategy.generation_batch * k
    if workload.holds_reference:
        out += _reference(strategy.reference)
        out.append(f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={scoring}")
    out += [
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={scoring}",
        f"actor_rollout_ref.rollout.n={k}",
    ]
    if workload.has_critic and strategy.critic is not None:
        out += [
            f"critic.ppo_micro_batch_size_per_gpu={strategy.micro_batch}",
            f"critic.forward_micro_batch_size_per_gpu={scoring}",
        ]
        layout, more = _trained("critic.fsdp", "critic.model", "critic", strategy.critic, offload_training)
        out += layout
        found += more
    if workload.dtype in FSDP_DTYPES:
        dtype = FSDP_DTYPES[workload.dtype]
        out += [f"actor_rollout_ref.actor.fsdp_config.dtype={dtype}", f"actor_rollout_ref.rollout.dtype={dtype}"]
        out += [f"critic.fsdp.dtype={dtype}"] if workload.has_critic else []
    else:
        found.append("veRL trains in bf16 or fp16 mixed precision (fp32 master weights); an fp32 plan has no setting")
    if train_sequences(strategy, hardware) != workload.global_batch * k:
        found.append(
            f"veRL steps the optimizer once per ppo_mini_batch_size prompts; the plan's step of "
            f"{train_sequences(strategy, hardware)} sequences is not a whole number of prompt groups of {k}"
        )
    more_out, more = _rollout(strategy, hardware)
    out += more_out
    found += more
    out += reward_engine(strategy, workload, hardware)
    if workload.holds_reward_model:
        found.append(
            "veRL 0.9 serves the reward model on an inference engine (reward.reward_model.rollout) with one full "
            f"copy per GPU, not as an FSDP model: the plan's reward layout (ZeRO-{strategy.reward.zero_stage}, "
            f"offload {strategy.reward.offload}) does not carry over, and the engine's own profiling forward and "
            "CUDA context come on top of the share it is given"
        )
    if strategy.ema:
        found.append("veRL keeps no EMA copy of the actor")
    if strategy.allocator == "default":
        found.append(
            "veRL turns expandable segments on for the trainer itself after each weight sync "
            "(ActorRolloutRefWorker.update_weights, verl/workers/engine_workers.py: set_expandable_segments(True)); "
            "the plan's default allocator does not hold there"
        )
    return out, found + allocator_gaps(strategy, "veRL")


def _kl(workload: Workload) -> list[str]:
    """The KL overrides: the reference is kept by ``actor_rollout_ref.actor.use_kl_loss`` (GRPO: the KL is a term
    of the actor's loss, coefficient ``kl_loss_coef``) or ``algorithm.use_kl_in_reward`` (PPO, ReMax: folded into
    the reward, ``algorithm.kl_ctrl.kl_coef``); both ``False`` at a KL coefficient of 0 (no reference worker:
    ``need_reference_policy``, verl/trainer/ppo/utils.py). Without a coefficient in the plan veRL's own (0.001 in
    _generated_ppo_trainer.yaml) holds."""
    in_loss = traits(workload.kind).kl_in_loss
    use = "actor_rollout_ref.actor.use_kl_loss" if in_loss else "algorithm.use_kl_in_reward"
    coef = "actor_rollout_ref.actor.kl_loss_coef" if in_loss else "algorithm.kl_ctrl.kl_coef"
    if not workload.holds_reference:
        return ["actor_rollout_ref.actor.use_kl_loss=False", "algorithm.use_kl_in_reward=False"]
    out = [f"{use}=True"]  # keeps the reference model the plan holds
    return out + ([f"{coef}={workload.kl_coef:g}"] if workload.kl_coef is not None else [])


def reward_engine(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> list[str]:
    """The overrides of veRL's reward-model engine (``reward.reward_model.rollout``, a ``RolloutConfig``); with
    rule-based rewards (no reward model) ``reward.reward_model.enable=False`` alone, veRL's default.

    - ``name``: the rollout's engine (vLLM without one). The config leaves it ``???`` (mandatory), and
      ``init_workers`` stops with ``MissingMandatoryValue`` on reading it.
    - ``tensor_model_parallel_size=1``: colocated, ``RewardModelManager._initialize_llm_servers``
      (verl/experimental/reward_loop/reward_model.py) makes world_size // tensor_parallel replicas of the training
      pool; the default 2 leaves none on a 1-GPU plan. One replica per GPU holds the whole model, as the plan's
      ZeRO-0 reward model does.
    - ``gpu_memory_utilization``: the share of a GPU the engine may take (default 0.5): the reward model's weights
      in the plan's dtype plus the KV cache of one scoring batch (generation_batch x samples_per_prompt sequences
      of prompt + generation tokens), rounded up to a hundredth.
    - ``max_model_len`` (default: the model's whole context, whose KV cache vLLM must be able to hold) and
      ``dtype``: the plan's.
    """
    if not workload.holds_reward_model:
        return ["reward.reward_model.enable=False"]
    model = workload.model_for("reward")
    dtype_bytes = DTYPE_BYTES[workload.dtype]
    tokens = strategy.generation_batch * workload.samples_per_prompt * max_out_tokens(workload)
    kv = model.num_layers * model.kv_elements_per_token * tokens * dtype_bytes
    share = (model.backbone_params * dtype_bytes + kv) / hardware.gpu_memory_bytes
    utilization = min(1.0, math.ceil(share * 100) / 100)
    engine = strategy.rollout.engine if strategy.rollout is not None else "vllm"
    prefix = "reward.reward_model"
    out = [
        f"{prefix}.enable=True",
        f"{prefix}.rollout.name={engine}",
        f"{prefix}.rollout.tensor_model_parallel_size=1",
        f"{prefix}.rollout.gpu_memory_utilization={utilization:g}",
        f"{prefix}.rollout.max_model_len={max_out_tokens(workload)}",
    ]
    if workload.dtype in FSDP_DTYPES:
        out.append(f"{prefix}.rollout.dtype={FSDP_DTYPES[workload.dtype]}")
    return out


def _rollout(strategy: RLHFStrategy, hardware: Hardware) -> tuple[list[str], list[str]]:
    rollout = strategy.rollout
    prefix = "actor_rollout_ref.rollout"
    found: list[str] = []
    if rollout is None:
        found.append(
            "veRL 0.9 generates with vLLM, SGLang or TensorRT-LLM only (no DeepSpeed hybrid engine, no HF "
            "generate): exported as a colocated vLLM at veRL's gpu_memory_utilization 0.5, whose memory this plan "
            "did not count"
        )
        return [f"{prefix}.name=vllm", f"{prefix}.tensor_model_parallel_size=1"] + _gpus(strategy, hardware), found
    out = [
        f"{prefix}.name={rollout.engine}",
        f"{prefix}.tensor_model_parallel_size={rollout.tensor_parallel}",
        f"{prefix}.enforce_eager={_bool(rollout.enforce_eager)}",
        f"{prefix}.free_cache_engine={_bool(rollout.sleep_level > 0)}",
    ]
    if rollout.gpu_memory_utilization is not None:
        out.append(f"{prefix}.gpu_memory_utilization={rollout.gpu_memory_utilization:g}")
    else:
        found.append("the plan leaves gpu_memory_utilization open (planner solves it); veRL's default 0.5 applies")
    if rollout.sleep_level == 1 and not strategy.actor.lora_rank:
        found.append(
            "veRL puts a colocated vLLM to sleep at level 2 (level 1 only with LoRA adapters), not the plan's level 1"
        )
    if rollout.colocated:
        return out + _gpus(strategy, hardware), found
    out += [
        "trainer.v1.trainer_mode=separate_async",
        "actor_rollout_ref.hybrid_engine=False",
        f"{prefix}.nnodes={hardware.nodes}",
        f"{prefix}.n_gpus_per_node={rollout.engine_gpus}",
    ]
    found.append(
        "veRL runs a rollout pool on its own GPUs only with its asynchronous trainer (separate_async): rollouts "
        "may lag the policy by up to trainer.v1.separate_async.parameter_sync_step steps, unlike the plan's "
        "synchronous step"
    )
    return out + _gpus(strategy, hardware), found


def _gpus(strategy: RLHFStrategy, hardware: Hardware) -> list[str]:
    return [f"trainer.nnodes={hardware.nodes}", f"trainer.n_gpus_per_node={trainer_gpus_per_node(strategy, hardware)}"]


def script(strategy: RLHFStrategy, workload: Workload, hardware: Hardware, more_gaps: tuple[str, ...] = ()) -> Rendered:
    """``run_verl.sh``: the overrides with model and data placeholders, and the gaps as comments (``more_gaps``
    first)."""
    rlhf_only("verl", workload)
    args, own = _build(strategy, workload, hardware)
    found = [*more_gaps, *own]
    wanted = {MODEL_VARS["actor"]: f"the HF id or path of the actor ({workload.model_for('actor').name})"}
    paths = [f"actor_rollout_ref.model.path=${MODEL_VARS['actor']}"]
    if workload.holds_reward_model:
        wanted[MODEL_VARS["reward"]] = f"the HF id or path of the reward model ({workload.model_for('reward').name})"
        paths.append(f"reward.reward_model.model_path=${MODEL_VARS['reward']}")
    wanted.update({"TRAIN_FILES": "the training prompts (parquet)", "VAL_FILES": "the validation prompts (parquet)"})
    paths += ["data.train_files=$TRAIN_FILES", "data.val_files=$VAL_FILES"]
    if workload.has_critic:
        wanted[MODEL_VARS["critic"]] = f"the HF id or path of the critic ({workload.model_for('critic').name})"
        paths.append(f"critic.model.path=${MODEL_VARS['critic']}")
    head = comment_block(
        [
            f"veRL {VERSION} (verl.trainer.main_ppo, FSDP) for this plan: {workload.kind} of {workload.model.name} "
            f"on {hardware.nodes} x {hardware.gpus} GPUs.",
            "Placeholders: the variables below (the script stops when one is unset); the reference is the "
            "actor's model.",
        ]
    )
    text = "#!/usr/bin/env bash\nset -euo pipefail\n" + head + gap_comments(found, "veRL") + "\n"
    text += require_vars(wanted)  # no PYTORCH_CUDA_ALLOC_CONF: veRL sets the allocator itself (gaps)
    text += shell_command(["python3", "-m", "verl.trainer.main_ppo"], [*paths, *args], pairs=False)
    return Rendered("verl", {"script": text}, tuple(found), ("bash run_verl.sh (Ray starts inside veRL)",))


def launch(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> dict[str, Any]:
    """The plan's launch entry: overrides and gaps (for the JSON document's ``launch``)."""
    args, found = _build(strategy, workload, hardware)
    return {"flags": args, "gaps": found}
