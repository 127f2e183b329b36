"""The Workload record of a job: its models (catalog or local configs), lengths, batch, dtype, attention,
the RLHF roles, reward and KL coefficient, each default said in the job's readings.
"""

from __future__ import annotations

import math
from typing import Any

from planner.job.model_shapes import resolve_model
from planner.job.spec import (
    DEFAULT_ATTN_IMPL,
    DEFAULT_BATCH_PER_GPU,
    DEFAULT_GEN_LEN,
    DEFAULT_GRPO_SAMPLES,
    DEFAULT_PROMPT_LEN,
    DEFAULT_SEQ_LEN,
    JobSpec,
    positive_int,
)
from store.errors import InputError
from store.frameworks import (
    KL_COEF_REFUSED,
    RULE_REWARD_REFUSED,
    VERSIONS,
    check_framework,
    default_attention,
    default_kl_coef,
)
from store.gpus import bf16_refusal, gpus_without_bf16
from store.records import ATTN_IMPLS, DTYPES, RULE_REWARD, WORKLOAD_KINDS, Hardware, ModelSpec, Workload
from store.workload_kinds import KindTraits, traits

FLASH_ATTENTION_2_CC = (8, 0)  # flash-attn 2.x: Ampere, Ada and Hopper GPUs
NO_BF16_GPUS = gpus_without_bf16()  # compute capability under 8.0: V100-16G, V100-32G, T4


def resolve_workload(spec: JobSpec, hardware: Hardware, readings: list[str], db: str | None = None) -> Workload:
    """The Workload record of ``spec``: models from the catalog or local configs (an architecture without a
    formula is traced once and its shape cached in the database ``db``), lengths, batch, dtype."""
    if spec.workload not in WORKLOAD_KINDS:
        raise InputError(f"--workload must be one of {', '.join(WORKLOAD_KINDS)}, not {spec.workload!r}")
    framework = check_framework(spec.framework, spec.workload)
    requested = _attention(spec, hardware, framework, readings)
    kind = traits(spec.workload)
    rlhf = kind.rlhf
    dtype = _dtype(spec, hardware, readings)
    setting = (dtype, requested)  # the activation terms a traced local config needs
    model = resolve_model(spec.model, readings, db, setting)
    prompt_len: int | None = None
    gen_len: int | None = None
    if rlhf:
        prompt_len, gen_len = _rlhf_lengths(spec, readings)
        seq_len = prompt_len + gen_len
    else:
        seq_len = _sequence_length(spec)
    batch = _global_batch(spec, hardware, rlhf, readings)
    others, rule_reward, kl_coef = _roles(spec, kind, framework, readings)
    specs = {role: resolve_model(name, readings, db, setting) if name else None for role, name in others.items()}
    for role, spec_model in [("--model", model)] + [(f"--{r.replace('_', '-')}", m) for r, m in specs.items() if m]:
        if seq_len > spec_model.max_positions:
            what = f"prompt {prompt_len} + generation {gen_len}" if rlhf else "sequence length"
            raise InputError(
                f"{what} = {seq_len} tokens is longer than {spec_model.name}'s context of "
                f"{spec_model.max_positions} tokens ({role})"
            )
    attn_impl = _attention_run(requested, [model, *(m for m in specs.values() if m)], readings)
    samples = _samples(spec, kind)
    return Workload(
        kind=spec.workload,
        model=model,
        seq_len=seq_len,
        global_batch=batch,
        dtype=dtype,
        attn_impl=attn_impl,
        ref_model=specs["ref_model"],
        critic_model=specs["critic_model"],
        reward_model=specs["reward_model"],
        prompt_len=prompt_len,
        gen_len=gen_len,
        ppo_epochs=positive_int(spec.ppo_epochs, "--ppo-epochs"),
        samples_per_prompt=samples,
        framework=framework,
        rule_reward=rule_reward,
        kl_coef=kl_coef,
    )


