"""TRL 1.16: the trainer config of a plan as Python keywords and as YAML (``trl <cmd> --config``), with the
``"auto"`` DeepSpeed config it points at (:mod:`launch.frameworks.hf`).

- ``grpo``: ``GRPOConfig``. A rollout engine is ``use_vllm=True`` with ``vllm_mode="colocate"`` (the engine in
  the training processes: ``vllm_gpu_memory_utilization``, ``vllm_tensor_parallel_size``,
  ``vllm_enable_sleep_mode``) or ``"server"`` (a ``trl vllm-serve`` process on the engine's own GPUs, whose
  command the notes give). Without one TRL generates with transformers' ``generate()``. ``beta`` is the plan's
  KL coefficient (``Workload.kl_coef``; 0 loads no reference: ``GRPOTrainer.__init__`` ``if self.beta == 0.0:
  self.ref_model = None``); a plan made without one holds a reference, kept by ``beta=0.001``. Rule-based rewards
  (no reward model) are the user's ``reward_funcs`` callables.
- ``sft``, ``reward``, ``dpo``: ``SFTConfig``, ``RewardConfig``, ``DPOConfig`` (``max_length`` = the sequence).
- ``ppo`` and ``remax``: TRL 1.16 has no such trainer (``PPOConfig`` is gone; its online RL trainers are GRPO
  and RLOO): one InputError line.

TRL prepares the frozen models (reference, reward) with the trainer's DeepSpeed config: ZeRO-3 when the
trainer is ZeRO-3 (parameters offloaded when the trainer offloads them), else ZeRO-0; other layouts are gaps.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from launch.common import (
    MODEL_VARS,
    Rendered,
    allocator_env,
    allocator_gaps,
    check_rlhf,
    comment_block,
    gap_comments,
    json_text,
    max_out_tokens,
    python_kwargs,
    trainer_gpus_per_node,
    yaml_text,
)
from launch.frameworks.hf import auto_ds_config, setup_notes, single_model_gaps, training_kwargs
from store.errors import InputError
from store.frameworks import reference_through_actor
from store.quantization import NF4_DOUBLE_QUANT
from store.records import Hardware, RLHFStrategy, Strategy, Workload
from store.workload_kinds import traits

VERSION = "1.16.0"
CONFIG_CLASSES = {"grpo": "GRPOConfig", "sft": "SFTConfig", "reward": "RewardConfig", "dpo": "DPOConfig"}
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
GRPO_BETA = 0.001  # the KL coefficient TRL's docs cite (DeepSeek-R1); any beta > 0 loads the reference


def _no_trainer(workload: Workload) -> None:
    if workload.kind not in CONFIG_CLASSES:
        raise InputError(
            f"TRL {VERSION} has no {workload.kind} trainer (PPOConfig was removed; its online RL trainers are GRPO "
            "and RLOO): use --format openrlhf, verl or deepspeed"
        )


def _actor_strategy(strategy: RLHFStrategy) -> Strategy:
    from launch.rlhf_config import trained_model_strategy

    return trained_model_strategy(strategy, "actor")


def _trainer_kwargs(strategy: Strategy, workload: Workload, ds_config_path: str | None) -> dict[str, Any]:
    """The TrainingArguments keywords of :func:`launch.frameworks.hf.training_kwargs` as TRL 1.16 takes them.

    - No ``use_liger_kernel``: TRL 1.16's SFT, DPO, GRPO, KTO and RLOO trainers compute the per-token log-probs
      in chunks themselves (``add_fused_lm_head`` in ``trl/trainer/{sft,dpo,grpo}_trainer.py``) and deprecate the
      flag (``_BaseConfig.use_liger_kernel``, trl/trainer/base_config.py).
    - ``model_init_kwargs`` with the plan's dtype and attention: a trainer given a model name loads it with these
      (``create_model_from_path``), else in float32 (``SFTTrainer.__init__`` docstring) with transformers' default
      attention; the ``trl`` CLI's ModelConfig defaults (``dtype="float32"``) are overridden by them
      (trl/scripts/sft.py ``main``: ``model_init_kwargs.update(training_args.model_init_kwargs)``).
    """
    kwargs = training_kwargs(strategy, workload, ds_config_path)
    kwargs.pop("use_liger_kernel", None)
    kwargs["model_init_kwargs"] = {"dtype": TORCH_DTYPES[workload.dtype], "attn_implementation": workload.attn_impl}
    return kwargs


def model_config(strategy: Strategy | RLHFStrategy, workload: Workload) -> dict[str, Any]:
    """The keys of TRL's ``ModelConfig`` (trl/trainer/model_config.py) that carry the plan's LoRA: the ``trl``
    CLI's parser (``TrlParser`` over ScriptArguments, the config class and ModelConfig) reads them from the same
    YAML, and ``get_peft_config`` (trl/trainer/utils.py) builds the ``LoraConfig``; empty without LoRA. One target
    ``["all-linear"]`` becomes PEFT's ``"all-linear"`` (``ModelConfig.__post_init__``), the layers the cost model
    counts (:mod:`probes.model.lora`)."""
    rank = _actor_strategy(strategy).lora_rank if isinstance(strategy, RLHFStrategy) else strategy.lora_rank
    if not rank:
        return {}
    keys: dict[str, Any] = {
        "use_peft": True,
        "lora_r": rank,
        "lora_target_modules": ["all-linear"],
        "lora_task_type": "SEQ_CLS" if traits(workload.kind).scalar_head else "CAUSAL_LM",
    }
    quantization = "none" if isinstance(strategy, RLHFStrategy) else strategy.quantization
    if quantization == "nf4":  # ModelConfig's bitsandbytes keys (get_quantization_config builds BitsAndBytesConfig)
        assert isinstance(strategy, Strategy)
        keys.update({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "use_bnb_nested_quant": NF4_DOUBLE_QUANT})
        # get_quantization_config (trl/trainer/utils.py, TRL 1.16) takes bnb_4bit_compute_dtype from ModelConfig's
        # top-level dtype (default "float32"), not from model_init_kwargs: the 4-bit layers compute in the plan's
        keys["dtype"] = TORCH_DTYPES[workload.dtype]
        if strategy.zero_stage == 3:  # ZeRO-3 partitions the packed codes stored in the compute dtype
            _trl_loads_on_the_gpu(strategy)
            keys["bnb_4bit_quant_storage"] = TORCH_DTYPES[workload.dtype]
    elif quantization == "int8":
        keys["load_in_8bit"] = True
    return keys


def _trl_loads_on_the_gpu(strategy: Strategy) -> None:
    """TRL loads the model itself (``create_model_from_path``: ``device_map="auto"`` unless told otherwise), so the
    4-bit model lands on the GPUs whole; a ZeRO-3 QLoRA plan with parameter offload loads it on the host and moves
    its quantization constants to the GPU (``store.quantization.qlora_loading``), which only the user's own
    script can do."""
    if strategy.offload_param != "none":
        raise InputError(
            "TRL loads the 4-bit model onto the GPU itself (create_model_from_path), and this ZeRO-3 QLoRA plan "
            "keeps its parameters on the host: export --format hf (or deepspeed) and load it as the note says"
        )


def config_kwargs(
    strategy: Strategy | RLHFStrategy, workload: Workload, hardware: Hardware, ds_config_path: str | None
) -> dict[str, Any]:
    """The keywords of the workload's TRL config class (:data:`CONFIG_CLASSES`) for the plan."""
    _no_trainer(workload)
    if not isinstance(strategy, RLHFStrategy):
        return {**_trainer_kwargs(strategy, workload, ds_config_path), "max_length": workload.seq_len}
    check_rlhf(strategy, workload)
    kwargs = _trainer_kwargs(_actor_strategy(strategy), workload, ds_config_path)
    kwargs.update(
        {
            "num_generations": workload.samples_per_prompt,
            "max_completion_length": workload.gen_len,
            "num_iterations": workload.ppo_epochs,
            "beta": GRPO_BETA if workload.kl_coef is None else workload.kl_coef,
            "use_vllm": strategy.rollout is not None,
        }
    )
    rollout = strategy.rollout
    if rollout is not None:
        kwargs["vllm_mode"] = "colocate" if rollout.colocated else "server"
        if rollout.colocated:
            if rollout.gpu_memory_utilization is not None:
                kwargs["vllm_gpu_memory_utilization"] = rollout.gpu_memory_utilization
            kwargs["vllm_tensor_parallel_size"] = rollout.tensor_parallel
            kwargs["vllm_enable_sleep_mode"] = rollout.sleep_level > 0
            kwargs["vllm_max_model_length"] = max_out_tokens(workload)
    return kwargs


