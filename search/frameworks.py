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

Two more follow a framework's code outside the cost model: the search offers a Trainer-based program (``hf``,
``trl``) only ``never`` or ``every-step`` for ``empty_cache`` (``torch_empty_cache_steps`` is the one place
transformers' Trainer calls it: ``search.choose.single_space``), and OpenRLHF's default attention,
flash-attention 2, is the job's when ``--attn-impl`` is not given (``planner.job.inputs``); both are explicit in the
plan itself.

:func:`differences` turns two frameworks' entries into the lines ``planner export --format X`` prints for a
plan made for another framework.
"""

from __future__ import annotations

from store.frameworks import TRL_FUSED_HEAD_WORKLOADS, VERSIONS
from store.workload_kinds import traits

ASPECTS: tuple[str, ...] = ("lm_head", "sft_output", "dpo_reference", "zero_buckets")


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
        else:
            out["zero_buckets"] = "the exported DeepSpeed config's ZeRO buckets"
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
