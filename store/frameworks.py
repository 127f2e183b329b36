"""The programs a plan can be made for (``--framework``), the workloads each runs, and their own settings.

A plan is made for the program that will run it: memplan's own DeepSpeed loop (``deepspeed``, the default:
today's predictions), DeepSpeed-Chat, transformers' ``Trainer`` (``hf``), an accelerate loop, TRL's trainers,
OpenRLHF or veRL. The cost model follows each one's code where it differs (``search.frameworks`` lists the
differences). Plain data, no project imports beyond ``store``: the cost model (search), the exports (probes)
and the CLI (planner) read the same table.
"""

from __future__ import annotations

from typing import Any

from store.ds_buckets import ZeroBuckets, buckets_from_zero_config
from store.errors import InputError
from store.records import RLHF_WORKLOADS, SINGLE_MODEL_WORKLOADS

DEFAULT_FRAMEWORK = "deepspeed"
FRAMEWORKS: tuple[str, ...] = ("deepspeed", "hf", "accelerate", "trl", "openrlhf", "verl", "deepspeed-chat")
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
# train_ppo_ray's --ds.attn_implementation default (openrlhf/cli/train_ppo_ray.py, 0.11.2)
DEFAULT_ATTENTION: dict[str, str] = {"openrlhf": "flash_attention_2"}


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
