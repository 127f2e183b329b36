"""What the cost model does differently for each program a plan is made for (``--framework``), in words.

One entry per aspect in which a framework's code departs from memplan's own DeepSpeed loop, each read from
that framework's source at its pinned version (``store.frameworks.VERSIONS``) and modelled where cited:

- ``lm_head``: TRL 1.16's SFT, DPO and GRPO trainers score tokens through a fused, tiled log-prob head
  (``trl/trainer/utils.py`` ``add_fused_lm_head``, ``trl/kernels/chunked_logprob.py``) and never hold the
  ``(batch, seq, vocab)`` logits (:mod:`search.model.fused_head`); everywhere else the model's logits and
  transformers' fp32 loss over them.
- ``dpo_reference``: TRL's ``DPOTrainer._compute_loss`` runs the reference forward after the policy's, beside
  its saved activations; memplan's own loop before it.
- ``sft_output``: DeepSpeed-Chat's step 1 keeps the model output (its logits) through ``model.backward(loss)``
  (``step1_supervised_finetuning/main.py``); the Trainer, TRL and memplan's own loop keep only the loss.
- ``zero_buckets``: OpenRLHF 0.11.2 builds its own DeepSpeed config (``get_train_ds_config``: ``"auto"``
  buckets, which DeepSpeed replaces by its 5e8-element defaults); everywhere else the exported config's.
- ``frozen_buckets``: OpenRLHF's frozen models (reference, reward) run ``get_eval_ds_config``: ZeRO-3 exactly
  when the trained models do, DeepSpeed's 5e7-element prefetch bucket where memplan's config holds 0.9 hidden^2
  (``store.frameworks.openrlhf_eval_buckets``; the frozen forward gathers that much ahead).
- ``dropout``: TRL's DPO and reward trainers run with ``disable_dropout=True`` (their configs' default): the
  model's ``nn.Dropout`` modules at p = 0, so no masks are saved and no dropout kernels run
  (:mod:`store.module_dropout`; a family whose dropout is functional, OPT's, keeps it).
- ``rollout_engine``: veRL 0.9.1 starts vLLM with its own ``max_num_batched_tokens`` 8192 and ``max_num_seqs``
  256 and puts a colocated engine to sleep at level 2 (1 with LoRA) whatever the plan's level
  (``store.frameworks.framework_engine_batch``, ``framework_sleep_level``).

Not modelled (the plan stays DeepSpeed's where the framework's code differs otherwise): veRL trains with FSDP (or
Megatron), not DeepSpeed, and its actor takes log-probs over unpadded tokens (``use_remove_padding``) with
flash-attention's cross-entropy where installed; its ``use_dynamic_bsz`` (off by default, so the exported
``ppo_micro_batch_size_per_gpu`` holds and ``ppo_max_token_len_per_gpu`` is unused), ``enable_chunked_prefill``
(vLLM 0.19's V1 engine chunks prefills anyway) and ``gpu_memory_utilization`` (exported as solved) change nothing
memplan plans. veRL serves the reward model on an inference engine, planned as a DeepSpeed frozen model. TRL's
``precompute_ref_log_probs`` (default False), ``padding_free`` (DPO: refused in 1.16, falls back to padding) and
``use_logits_to_keep`` (gone from 1.16's configs) change nothing at their defaults.

Two more follow a framework's code outside the cost model: the search offers a Trainer-based program (``hf``,
``trl``) only ``never`` or ``every-step`` for ``empty_cache`` (``torch_empty_cache_steps`` is the one place
transformers' Trainer calls it: ``search.choose.single_space``), and OpenRLHF's default attention,
flash-attention 2, is the job's when ``--attn-impl`` is not given (``planner.job.inputs``); both are explicit in the
plan itself.

:func:`differences` turns two frameworks' entries into the lines ``planner export --format X`` prints for a
plan made for another framework.
"""

from __future__ import annotations

from store.frameworks import TRL_FUSED_HEAD_WORKLOADS, TRL_NO_DROPOUT_WORKLOADS, VERSIONS, runs_without_module_dropout
from store.workload_kinds import traits

ASPECTS: tuple[str, ...] = (
    "lm_head",
    "sft_output",
    "dpo_reference",
    "zero_buckets",
    "frozen_buckets",
    "dropout",
    "rollout_engine",
)


def modelled(framework: str, kind: str) -> dict[str, str]:
    """How the cost model treats each aspect of workload ``kind`` for ``framework`` (aspect -> a phrase)."""
    out: dict[str, str] = {}
    implies = traits(kind)
    if not implies.scalar_head:  # a reward model has a scalar head, no vocabulary
        if framework == "trl" and kind in TRL_FUSED_HEAD_WORKLOADS:
            out["lm_head"] = (
                "TRL's fused log-prob head (tiles of 4096 tokens x 32768 vocabulary columns, no (batch, seq, vocab) "
                "logits)"
            )
        else:
            out["lm_head"] = "the (batch, seq, vocab) logits and transformers' fp32 loss over them"
    if implies.causal_lm_loss:
        if framework == "deepspeed-chat":
            out["sft_output"] = "the model output (its logits) held through the backward"
        else:
            out["sft_output"] = "only the loss kept through the backward"
    if implies.reference_forward:
        if framework == "trl":
            out["dpo_reference"] = "the reference forward after the policy's, beside its saved activations"
        else:
            out["dpo_reference"] = "the reference forward before the policy's"
    if implies.rlhf:
        if framework == "openrlhf":
            out["zero_buckets"] = "OpenRLHF's own DeepSpeed config (DeepSpeed's default buckets, 5e8 elements)"
            out["frozen_buckets"] = "frozen models under OpenRLHF's eval config (DeepSpeed's 5e7-element prefetch)"
        else:
            out["zero_buckets"] = "the exported DeepSpeed config's ZeRO buckets"
            out["frozen_buckets"] = "frozen models under the exported config (0.9 hidden^2 prefetch)"
        if framework == "verl":
            out["rollout_engine"] = "veRL's vLLM limits (8192 batched tokens, 256 sequences) and sleep level 2"
        else:
            out["rollout_engine"] = "the engine's own batch limits and the plan's sleep level"
    if kind in TRL_NO_DROPOUT_WORKLOADS:
        if runs_without_module_dropout(framework, kind):
            out["dropout"] = (
                "the model's nn.Dropout modules at p = 0 (TRL's disable_dropout): no masks, no kernels (GPT-2's "
                "dropout; OPT's is functional and stays)"
            )
        else:
            out["dropout"] = "the model's own dropout (its masks kept for the backward)"
    return out


def differences(planned: str, target: str, kind: str) -> list[str]:
    """One line per aspect in which a plan made for ``planned`` was predicted otherwise than ``target`` runs a
    ``kind`` workload (empty when they agree: the same framework, or frameworks the model does not tell apart)."""
    if planned == target:
        return []
    ours, theirs = modelled(planned, kind), modelled(target, kind)
    name = VERSIONS.get(target, target)
    return [
        f"planned for {planned} ({ours[aspect]}); {name} runs {theirs[aspect]}"
        for aspect in ASPECTS
        if aspect in ours and aspect in theirs and ours[aspect] != theirs[aspect]
    ]