def _attention(spec: JobSpec, hardware: Hardware, framework: str, readings: list[str]) -> str:
    """The attention asked for: ``--attn-impl``, else the framework's default; flash_attention_2 only on a GPU of
    compute capability 8.0 or more (asked for: an InputError; the framework's default: sdpa, said)."""
    requested = spec.attn_impl
    if requested is None:
        requested = default_attention(framework) or DEFAULT_ATTN_IMPL
        if requested != DEFAULT_ATTN_IMPL:
            readings.append(f"attention: {requested} ({VERSIONS[framework]}'s default; pass --attn-impl)")
    if requested not in ATTN_IMPLS:
        raise InputError(f"--attn-impl must be one of {', '.join(ATTN_IMPLS)}, not {requested!r}")
    cc = hardware.gpu.compute_capability
    if requested == "flash_attention_2" and cc is not None and cc < FLASH_ATTENTION_2_CC:
        why = (
            f"{hardware.gpu.name} (compute capability {cc[0]}.{cc[1]}) cannot run flash_attention_2 "
            "(FlashAttention-2 needs 8.0, Ampere or newer)"
        )
        if spec.attn_impl is not None:
            raise InputError(f"--attn-impl flash_attention_2: {why}; use --attn-impl sdpa or eager")
        requested = DEFAULT_ATTN_IMPL  # the framework's default, which its program would refuse on this GPU too
        readings.append(f"attention: {DEFAULT_ATTN_IMPL}: {why}; tell {VERSIONS[framework]} to use sdpa as well")
    return str(requested)


def _dtype(spec: JobSpec, hardware: Hardware, readings: list[str]) -> str:
    """``--dtype``, else bf16 where the GPU has bf16 tensor cores and fp16 where it has not (said)."""
    dtype = spec.dtype
    if dtype is None:
        dtype = "bf16" if hardware.gpu.has_bf16 else "fp16"
        if dtype == "fp16":
            readings.append(f"dtype: fp16 ({hardware.gpu.name} has no bf16 tensor cores)")
    elif dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    elif dtype == "bf16" and not hardware.gpu.has_bf16:
        raise InputError(bf16_refusal(hardware.gpu.name, hardware.gpu.compute_capability))
    return dtype


def _global_batch(spec: JobSpec, hardware: Hardware, rlhf: bool, readings: list[str]) -> int:
    """``--batch``, else ``DEFAULT_BATCH_PER_GPU`` per GPU (prompts for RLHF, samples else; said)."""
    if spec.batch is None:
        batch = DEFAULT_BATCH_PER_GPU * hardware.world_size
        unit = "prompts" if rlhf else "samples"
        readings.append(f"global batch: {batch} {unit} ({DEFAULT_BATCH_PER_GPU} per GPU; pass --batch)")
        return batch
    return positive_int(spec.batch, "--batch")


def _roles(
    spec: JobSpec, kind: KindTraits, framework: str, readings: list[str]
) -> tuple[dict[str, str | None], bool, float | None]:
    """The names of the reference, critic and reward models the workload loads (None: not loaded), whether its
    reward is rule-based, and its KL coefficient; one InputError line for a role the workload has no use for."""
    rlhf = kind.rlhf
    others = {role: getattr(spec, role) for role in ("ref_model", "critic_model", "reward_model")}
    if not rlhf:
        extra = [f"--{role.replace('_', '-')}" for role, name in others.items() if name and role != "ref_model"]
        if extra or (others["ref_model"] and not kind.reference_model):
            raise InputError(f"{', '.join(extra) or '--ref-model'} only applies to RLHF workloads (ppo, remax, grpo)")
    if rlhf and not kind.trains_critic and others["critic_model"]:
        raise InputError(f"--critic-model: {spec.workload} trains no critic (only ppo does)")
    rule_reward = rlhf and _rule_reward(others["reward_model"], framework, readings)
    if rule_reward:
        others["reward_model"] = None
    kl_coef = _kl_coef(spec.kl_coef, framework, rlhf, readings)
    if kl_coef == 0 and others["ref_model"]:
        given = "--kl-coef 0" if spec.kl_coef is not None else f"{VERSIONS[framework]}'s default KL coefficient 0"
        raise InputError(
            f"--ref-model {others['ref_model']}: with {given} no reference model is loaded; drop --ref-model or pass "
            "--kl-coef C > 0"
        )
    return others, rule_reward, kl_coef


def _attention_run(requested: str, models: list[ModelSpec], readings: list[str]) -> str:
    """The attention every model runs: ``requested``, or eager where a model's class refuses it (said)."""
    attn_impl = requested
    for spec_model in models:
        if spec_model.attn_impls and attn_impl not in spec_model.attn_impls:
            readings.append(
                f"attention: {spec_model.name} runs no {attn_impl} in transformers (its model class refuses it); "
                "planned with eager attention, which transformers picks for it"
            )
            attn_impl = "eager"
    return attn_impl


