"""From a ProbeRequest to records, and from records to real models and DeepSpeed engines.

The first half is pure Python (the parent process checks a request with it before starting a child):
:func:`plan_from_request` rebuilds the Workload (every model's spec from the request's ``hf_configs``,
else from the catalog), the Strategy and the Hardware, and cuts every model to ``request.layers``
decoder layers. The second half runs in the child and imports torch, transformers and deepspeed inside
each function: models with random weights built from their HF configs directly on the device and in the
compute dtype (nothing is downloaded), gradient checkpointing and LoRA as the strategy says, and
engines started by ``deepspeed.initialize`` from the exported configs, unchanged.

The request's workload is the JSON shape of ``Workload.to_dict`` plus ``hf_configs``: the HF config of
each model by role (``model``, ``ref_model``, ``critic_model``, ``reward_model``), as
``planner.probe.workload_payload`` writes it. A role without a config is looked up by name
(``store.models.get_model``: a catalog name or a local config.json).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

from probes.model.shape import spec_of_config
from store.errors import InputError
from store.gpus import generic_gpu, get_gpu
from store.measurements import ProbeRequest
from store.models import get_model, with_layers
from store.records import (
    RULE_REWARD,
    WORKLOAD_KINDS,
    Hardware,
    ModelSpec,
    RLHFStrategy,
    Strategy,
    Workload,
)
from store.workload_kinds import traits

__all__ = [
    "MAX_CPU_RANKS",
    "ProbePlan",
    "build_causal_lm",
    "build_value_model",
    "cut_spec",
    "enable_checkpointing",
    "init_engine",
    "max_ranks",
    "plan_from_request",
    "torch_dtype",
]

ROLES: tuple[str, ...] = ("model", "ref_model", "critic_model", "reward_model")
DEVICES: tuple[str, ...] = ("cpu", "cuda")
MAX_CPU_RANKS = 4  # ranks of a CPU-backend probe (processes on this machine)


def max_ranks(device: str) -> int:
    """How many ranks a probe on ``device`` can run on this machine: the CUDA devices torch sees, or
    :data:`MAX_CPU_RANKS` on the CPU backend. Imports torch for CUDA (inside, never at module level)."""
    if device != "cuda":
        return MAX_CPU_RANKS
    import torch

    return int(torch.cuda.device_count())


@dataclass(frozen=True)
class ProbePlan:
    """What one probe runs: the (layer-cut) workload, its strategy, the hardware, on ``device``."""

    workload: Workload
    strategy: Strategy | RLHFStrategy
    hardware: Hardware
    device: str
    layers: int  # decoder layers of the trained model (the actor in RLHF) as it runs


# --- request -> records (pure) ------------------------------------------------------------------------


def cut_spec(spec: ModelSpec, layers: int) -> ModelSpec:
    """``spec`` with ``min(layers, spec.num_layers)`` decoder layers (num_hidden_layers, GPT-2's n_layer)."""
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise InputError(f"layers must be a whole number >= 1, not {layers!r}")
    if layers >= spec.num_layers:
        return spec
    if "model_type" not in spec.hf_config:
        spec = replace(spec, hf_config={**spec.hf_config, "model_type": spec.model_type})
    return with_layers(spec, layers)


def _spec(workload: dict[str, Any], role: str) -> ModelSpec | None:
    name = workload.get(role)
    configs = workload.get("hf_configs") or {}
    if not isinstance(configs, dict):
        raise InputError("probe request: workload.hf_configs must be an object of HF config dicts by role")
    config = configs.get(role)
    if config is not None:
        if not isinstance(config, dict):
            raise InputError(f"probe request: hf_configs.{role} must be an HF config object")
        if name is None:
            raise InputError(f"probe request: hf_configs.{role} is given but workload.{role} (its name) is not")
        return spec_of_config(str(name), copy.deepcopy(config))
    if name is None:
        return None
    if not isinstance(name, str):
        raise InputError(f"probe request: workload.{role} must be a model name, not {name!r}")
    return get_model(name)


def workload_from_dict(data: dict[str, Any]) -> Workload:
    """The Workload of a request's JSON shape (specs from ``hf_configs`` or the catalog)."""
    if not isinstance(data, dict):
        raise InputError("probe request: workload must be an object")
    kind = data.get("kind")
    if kind not in WORKLOAD_KINDS:
        raise InputError(f"probe request: workload.kind must be one of {', '.join(WORKLOAD_KINDS)}, not {kind!r}")
    rule_reward = data.get("reward_model") == RULE_REWARD  # Workload.to_dict: rule-based rewards, no model
    specs = {role: None if role == "reward_model" and rule_reward else _spec(data, role) for role in ROLES}
    if specs["model"] is None:
        raise InputError("probe request: workload.model is missing")
    known = {"seq_len", "global_batch", "dtype", "attn_impl", "prompt_len", "gen_len"}
    known |= {"ppo_epochs", "samples_per_prompt", "kl_coef"}
    values = {key: data[key] for key in known if data.get(key) is not None}
    if "seq_len" not in values and traits(kind).rlhf and "prompt_len" in values and "gen_len" in values:
        values["seq_len"] = values["prompt_len"] + values["gen_len"]
    for key in ("seq_len", "global_batch"):
        if key not in values:
            raise InputError(f"probe request: workload.{key} is missing")
    if traits(kind).rlhf and ("prompt_len" not in values or "gen_len" not in values):
        raise InputError(f"probe request: a {kind} workload needs prompt_len and gen_len")
    if "kl_coef" in values and not isinstance(values["kl_coef"], int | float):
        raise InputError(f"probe request: workload.kl_coef must be a number, not {values['kl_coef']!r}")
    return Workload(
        kind=kind,
        model=specs["model"],
        ref_model=specs["ref_model"],
        critic_model=specs["critic_model"],
        reward_model=specs["reward_model"],
        rule_reward=rule_reward,
        **values,
    )


def hardware_from_dict(data: dict[str, Any]) -> Hardware:
    """The Hardware of a request's JSON shape (``Hardware.to_dict``); an unknown GPU name is generic."""
    if not isinstance(data, dict):
        raise InputError("probe request: hardware must be an object")
    memory = data.get("gpu_memory_bytes")
    if not isinstance(memory, int) or memory <= 0:
        raise InputError(f"probe request: hardware.gpu_memory_bytes must be a positive integer, not {memory!r}")
    try:
        gpu = get_gpu(str(data.get("gpu", "")))
    except InputError:
        gpu = generic_gpu(memory)
    optional = {k: data[k] for k in ("gpus", "nodes", "cpu_memory_bytes", "nvme_path", "safety_margin") if k in data}
    return Hardware(gpu=gpu, gpu_memory_bytes=memory, **optional)


def plan_from_request(request: ProbeRequest) -> ProbePlan:
    """Check ``request`` and turn it into records; bad input raises InputError with one clear line.

    A probe runs on one node: ``hardware.gpus`` ranks (one process each, :mod:`probes.process.rank_group`), at most
    :data:`MAX_CPU_RANKS` on the CPU backend; a request for more than one node is refused (the planner
    probes a multi-node plan as one node of it, ``planner.probing.session``).
    """
    if request.device not in DEVICES:
        raise InputError(f"probe request: device must be cpu or cuda, not {request.device!r}")
    if not isinstance(request.steps, int) or isinstance(request.steps, bool) or request.steps < 1:
        raise InputError(f"probe request: steps must be a whole number >= 1, not {request.steps!r}")
    timeout = request.timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InputError(f"probe request: timeout_s must be a number of seconds > 0, not {timeout!r}")
    if request.memory_cap_bytes is not None and request.device != "cpu":
        raise InputError("probe request: memory_cap_bytes is for the cpu device only (a GPU has its own capacity)")
    hardware = hardware_from_dict(request.hardware)
    if hardware.nodes != 1:
        raise InputError(
            f"probe request: a probe runs on one node, but the hardware has {hardware.nodes} nodes; "
            "probe one node of the plan (nodes=1)"
        )
    if request.device == "cpu" and hardware.gpus > MAX_CPU_RANKS:
        raise InputError(f"probe request: the CPU backend runs at most {MAX_CPU_RANKS} ranks, not gpus={hardware.gpus}")
    workload = workload_from_dict(request.workload)
    if request.layers is not None:
        cut = {"model": cut_spec(workload.model, request.layers)}
        for role in ROLES[1:]:
            spec = getattr(workload, role)
            if spec is not None:
                cut[role] = cut_spec(spec, request.layers)
        workload = replace(workload, **cut)
    parse = RLHFStrategy.from_dict if workload.is_rlhf else Strategy.from_dict
    strategy = parse(dict(request.strategy))
    if traits(workload.kind).trains_critic and isinstance(strategy, RLHFStrategy) and strategy.critic is None:
        raise InputError("probe request: a ppo strategy needs a critic block")
    if workload.is_rlhf:
        for role in ROLES[1:]:
            spec = getattr(workload, role)
            if spec is not None and spec.vocab_size < workload.model.vocab_size:
                raise InputError(
                    f"probe request: {role} {spec.name} has a vocabulary of {spec.vocab_size}, smaller than the "
                    f"actor's {workload.model.vocab_size}: it cannot read the actor's sequences"
                )
    return ProbePlan(workload, strategy, hardware, request.device, workload.model.num_layers)


# --- records -> models and engines (child only; heavy imports inside) ---------------------------------


def torch_dtype(dtype: str) -> Any:
    """The torch dtype of a workload dtype name."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]


def _hf_config(spec: ModelSpec) -> Any:
    from transformers import AutoConfig

    values = {k: v for k, v in spec.hf_config.items() if k != "model_type"}
    return AutoConfig.for_model(spec.model_type, **values)


def _dtype_kwargs(dtype: str) -> dict[str, Any]:
    import transformers

    name = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    return {name: torch_dtype(dtype)}


def build_causal_lm(spec: ModelSpec, dtype: str, attn_impl: str, device: str) -> Any:
    """The causal LM of ``spec`` with random weights, built on ``device`` in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        return AutoModelForCausalLM.from_config(_hf_config(spec), attn_implementation=attn_impl, **_dtype_kwargs(dtype))


def build_value_model(spec: ModelSpec, dtype: str, attn_impl: str, device: str) -> Any:
    """A critic / reward model: the backbone of ``spec`` (no LM head) and a scalar head ``v_head``.

    ``model(input_ids, attention_mask)`` returns one value per token, shape (batch, seq), as
    DeepSpeed-Chat's RewardModel scores them (its head reads OPT's ``word_embed_proj_dim``).
    """
    import torch
    from transformers import AutoModel

    config = _hf_config(spec)
    width = getattr(config, "word_embed_proj_dim", None) or config.hidden_size

    class ValueModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = config
            self.backbone = AutoModel.from_config(config, attn_implementation=attn_impl, **_dtype_kwargs(dtype))
            self.v_head = torch.nn.Linear(width, 1, bias=False, dtype=torch_dtype(dtype))

        def forward(self, input_ids: Any, attention_mask: Any = None) -> Any:
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return self.v_head(hidden).squeeze(-1)

    with torch.device(device):
        return ValueModel()


def enable_checkpointing(model: Any) -> None:
    """Non-reentrant gradient checkpointing on a transformers model (or a value model's backbone)."""
    target = getattr(model, "backbone", model)
    kwargs = {"use_reentrant": False}
    if hasattr(target, "activation_checkpointing_enable"):  # transformers 5's name
        target.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def prepare_trained(
    model: Any, gradient_checkpointing: bool, lora_rank: int, adapter_dtype: Any = None
) -> dict[str, Any]:
    """Apply the strategy's checkpointing and LoRA to a trained model; returns what was done. ``adapter_dtype``:
    the adapters' dtype over quantized base layers (QLoRA)."""
    done: dict[str, Any] = {}
    if gradient_checkpointing:
        enable_checkpointing(model)
        done["gradient_checkpointing"] = True
    if lora_rank:
        from probes.model.lora import add_lora

        done["lora_layers"] = add_lora(model, lora_rank, trainable=("v_head",), adapter_dtype=adapter_dtype)
    return done


def init_engine(model: Any, config: dict[str, Any], trained: bool) -> Any:
    """``deepspeed.initialize`` with ``config`` unchanged; trained models pass their trainable parameters."""
    import deepspeed

    params = [p for p in model.parameters() if p.requires_grad] if trained else None
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    return engine


def frozen_config_like(trained_config: dict[str, Any]) -> dict[str, Any]:
    """The eval config of a frozen copy of a trained model (DPO's reference), as TRL derives it.

    Same batch sizes and precision, no optimizer; ZeRO-3 stays ZeRO-3 (with the parameter offload, not
    the optimizer's), any other stage becomes 0.
    """
    config = {k: copy.deepcopy(v) for k, v in trained_config.items() if k not in ("optimizer", "gradient_clipping")}
    zero = dict(trained_config.get("zero_optimization") or {"stage": 0})
    if zero.get("stage") == 3:
        zero.pop("offload_optimizer", None)
        config["zero_optimization"] = zero
    else:
        config["zero_optimization"] = {"stage": 0}
    return config
