"""A model with its ``torch.nn.Dropout`` modules at p = 0, as TRL's ``disable_dropout`` leaves it.

TRL 1.16's ``DPOConfig`` and ``RewardConfig`` default to ``disable_dropout=True``; ``DPOTrainer.__init__`` then
calls ``trl.trainer.utils.disable_dropout_in_model`` on the policy and the reference model
(``trl/trainer/dpo_trainer.py``), ``RewardTrainer.__init__`` on the trained model (``reward_trainer.py``);
``GRPOConfig`` defaults to ``False`` and ``SFTConfig`` has no such key. The function sets ``module.p = 0`` on
every ``torch.nn.Dropout`` module and nothing else, so only the probabilities a model family holds in such
modules vanish; a family that reads its probability from a float attribute into ``nn.functional.dropout``
keeps it (transformers 5.23: OPT's residual ``dropout`` and every family's ``attention_dropout``, passed to the
attention function as ``dropout=0.0 if not self.training else self.attention_dropout``).

A dropout at p = 0 runs no kernel and saves no mask: ATen's ``dropout`` takes the fused kernel only for
``0 < p < 1`` (``is_fused_kernel_acceptable``, ``aten/src/ATen/native/Dropout.cpp``) and otherwise returns its
input when ``p == 0``; sdpa with ``dropout_p=0`` keeps no dropped probabilities. The cost model therefore plans
such a model as the same config with those probabilities at 0: the formulas read them
(``search.model.shapes.dropout_probs``), and the traced terms of that config are traced apart
(:data:`NO_DROPOUT_ACTIVATIONS_PATH`, written by ``python -m probes.trace.no_dropout --write``).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path
from typing import Any

from store.frameworks import runs_without_module_dropout
from store.records import ModelSpec, Workload

# The config keys whose probability transformers 5.23 holds in ``torch.nn.Dropout`` modules, by model type
# (``models/gpt2/modeling_gpt2.py``: ``GPT2Attention.attn_dropout``/``resid_dropout``, ``GPT2MLP.dropout``,
# ``GPT2Model.drop``; sdpa reads ``self.attn_dropout.p``). A model type not named holds none there (OPT, Llama,
# Mistral, Qwen2/3, Gemma, Phi-3's ``resid_pdrop`` default 0.0 aside): tests/store/test_module_dropout.py runs
# ``disable_dropout_in_model`` on each catalog family to pin this.
MODULE_DROPOUT_KEYS: dict[str, tuple[str, ...]] = {
    "gpt2": ("attn_pdrop", "resid_pdrop", "embd_pdrop"),
}
# Every dropout probability of the families above (``store.model_params``'s ``ModelSpec.dropout`` reads these)
ALL_DROPOUT_KEYS: dict[str, tuple[str, ...]] = {
    "gpt2": ("attn_pdrop", "resid_pdrop", "embd_pdrop"),
}
NO_DROPOUT_ACTIVATIONS_PATH = Path(__file__).resolve().parent / "catalog_activations_no_dropout.json"


def module_dropout_keys(model_type: str) -> tuple[str, ...]:
    """The config keys of ``model_type`` whose dropout ``disable_dropout_in_model`` turns off (empty: none)."""
    return MODULE_DROPOUT_KEYS.get(model_type, ())


def without_module_dropout_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    """``hf_config`` with every probability held in an ``nn.Dropout`` module at 0 (a copy)."""
    keys = module_dropout_keys(str(hf_config.get("model_type")))
    return {**hf_config, **dict.fromkeys(keys, 0.0)}


@cache
def _no_dropout_lines() -> dict[str, str]:
    """Each model's line of the no-dropout terms file (one model a line, as ``catalog_activations.json``)."""
    if not NO_DROPOUT_ACTIVATIONS_PATH.is_file():
        return {}
    lines: dict[str, str] = {}
    for line in NO_DROPOUT_ACTIVATIONS_PATH.read_text(encoding="utf-8").splitlines()[1:-1]:
        name, _, rest = line.partition(": ")
        lines[json.loads(name)] = rest.rstrip(",")
    return lines


def no_dropout_terms(name: str) -> dict[str, Any] | None:
    """The traced activation terms of catalog model ``name`` with its module dropout off, or None."""
    line = _no_dropout_lines().get(name)
    if line is None:
        return None
    traced = dict(json.loads(line))
    traced.pop("unfitted", None)
    return traced


def without_module_dropout(spec: ModelSpec) -> ModelSpec:
    """``spec`` as TRL's ``disable_dropout_in_model`` leaves the model: its module dropout probabilities at 0,
    with the terms traced so (:data:`NO_DROPOUT_ACTIVATIONS_PATH`). ``spec`` itself where its family holds no
    dropout in modules or those probabilities are 0 already.

    A model with traced terms but none traced without dropout (a local GPT-2-style ``config.json``) keeps its
    traced terms, masks included: the formulas' share is exact, the traced share not (named in the plan by
    :func:`search.frameworks.modelled`)."""
    keys = module_dropout_keys(spec.model_type)
    if not keys:
        return spec
    config = without_module_dropout_config(spec.hf_config)
    left = [float(config.get(k, 0.0) or 0.0) for k in ALL_DROPOUT_KEYS.get(spec.model_type, ()) if k not in keys]
    terms = no_dropout_terms(spec.name) if spec.activation_terms else None
    return dataclasses.replace(
        spec,
        hf_config=config,
        dropout=max(left, default=0.0),
        activation_terms=spec.activation_terms if terms is None else terms,
    )


def workload_as_run(workload: Workload) -> Workload:
    """``workload`` with the models its framework runs: under TRL's ``disable_dropout`` default (DPO, reward:
    ``store.frameworks.runs_without_module_dropout``) the trained and the reference model without module dropout
    (``DPOTrainer.__init__`` disables it in both); ``workload`` itself otherwise."""
    if not runs_without_module_dropout(workload.framework, workload.kind):
        return workload
    ref = None if workload.ref_model is None else without_module_dropout(workload.ref_model)
    return dataclasses.replace(workload, model=without_module_dropout(workload.model), ref_model=ref)