def _samples(spec: JobSpec, kind: KindTraits) -> int:
    """Samples per prompt: ``--samples-per-prompt`` (GRPO's group, default ``DEFAULT_GRPO_SAMPLES``), else 1."""
    if kind.group_samples:
        samples = DEFAULT_GRPO_SAMPLES if spec.samples_per_prompt is None else spec.samples_per_prompt
        return positive_int(samples, "--samples-per-prompt")
    if spec.samples_per_prompt not in (None, 1):
        raise InputError("--samples-per-prompt only applies to --workload grpo")
    return 1


def _rule_reward(reward_model: Any, framework: str, readings: list[str]) -> bool:
    """Whether ``--reward-model`` says ``none``: rule-based (verifiable) rewards, no reward model loaded or run.
    One InputError line where ``framework`` always scores with a reward model
    (``store.frameworks.RULE_REWARD_REFUSED``)."""
    if not isinstance(reward_model, str) or reward_model.strip().lower() != RULE_REWARD:
        return False
    if framework in RULE_REWARD_REFUSED:
        raise InputError(f"--reward-model none: {RULE_REWARD_REFUSED[framework]}")
    readings.append("reward: rule-based (--reward-model none): no reward model is loaded, none scores the rollouts")
    return True


def _kl_coef(given: Any, framework: str, rlhf: bool, readings: list[str]) -> float | None:
    """The RLHF KL coefficient: ``given`` (``--kl-coef``), else the framework's default
    (``store.frameworks.DEFAULT_KL_COEF``; None where the program fixes it with a reference held); None for the
    single-model kinds. One InputError line for a value that is not a number >= 0, a single-model workload, or a
    framework that has no setting for it."""
    if given is None:
        if not rlhf:
            return None
        value = default_kl_coef(framework)
        if value is not None:
            held = "no reference model is loaded" if value == 0 else "the reference model is loaded"
            readings.append(f"KL coefficient: {value:g} ({VERSIONS[framework]}'s default): {held} (pass --kl-coef)")
        return value
    if not rlhf:
        raise InputError(
            "--kl-coef only applies to RLHF workloads (ppo, remax, grpo); dpo's beta scales its loss and always "
            "needs the reference"
        )
    if framework in KL_COEF_REFUSED:
        raise InputError(f"--kl-coef: {KL_COEF_REFUSED[framework]}")
    number = given if isinstance(given, int | float) and not isinstance(given, bool) else None
    if isinstance(given, str):
        try:
            number = float(given)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number < 0:
        shown = repr(given) if len(repr(given)) <= 32 else repr(given)[:29] + "..."
        raise InputError(f"--kl-coef must be a number >= 0 (0: no reference model), not {shown}")
    if number == 0:
        readings.append("KL coefficient: 0: no reference model is loaded and no reference log-probs are computed")
    return float(number)


def _rlhf_lengths(spec: JobSpec, readings: list[str]) -> tuple[int, int]:
    if spec.seq_len is not None:
        raise InputError("RLHF workloads take --prompt-len and --gen-len, not --seq-len")
    prompt = DEFAULT_PROMPT_LEN if spec.prompt_len is None else positive_int(spec.prompt_len, "--prompt-len")
    gen = DEFAULT_GEN_LEN if spec.gen_len is None else positive_int(spec.gen_len, "--gen-len")
    if spec.prompt_len is None or spec.gen_len is None:
        readings.append(f"lengths: prompt {prompt} + generation {gen} tokens (pass --prompt-len/--gen-len)")
    return prompt, gen


def _sequence_length(spec: JobSpec) -> int:
    if spec.prompt_len is not None or spec.gen_len is not None:
        if spec.seq_len is not None:
            raise InputError("give either --seq-len or --prompt-len with --gen-len, not both")
        if spec.prompt_len is None or spec.gen_len is None:
            raise InputError("--prompt-len and --gen-len go together")
        return positive_int(spec.prompt_len, "--prompt-len") + positive_int(spec.gen_len, "--gen-len")
    if spec.seq_len is None:
        return DEFAULT_SEQ_LEN
    return positive_int(spec.seq_len, "--seq-len")
