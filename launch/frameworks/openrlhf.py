"""OpenRLHF's PPO trainer (``openrlhf.cli.train_ppo_ray``): the flags that run a plan, what they cannot say,
and the launch script ``planner export --format openrlhf`` writes.

Two spellings of the same options (``tests/data/framework_names.json`` holds both, extracted from the real
argparse by ``scripts/extract_framework_names.py``):

- ``"dotted"``: OpenRLHF 0.10.2 and later, checked against 0.11.2 (``--ds.zero_stage``, ``--vllm.num_engines``,
  ``--train.colocate_all``, ...). The export writes this style.
- ``"classic"``: the flat names of 0.9.1.post1 and before (``--zero_stage``, ``--vllm_num_engines``,
  ``--colocate_all_models``, ...), the default of :func:`flags` for its older callers.

OpenRLHF has one setting for both trained models where the plan has two: ``--zero_stage`` is the actor's
stage (the critic trains at the same stage), ``--adam_offload`` is given when either offloads its optimizer,
gradient checkpointing and the LoRA rank are the actor's. The frozen models take ZeRO-3 exactly when the
trained ones do. Batch sizes: ``rollout batch`` = the workload's global batch of prompts, ``train batch`` =
micro_batch x grad_accum x training GPUs (sequences), the rollout micro-batch (scoring forwards) =
generation_batch x samples_per_prompt sequences. GRPO is ``group_norm`` with ``n_samples_per_prompt``; OpenRLHF
has no ReMax estimator, so ReMax gets ``reinforce`` (the same models, no greedy baseline).

The rollout block (``store.rollout``): a colocated engine is ``colocate_all`` with one vLLM engine per
``tensor_parallel`` GPUs of every GPU, ``vllm enable_sleep`` for sleep level 1 or 2 and ``ds enable_sleep``
for ``offload_training``; a separate engine gets ``engine_gpus`` GPUs of each node and the DeepSpeed models
the others (OpenRLHF colocates actor with reference, and critic with reward, as two groups then).
"""

from __future__ import annotations

import json
from typing import Any

