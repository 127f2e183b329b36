"""Where each program (``--framework``) puts the models of an RLHF step and how it generates: the rules the search
obeys so that a plan is one the framework runs as planned (pure functions of the plan's own blocks).

Each rule is read from the framework's source at its pinned release (``store.frameworks.VERSIONS``); the exports
in ``launch/frameworks/`` name the same rules as gaps for a plan made for another program.

- Frozen models (reference, reward): which ZeRO stage and offload the framework builds them with, given the
  trained models' layouts (:func:`frozen_blocks_run`).
- Trained models: which layouts of actor and critic the framework's flags can say (:func:`trained_refusal`).
- Generation: what produces the rollout (:data:`GENERATIONS_RUN`): DeepSpeed's hybrid engine
  (``hybrid-engine``), the model's own ``generate()`` (``hf-generate``), a vLLM or an SGLang engine.
"""

from __future__ import annotations

from store.records import FrozenModelStrategy, TrainedModelStrategy

GENERATION_FAMILIES: tuple[str, ...] = ("hybrid-engine", "hf-generate", "vllm", "sglang")
# What generates the rollout in each program. A program not listed is memplan's own loop: any of them.
# - deepspeed-chat: dschat/rlhf/ppo_trainer.py ``DeepSpeedPPOTrainer._generate_sequence`` calls
#   ``self.actor_model.module.generate``, through DeepSpeed's hybrid engine with ``--enable_hybrid_engine``
#   (dschat/rlhf/rlhf_engine.py ``_init_actor``); it has no vLLM or SGLang engine.
# - trl: TRL 1.16 ``GRPOTrainer`` generates with vLLM (``use_vllm``) or transformers' ``generate()`` under
#   ``unwrap_model_for_generation`` (trl/trainer/grpo_trainer.py); no DeepSpeed hybrid engine.
# - openrlhf: OpenRLHF 0.11.2 ``train_ppo_ray`` samples through its vLLM engines (``create_vllm_engines``,
#   openrlhf/trainer/ray/vllm_engine.py; ``SamplesGenerator``): no generate() fallback, no hybrid engine.
# - verl: veRL 0.9.1 ``actor_rollout_ref.rollout.name`` is vllm or sglang (its async rollout servers); no
#   DeepSpeed hybrid engine, no HF rollout.
GENERATIONS_RUN: dict[str, tuple[str, ...]] = {
    "deepspeed-chat": ("hybrid-engine", "hf-generate"),
    "trl": ("hf-generate", "vllm"),
    "openrlhf": ("vllm",),
    "verl": ("vllm", "sglang"),
}

_WHOLE = FrozenModelStrategy(0, "none")
_SHARDED = FrozenModelStrategy(3, "none")
_OFFLOADED = FrozenModelStrategy(3, "cpu")


def generations_run(framework: str) -> tuple[str, ...]:
    """The generation families (:data:`GENERATION_FAMILIES`) ``framework`` runs a rollout with."""
    return GENERATIONS_RUN.get(framework, GENERATION_FAMILIES)


def generation_family(hybrid_engine: bool, engine: str | None) -> str:
    """The family of one (hybrid_engine, rollout engine name or None) generation option."""
    if engine is not None:
        return engine
    return "hybrid-engine" if hybrid_engine else "hf-generate"


def openrlhf_frozen(actor: TrainedModelStrategy) -> tuple[FrozenModelStrategy, ...]:
    """OpenRLHF 0.11.2's frozen models (reference and reward alike).

    ``DeepspeedStrategy.get_ds_eval_config`` (openrlhf/utils/deepspeed/deepspeed.py) builds them with
    ``stage=self.stage if self.stage == 3 else 0``, ``self.stage`` being ``--ds.zero_stage`` (the actor's), and
    ``offload=`` the model's ``--ref.offload`` / ``--reward.offload``, which ``get_eval_ds_config``
    (openrlhf/utils/deepspeed/deepspeed_utils.py) writes as ``offload_param``: DeepSpeed offloads parameters
    under ZeRO-3 only (``deepspeed/runtime/zero/stage3.py``), so at stage 0 the model sits whole on every GPU."""
    return (_SHARDED, _OFFLOADED) if actor.zero_stage == 3 else (_WHOLE,)


def trl_frozen(actor: TrainedModelStrategy) -> tuple[FrozenModelStrategy, ...]:
    """TRL 1.16's frozen models (reference and reward alike).

    ``prepare_deepspeed`` (trl/models/utils.py) deep-copies the trainer's DeepSpeed config
    (``accelerator.state.deepspeed_plugin.deepspeed_config``) and sets ``zero_optimization.stage`` to 0 unless it
    is 3 ("If ZeRO-3 is used, we shard both the active and reference model. Otherwise, we assume the reference
    model fits in memory and is initialized on each device with ZeRO disabled"); under ZeRO-3 the copied config
    keeps the trainer's ``offload_param``."""
    if actor.zero_stage != 3:
        return (_WHOLE,)
    return (_OFFLOADED if actor.offload_param != "none" else _SHARDED,)