def server_command(strategy: RLHFStrategy, workload: Workload) -> list[str]:
    """``trl vllm-serve`` for a separate engine (the options of TRL's ``ScriptArguments``); [] when colocated."""
    rollout = strategy.rollout
    if rollout is None or rollout.colocated:
        return []
    command = ["trl", "vllm-serve", "--model", "$" + MODEL_VARS["actor"]]
    command += ["--tensor_parallel_size", str(rollout.tensor_parallel)]
    command += ["--data_parallel_size", str(max(1, rollout.engine_gpus // rollout.tensor_parallel))]
    if rollout.gpu_memory_utilization is not None:
        command += ["--gpu_memory_utilization", f"{rollout.gpu_memory_utilization:g}"]
    command += ["--max_model_len", str(max_out_tokens(workload))]
    if rollout.enforce_eager:
        command += ["--enforce_eager", "true"]
    return command


def gaps(strategy: Strategy | RLHFStrategy, workload: Workload, hardware: Hardware) -> list[str]:
    """What TRL's config cannot express of the plan, one sentence each."""
    _no_trainer(workload)
    if not isinstance(strategy, RLHFStrategy):
        return single_model_gaps(strategy, "TRL") + _loss_gaps(strategy, workload)
    found = single_model_gaps(_actor_strategy(strategy), "TRL") + _loss_gaps(_actor_strategy(strategy), workload)
    found += _frozen_gaps(strategy, workload)
    if workload.samples_per_prompt < 2:
        found.append("GRPOConfig refuses num_generations < 2 (GRPO's advantage needs a group); plan with k >= 2")
    found.append(
        f"TRL {VERSION} does not truncate prompts (GRPOConfig has no max_prompt_length): keep the dataset's prompts "
        f"within the planned {workload.prompt_len} tokens"
    )
    if strategy.ema:
        found.append("TRL's GRPOTrainer keeps no EMA copy of the actor")
    rollout = strategy.rollout
    if rollout is None:
        if strategy.hybrid_engine:
            found.append(
                "TRL has no DeepSpeed hybrid engine: it generates with transformers' generate() on the trained model"
            )
        found.append(
            "TRL generates each device's generation batch in one generate() call; the plan's generation_batch "
            f"{strategy.generation_batch} prompts per call has no setting"
        )
    else:
        found += _rollout_gaps(strategy, hardware)
    return found + allocator_gaps(strategy, "TRL", empty_cache=False)


def _loss_gaps(strategy: Strategy, workload: Workload) -> list[str]:
    """TRL 1.16's SFT, DPO and GRPO trainers never hold the (batch, seq, vocab) logits (``add_fused_lm_head``):
    a plan that counts them (``loss="hf"``) holds memory TRL does not spend."""
    if strategy.loss != "hf" or traits(workload.kind).scalar_head:
        return []
    return [
        f"TRL {VERSION}'s {CONFIG_CLASSES[workload.kind][:-6]} trainer computes the per-token log-probs in chunks "
        "(add_fused_lm_head) and never holds the whole logits this plan counts: TRL needs less memory than planned"
    ]


def _frozen_gaps(strategy: RLHFStrategy, workload: Workload) -> list[str]:
    actor = strategy.actor
    stage = 3 if actor.zero_stage == 3 else 0
    offload = "cpu" if stage == 3 and actor.offload_param != "none" else "none"
    found = []
    # a LoRA actor is its own reference, adapters off (store.frameworks.reference_through_actor): no block to match
    own = reference_through_actor("trl", workload.kind, workload.holds_reference, actor.lora_rank)
    held = {"reference": workload.holds_reference and not own, "reward": workload.holds_reward_model}
    for role, block in (("reference", strategy.reference), ("reward", strategy.reward)):
        if held[role] and (block.zero_stage, block.offload) != (stage, offload):
            found.append(
                f"TRL prepares the {role} model with the trainer's DeepSpeed config (ZeRO-{stage}, offload {offload}); "
                f"the plan holds it at ZeRO-{block.zero_stage}, offload {block.offload}"
            )
    return found


def _rollout_gaps(strategy: RLHFStrategy, hardware: Hardware) -> list[str]:
    rollout = strategy.rollout
    assert rollout is not None
    found = []
    if rollout.engine != "vllm":
        found.append(f"TRL generates with vLLM or transformers only; the plan's {rollout.engine} engine becomes vLLM")
    if rollout.colocated:
        if rollout.gpu_memory_utilization is None:
            found.append("the plan leaves gpu_memory_utilization open; TRL's default 0.3 applies")
        if rollout.sleep_level == 1:
            found.append(
                "TRL puts a colocated vLLM to sleep at level 2 (weights dropped, pushed again from the trainer), "
                "not the plan's level 1"
            )
        if rollout.enforce_eager:
            found.append("a colocated vLLM in TRL has no enforce_eager setting (only trl vllm-serve --enforce_eager)")
        if rollout.offload_training:
            found.append(
                "TRL does not offload the DeepSpeed optimizer states during generation (offload_training): they "
                "stay on the GPU beside the engine"
            )
    elif hardware.nodes > 1:
        found.append(
            f"TRL's server mode talks to one vLLM server; the plan puts {rollout.engine_gpus} engine GPUs on each of "
            f"{hardware.nodes} nodes"
        )
    return found


def render(
    strategy: Strategy | RLHFStrategy,
    workload: Workload,
    hardware: Hardware,
    paths: dict[str, str],
    more_gaps: tuple[str, ...] = (),
) -> Rendered:
    """The keywords as a ``.py`` snippet and as YAML, and the ``"auto"`` DeepSpeed config they point at (the gaps,
    ``more_gaps`` first, as comments)."""
    kwargs = config_kwargs(strategy, workload, hardware, paths["ds_config"])
    found = [*more_gaps, *gaps(strategy, workload, hardware)]
    cls = CONFIG_CLASSES[workload.kind]
    if isinstance(strategy, RLHFStrategy):
        actor = _actor_strategy(strategy)
        ds = auto_ds_config(actor, replace(workload, model=workload.model_for("actor")), hardware)
        allocator = actor.allocator if allocator_env(strategy) else "default"  # none beside a sleeping vLLM
        notes = setup_notes(
            replace(actor, allocator=allocator), replace(hardware, gpus=trainer_gpus_per_node(strategy, hardware))
        )
        serve = server_command(strategy, workload)
        if serve:
            notes.insert(0, "start the engine on its own GPUs first: " + " ".join(serve))
        if workload.holds_reward_model:
            notes.append(
                f'the reward model: GRPOTrainer(model="${MODEL_VARS["actor"]}", '
                f'reward_funcs="${MODEL_VARS["reward"]}", args=config, train_dataset=...)'
            )
        else:
            notes.append(
                f'rule-based rewards, no reward model: GRPOTrainer(model="${MODEL_VARS["actor"]}", '
                "reward_funcs=[your_reward(completions, **kwargs) -> list[float]], args=config, train_dataset=...)"
            )
    else:
        ds = auto_ds_config(strategy, workload, hardware)
        notes = setup_notes(strategy, hardware, workload.dtype)
    head = [
        f"TRL {VERSION} {cls} for this plan: {workload.kind} of {workload.model.name} on {hardware.nodes} x "
        f"{hardware.gpus} GPUs; {paths['ds_config']} holds the DeepSpeed config it points at.",
        *notes,
    ]
    peft = model_config(strategy, workload)
    snippet = comment_block(head) + gap_comments(found, "TRL") + f"\nfrom trl import {cls}\n\n"
    snippet += python_kwargs("config_kwargs", kwargs) + f"config = {cls}(**config_kwargs)\n"
    if peft:
        snippet += (
            "\nfrom trl import ModelConfig, get_peft_config\n\n"
            + python_kwargs("model_kwargs", peft)
            + "peft_config = get_peft_config(ModelConfig(**model_kwargs))  # pass peft_config= to the trainer\n"
        )
    env = allocator_env(strategy)
    document = {**kwargs, **peft, **({"env": env} if env else {})}
    yaml_doc = comment_block(head) + gap_comments(found, "TRL") + yaml_text(document)
    files = {"kwargs": snippet, "yaml": yaml_doc, "ds_config": json_text(ds)}
    return Rendered("trl", files, tuple(found), tuple(notes))


def launch(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> dict[str, Any]:
    """``trl grpo`` options for the JSON document's ``launch`` (GRPO only; add --deepspeed FILE)."""
    if workload.kind not in CONFIG_CLASSES or not traits(workload.kind).rlhf:  # TRL: GRPO is its RLHF trainer
        return {"flags": [], "gaps": [f"TRL {VERSION} has no {workload.kind} trainer"]}
    kwargs = {**config_kwargs(strategy, workload, hardware, None), **model_config(strategy, workload)}
    kwargs.pop("output_dir")
    flags: list[str] = []
    for key, value in kwargs.items():
        if isinstance(value, list):
            flags += [f"--{key}", *(str(v) for v in value)]
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if isinstance(value, dict):
            text = json.dumps(value, separators=(",", ":"))
        flags += [f"--{key}", text]
    return {"flags": flags, "gaps": gaps(strategy, workload, hardware)}