from launch.common import (
    DATA_VAR,
    MODEL_VARS,
    Rendered,
    allocator_env,
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
from store.ds_buckets import ZeroBuckets
from store.ds_defaults import buckets_of
from store.errors import InputError
from store.frameworks import openrlhf_buckets  # one source: the cost model runs these too
from store.records import Hardware, RLHFStrategy, Workload
from store.workload_kinds import traits

STYLES: tuple[str, ...] = ("classic", "dotted")
DOTTED_VERSION = "0.11.2"
CLASSIC_VERSION = "0.9.1.post1"
# The option of each setting in both spellings: (classic, dotted).
_NAMES: dict[str, tuple[str, str]] = {
    "zero_stage": ("--zero_stage", "--ds.zero_stage"),
    "adam_offload": ("--adam_offload", "--ds.adam_offload"),
    "gradient_checkpointing": ("--gradient_checkpointing", "--actor.gradient_checkpointing_enable"),
    "micro_train": ("--micro_train_batch_size", "--train.micro_batch_size"),
    "train_batch": ("--train_batch_size", "--train.batch_size"),
    "micro_rollout": ("--micro_rollout_batch_size", "--rollout.micro_batch_size"),
    "rollout_batch": ("--rollout_batch_size", "--rollout.batch_size"),
    "max_epochs": ("--max_epochs", "--train.max_epochs"),
    "lora_rank": ("--lora_rank", "--ds.lora.rank"),
    "ema": ("--enable_ema", "--train.enable_ema"),
    "estimator": ("--advantage_estimator", "--algo.advantage.estimator"),
    "n_samples": ("--n_samples_per_prompt", "--rollout.n_samples_per_prompt"),
    "colocate_all": ("--colocate_all_models", "--train.colocate_all"),
    "colocate_actor_ref": ("--colocate_actor_ref", "--train.colocate_actor_ref"),
    "colocate_critic_reward": ("--colocate_critic_reward", "--train.colocate_critic_reward"),
    "vllm_engines": ("--vllm_num_engines", "--vllm.num_engines"),
    "vllm_tp": ("--vllm_tensor_parallel_size", "--vllm.tensor_parallel_size"),
    "vllm_util": ("--vllm_gpu_memory_utilization", "--vllm.gpu_memory_utilization"),
    "vllm_sleep": ("--vllm_enable_sleep", "--vllm.enable_sleep"),
    "ds_sleep": ("--deepspeed_enable_sleep", "--ds.enable_sleep"),
    "enforce_eager": ("--enforce_eager", "--vllm.enforce_eager"),
    "kl_coef": ("--init_kl_coef", "--algo.kl.init_coef"),
}
# Rule-based rewards: train_ppo_ray takes ``--reward.remote_url`` (0.9: ``--remote_rm_url``) instead of a reward
# model; a path ending in ``.py`` is loaded as the user's ``reward_func(queries, prompts, labels)``
# (openrlhf/utils/agent.py, 0.11.2: ``if self.reward_endpoints[0].endswith(".py")``), and ``train`` builds no
# RewardModelActor group ``if not args.reward.remote_url`` fails (openrlhf/cli/train_ppo_ray.py).
REWARD_FUNC_VAR = "REWARD_FUNC"
ESTIMATORS = {"ppo": None, "grpo": "group_norm", "remax": "reinforce"}
ZERO12_KEYS = ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients")
ZERO3_KEYS = (
    "reduce_bucket_size",
    "overlap_comm",
    "contiguous_gradients",
    "prefetch_bucket_size",
    "param_persistence_threshold",
    "max_live_parameters",
    "max_reuse_distance",
    "sub_group_size",
)
RAY_DASHBOARD = "http://127.0.0.1:8265"


def _check_style(style: str) -> bool:
    if style not in STYLES:
        raise InputError(f"OpenRLHF flag style must be one of {', '.join(STYLES)}, not {style!r}")
    return style == "dotted"


def _role_count(role: str, what: str, dotted: bool) -> str:
    return f"--{role}.{what}" if dotted else f"--{role}_{what}"


def flags(strategy: RLHFStrategy, workload: Workload, hardware: Hardware, style: str = "classic") -> list[str]:
    """The flags of ``train_ppo_ray`` for the plan (model, data and logging flags not included)."""
    dotted = _check_style(style)
    check_rlhf(strategy, workload)

    def name(key: str) -> str:
        return _NAMES[key][1 if dotted else 0]

    actor, critic = strategy.actor, strategy.critic if workload.has_critic else None
    adam_offload = actor.offload_optimizer != "none" or (critic is not None and critic.offload_optimizer != "none")
    out = [name("zero_stage"), str(actor.zero_stage)]
    out += [name("adam_offload")] if adam_offload else []
    out += [name("gradient_checkpointing")] if actor.gradient_checkpointing else []
    frozen = _frozen_roles(strategy, workload)
    if dotted:
        out += ["--ref.offload"] if frozen.get("reference", "none") != "none" else []
        out += ["--reward.offload"] if frozen.get("reward", "none") != "none" else []
    elif any(offload != "none" for offload in frozen.values()):
        out.append("--ref_reward_offload")
    scoring = strategy.generation_batch * (workload.samples_per_prompt if dotted else 1)
    for key, value in (
        ("micro_train", strategy.micro_batch),
        ("train_batch", train_sequences(strategy, hardware)),
        ("micro_rollout", scoring),
        ("rollout_batch", workload.global_batch),
        ("max_epochs", workload.ppo_epochs),
    ):
        out += [name(key), str(value)]
    if dotted:
        out += ["--data.max_len", str(max_out_tokens(workload)), "--rollout.max_new_tokens", str(workload.gen_len)]
        out += ["--ds.param_dtype", workload.dtype] if workload.dtype in ("bf16", "fp16") else []
        # train_ppo_ray's --ds.attn_implementation defaults to flash_attention_2: the plan's attention is explicit
        out += ["--ds.attn_implementation", workload.attn_impl]
        out += ["--ds.overlap_comm"] if planned_buckets(strategy, workload).overlap_comm else []
    else:
        out += ["--prompt_max_len", str(workload.prompt_len), "--generate_max_len", str(workload.gen_len)]
        out += ["--bf16"] if workload.dtype == "bf16" else []
    out += [name("lora_rank"), str(actor.lora_rank)] if actor.lora_rank else []
    out += [name("ema")] if strategy.ema else []
    estimator = ESTIMATORS[workload.kind]
    out += [name("estimator"), estimator] if estimator else []
    # the plan's KL coefficient (None: the plan holds a reference at OpenRLHF's own default 0.01, which loads one);
    # train_ppo_ray builds the ReferenceModelActor group only ``if args.algo.kl.init_coef > 0``
    out += [name("kl_coef"), f"{workload.kl_coef:g}"] if workload.kl_coef is not None else []
    if traits(workload.kind).group_samples or workload.samples_per_prompt > 1:
        out += [name("n_samples"), str(workload.samples_per_prompt)]
    return out + _placement(strategy, workload, hardware, dotted)


def _frozen_roles(strategy: RLHFStrategy, workload: Workload) -> dict[str, str]:
    """The offload of each frozen model the plan holds (none at a KL coefficient of 0, none with rule-based
    rewards)."""
    held = {"reference": workload.holds_reference, "reward": workload.holds_reward_model}
    blocks = {"reference": strategy.reference, "reward": strategy.reward}
    return {role: blocks[role].offload for role in blocks if held[role]}


def planned_buckets(strategy: RLHFStrategy, workload: Workload) -> ZeroBuckets:
    """The ZeRO buckets the plan's actor config holds (memplan's for its model and stage)."""
    return buckets_of(None, workload.model_for("actor"), strategy.actor.zero_stage)


def _bucket_gaps(strategy: RLHFStrategy, workload: Workload) -> list[str]:
    planned = planned_buckets(strategy, workload)
    hidden = workload.model_for("actor").hidden_size
    theirs = openrlhf_buckets(strategy.actor.zero_stage, planned.overlap_comm, hidden)
    keys = ZERO3_KEYS if strategy.actor.zero_stage == 3 else ZERO12_KEYS
    differ = [key for key in keys if getattr(planned, key) != getattr(theirs, key)]
    if not differ:
        return []
    return [
        "OpenRLHF builds its own DeepSpeed config (get_train_ds_config) and has no flag for the ZeRO buckets: "
        "DeepSpeed runs it with "
        + ", ".join(f"{key} {getattr(theirs, key)}" for key in differ)
        + " where the plan has "
        + ", ".join(f"{getattr(planned, key)}" for key in differ)
    ]


def _placement(strategy: RLHFStrategy, workload: Workload, hardware: Hardware, dotted: bool) -> list[str]:
    """Where the models and the vLLM engines run: colocation switches, per-role GPU counts, engine flags."""
    names = {key: pair[1 if dotted else 0] for key, pair in _NAMES.items()}
    rollout = strategy.rollout
    roles = ["actor", "critic", "ref", "reward"] if workload.has_critic else ["actor", "ref", "reward"]
    held = {"ref": workload.holds_reference, "reward": workload.holds_reward_model}
    roles = [role for role in roles if held.get(role, True)]  # no group for a model OpenRLHF does not build
    if rollout is None:
        if not dotted:
            return []  # OpenRLHF up to 0.9 generates with the actor's own generate() without vLLM engines
        out = [names["colocate_all"]]
    elif rollout.colocated:
        out = [names["colocate_all"]]
    else:
        out = [names["colocate_actor_ref"]]
        out += [names["colocate_critic_reward"]] if workload.has_critic and workload.holds_reward_model else []
    gpus = trainer_gpus_per_node(strategy, hardware)
    for role in roles:
        out += [_role_count(role, "num_nodes", dotted), str(hardware.nodes)]
        out += [_role_count(role, "num_gpus_per_node", dotted), str(gpus)]
    if rollout is None:
        return out
    engine_gpus = hardware.gpus if rollout.colocated else rollout.engine_gpus
    out += [names["vllm_engines"], str(max(1, engine_gpus * hardware.nodes // rollout.tensor_parallel))]
    out += [names["vllm_tp"], str(rollout.tensor_parallel)]
    if rollout.gpu_memory_utilization is not None:
        out += [names["vllm_util"], f"{rollout.gpu_memory_utilization:g}"]
    out += [names["vllm_sleep"]] if rollout.sleep_level else []
    out += [names["ds_sleep"]] if rollout.offload_training else []
    out += [names["enforce_eager"]] if rollout.enforce_eager else []
    return out


def gaps(strategy: RLHFStrategy, workload: Workload, hardware: Hardware, style: str = "classic") -> list[str]:
    """What of the plan :func:`flags` cannot express, one sentence each (empty: nothing)."""
    dotted = _check_style(style)
    check_rlhf(strategy, workload)
    actor, critic = strategy.actor, strategy.critic if workload.has_critic else None
    out: list[str] = []
    if critic is not None:
        for knob, label in (
            ("zero_stage", "--zero_stage"),
            ("gradient_checkpointing", "--gradient_checkpointing"),
            ("lora_rank", "--lora_rank"),
        ):
            if getattr(critic, knob) != getattr(actor, knob):
                out.append(f"OpenRLHF's {label} is one setting for actor and critic; the strategy's critic differs")
        if (actor.offload_optimizer == "none") != (critic.offload_optimizer == "none"):
            out.append("--adam_offload offloads the optimizer of both actor and critic; the strategy offloads one")
    for role, block in (("actor", actor), ("critic", critic)):
        if block is None:
            continue
        if block.offload_param != "none":
            out.append(f"OpenRLHF cannot offload the {role}'s parameters (only Adam states, --adam_offload)")
        if block.offload_optimizer == "nvme":
            out.append(f"OpenRLHF offloads the {role}'s optimizer to the CPU only, not NVMe")
    frozen_stage = 3 if actor.zero_stage == 3 else 0
    held = {"reference": workload.holds_reference, "reward": workload.holds_reward_model}
    for role, frozen in (("reference", strategy.reference), ("reward", strategy.reward)):
        if held[role] and frozen.zero_stage != frozen_stage:
            out.append(
                f"OpenRLHF holds the {role} model at ZeRO-{frozen_stage} (ZeRO-3 exactly when --zero_stage is 3); "
                f"the strategy asks for ZeRO-{frozen.zero_stage}"
            )
    if not dotted and len(set(_frozen_roles(strategy, workload).values())) > 1:
        out.append("--ref_reward_offload offloads reference and reward together; the strategy offloads one")
    if not dotted and workload.dtype == "fp16":
        out.append("classic OpenRLHF has --bf16 only (else fp32); fp16 cannot be asked for")
    if dotted and workload.dtype == "fp32":
        out.append("OpenRLHF 0.11's --ds.param_dtype takes bf16 or fp16; fp32 cannot be asked for")
    if strategy.hybrid_engine:
        out.append(
            "OpenRLHF has no DeepSpeed hybrid engine: it generates with the actor's own generate() "
            "(classic) or with vLLM engines (Ray)"
        )
    if traits(workload.kind).greedy_baseline:
        out.append(
            "OpenRLHF has no ReMax estimator; --advantage_estimator reinforce runs the same models without "
            "ReMax's greedy-baseline generation (one rollout per prompt, not two)"
        )
    out += _bucket_gaps(strategy, workload) if dotted else []
    return out + _rollout_gaps(strategy, workload, hardware, dotted) + allocator_gaps(strategy, "OpenRLHF")


def _rollout_gaps(strategy: RLHFStrategy, workload: Workload, hardware: Hardware, dotted: bool) -> list[str]:
    rollout = strategy.rollout
    if rollout is None:
        if dotted:
            return [
                "OpenRLHF 0.11 generates with vLLM engines only: add --vllm.num_engines N and "
                "--vllm.gpu_memory_utilization U yourself (their memory is not in this plan), or plan with a "
                "vLLM rollout (strategy rollout block)"
            ]
        return []
    out: list[str] = []
    if rollout.engine != "vllm":
        out.append(f"OpenRLHF runs vLLM engines only; the plan's {rollout.engine} engine becomes vLLM")
    if rollout.gpu_memory_utilization is None:
        out.append(
            "the plan leaves gpu_memory_utilization open (planner solves it); OpenRLHF's default 0.95 would take "
            "the whole GPU: set --vllm.gpu_memory_utilization"
        )
    if rollout.sleep_level == 2:
        out.append(
            "OpenRLHF puts vLLM to sleep at level 1 (the weights are kept in host memory), not the plan's level 2: "
            "each engine needs host memory for a copy of its weights"
        )
    engine_gpus = hardware.gpus if rollout.colocated else rollout.engine_gpus
    if (engine_gpus * hardware.nodes) % rollout.tensor_parallel:
        out.append(
            f"tensor_parallel {rollout.tensor_parallel} does not divide the {engine_gpus * hardware.nodes} engine "
            "GPUs; OpenRLHF needs num_engines x tensor_parallel_size = the actor's GPUs"
        )
    if not rollout.colocated:
        groups = "actor + reference and critic + reward" if workload.has_critic else "actor + reference and reward"
        out.append(
            "OpenRLHF shares GPUs among all DeepSpeed models only with colocate_all, which also puts the vLLM "
            f"engines there; with the engine on its own GPUs it colocates {groups} as separate groups, each on "
            f"{trainer_gpus_per_node(strategy, hardware)} GPUs per node (Ray asks for more GPUs than the node has)"
        )
    return out


def script(strategy: RLHFStrategy, workload: Workload, hardware: Hardware, more_gaps: tuple[str, ...] = ()) -> Rendered:
    """``run_openrlhf.sh``: the 0.11 flags with the model and data placeholders, and the gaps as comments
    (``more_gaps`` first)."""
    rlhf_only("openrlhf", workload)
    found = [*more_gaps, *gaps(strategy, workload, hardware, style="dotted")]
    models = {"--actor.model_name_or_path": "$" + MODEL_VARS["actor"]}
    wanted = {MODEL_VARS["actor"]: f"the HF id or path of the actor ({workload.model_for('actor').name})"}
    if workload.holds_reward_model:
        models["--reward.model_name_or_path"] = "$" + MODEL_VARS["reward"]
        wanted[MODEL_VARS["reward"]] = f"the HF id or path of the reward model ({workload.model_for('reward').name})"
    else:  # rule-based rewards: the user's reward_func in a Python file, no reward model
        models["--reward.remote_url"] = "$" + REWARD_FUNC_VAR
        wanted[REWARD_FUNC_VAR] = "a .py file defining reward_func(queries, prompts, labels) (rule-based rewards)"
    if workload.has_critic:
        models["--critic.model_name_or_path"] = "$" + MODEL_VARS["critic"]
        wanted[MODEL_VARS["critic"]] = f"the HF id or path of the critic ({workload.model_for('critic').name})"
    wanted[DATA_VAR] = "the prompt dataset (HF name or path)"
    args: list[str] = []
    for option, value in models.items():
        args += [option, value]
    args += ["--data.prompt_dataset", "$" + DATA_VAR, *flags(strategy, workload, hardware, style="dotted")]
    head = comment_block(
        [
            f"OpenRLHF {DOTTED_VERSION} (openrlhf.cli.train_ppo_ray) for this plan: {workload.kind} of "
            f"{workload.model.name} on {hardware.nodes} x {hardware.gpus} GPUs.",
            "Placeholders: the variables below (the script stops when one is unset). Start Ray first (ray start "
            f"--head); the job goes to RAY_ADDRESS (default {RAY_DASHBOARD}); the reference is the actor's model.",
        ]
    )
    text = "#!/usr/bin/env bash\nset -euo pipefail\n" + head + gap_comments(found, "OpenRLHF") + "\n"
    text += require_vars(wanted) + f'export RAY_ADDRESS="${{RAY_ADDRESS:-{RAY_DASHBOARD}}}"\n'
    text += shell_command(submit_command(strategy), args)
    return Rendered("openrlhf", {"script": text}, tuple(found), ("bash run_openrlhf.sh on the Ray head node",))


def submit_command(strategy: RLHFStrategy) -> list[str]:
    """``ray job submit`` of ``train_ppo_ray`` with the plan's environment in the job's ``runtime_env``.

    ``train_ppo_ray.train`` calls ``ray.init`` with a runtime_env of its own (three variables) only when Ray is not
    initialized, and the workers of a running cluster do not inherit the driver's shell: an ``export`` before
    ``python3 -m openrlhf.cli.train_ppo_ray`` never reaches the trainers. A job's ``--runtime-env-json`` reaches
    every actor of the job (and takes precedence over the driver's ``ray.init(runtime_env=...)``)."""
    command = ["ray", "job", "submit"]
    env = allocator_env(strategy)
    if env:
        command += ["--runtime-env-json", json.dumps({"env_vars": env}, separators=(",", ":"))]
    return [*command, "--", "python3", "-m", "openrlhf.cli.train_ppo_ray"]


def launch(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> dict[str, Any]:
    """The plan's launch entry: 0.11 flags and gaps (for the JSON document's ``launch``)."""
    return {
        "flags": flags(strategy, workload, hardware, style="dotted"),
        "gaps": gaps(strategy, workload, hardware, style="dotted"),
    }