def deepspeed_chat_frozen(
    role: str, actor: TrainedModelStrategy, critic: TrainedModelStrategy | None
) -> tuple[FrozenModelStrategy, ...]:
    """DeepSpeed-Chat's frozen models (dschat/rlhf/rlhf_engine.py, ``DeepSpeedRLHFEngine``).

    ``_init_ref``: ``zero_stage = self.args.actor_zero_stage``, 0 unless 3, with
    ``get_eval_ds_config(self.args.offload_reference_model, ...)`` (its own flag, either way under ZeRO-3).
    ``_init_reward``: ``zero_stage = self.args.critic_zero_stage``, 0 unless 3, with
    ``get_eval_ds_config(offload=self.args.offload, ...)``: offloaded exactly when ``--offload`` is given, which
    offloads the trained models' optimizers (dschat/utils/ds_utils.py ``get_train_ds_config``)."""
    if role == "reference":
        return (_SHARDED, _OFFLOADED) if actor.zero_stage == 3 else (_WHOLE,)
    trained = critic if critic is not None else actor
    if trained.zero_stage != 3:
        return (_WHOLE,)
    offload = actor.offload_optimizer != "none" or (critic is not None and critic.offload_optimizer != "none")
    return (_OFFLOADED if offload else _SHARDED,)


def verl_frozen(role: str) -> tuple[FrozenModelStrategy, ...] | None:
    """veRL 0.9.1: the reward model is served by an inference engine, one whole copy per GPU
    (``reward.reward_model.rollout``, ``RewardModelManager._initialize_llm_servers`` in
    verl/experimental/reward_loop/reward_model.py at ``tensor_model_parallel_size=1``, as
    :func:`launch.frameworks.verl.reward_engine` exports it): ZeRO-0 is its layout. The reference is an FSDP worker
    (``actor_rollout_ref.ref.fsdp_config``: ``param_offload``, ``fsdp_size=1`` for a whole copy): any block."""
    return (_WHOLE,) if role == "reward" else None


def frozen_blocks_run(
    framework: str, role: str, actor: TrainedModelStrategy, critic: TrainedModelStrategy | None
) -> tuple[FrozenModelStrategy, ...] | None:
    """The blocks ``framework`` holds its frozen ``role`` ("reference" or "reward") in beside these trained
    layouts; None where it runs any block the plan asks for (memplan's own loop, veRL's reference)."""
    if framework == "openrlhf":
        return openrlhf_frozen(actor)
    if framework == "trl":
        return trl_frozen(actor)
    if framework == "deepspeed-chat":
        return deepspeed_chat_frozen(role, actor, critic)
    if framework == "verl":
        return verl_frozen(role)
    return None


def trained_refusal(framework: str, actor: TrainedModelStrategy, critic: TrainedModelStrategy | None) -> str | None:
    """Why ``framework`` cannot run these trained layouts as planned (None: it can).

    - OpenRLHF 0.11.2 (openrlhf/cli/train_ppo_ray.py): ``--ds.zero_stage``, ``--actor.gradient_checkpointing``'s
      one switch and ``--ds.adam_offload`` hold for actor and critic alike, and ``get_train_ds_config``
      (openrlhf/utils/deepspeed/deepspeed_utils.py) writes ``offload_param`` ``none`` and ``offload_optimizer``
      ``cpu`` or ``none``: no parameter offload, no NVMe.
    - DeepSpeed-Chat (dschat/utils/ds_utils.py ``get_train_ds_config``): ``--offload`` is one flag for the
      optimizers of actor and critic, to the CPU, and offloads a ZeRO-3 model's parameters with them.
    """
    models = [m for m in (actor, critic) if m is not None]
    if framework == "openrlhf":
        if any(m.offload_param != "none" or m.offload_optimizer == "nvme" for m in models):
            return "OpenRLHF offloads only Adam states, to the CPU (--ds.adam_offload)"
        if critic is not None and (
            critic.zero_stage != actor.zero_stage
            or critic.gradient_checkpointing != actor.gradient_checkpointing
            or (critic.offload_optimizer == "none") != (actor.offload_optimizer == "none")
        ):
            return "OpenRLHF's ZeRO stage, checkpointing and Adam offload are one setting for actor and critic"
    if framework == "deepspeed-chat":
        offload = {m.offload_optimizer != "none" for m in models}
        if len(offload) > 1 or any("nvme" in (m.offload_optimizer, m.offload_param) for m in models):
            return "DeepSpeed-Chat's --offload moves both optimizers to the CPU, or neither"
        if True in offload and any(m.zero_stage == 3 and m.offload_param == "none" for m in models):
            return "DeepSpeed-Chat's --offload also offloads a ZeRO-3 model's parameters"
    return None


def frozen_block_as_run(
    framework: str,
    role: str,
    block: FrozenModelStrategy,
    actor: TrainedModelStrategy,
    critic: TrainedModelStrategy | None,
) -> FrozenModelStrategy | None:
    """The block ``framework`` would build its frozen ``role`` with where a plan asks for ``block`` and the
    framework cannot say it (:func:`frozen_blocks_run`): the one of its blocks with the same offload, else its
    first; None where it runs ``block`` as asked."""
    runs = frozen_blocks_run(framework, role, actor, critic)
    if runs is None or block in runs:
        return None
    same_offload = [b for b in runs if b.offload == block.offload]
    return (same_offload or list(runs))[0]
