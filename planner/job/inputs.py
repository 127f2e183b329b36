"""Turning what a user typed (CLI flags or API keywords) into a Workload and a Hardware record.

Every check of user input lives here, so that each bad value gets one clear InputError.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict

from planner.job.model_shapes import resolve_model, shapes_saved_on_success
from store.errors import InputError
from store.frameworks import DEFAULT_FRAMEWORK, VERSIONS, check_framework, default_attention
from store.frameworks import FRAMEWORKS as FRAMEWORKS  # for the CLI, which reaches data through planner.job.inputs
from store.gpus import GENERIC_PREFIX, generic_gpu, get_gpu
from store.records import ATTN_IMPLS, DTYPES, RLHF_WORKLOADS, WORKLOAD_KINDS, Hardware, Strategy, Workload
from store.sizes import describe_size, parse_size

DEFAULT_SEQ_LEN = 512
DEFAULT_PROMPT_LEN = 256  # DeepSpeed-Chat step 3's --max_prompt_seq_len
DEFAULT_GEN_LEN = 256  # and --max_answer_seq_len
DEFAULT_GRPO_SAMPLES = 4
DEFAULT_BATCH_PER_GPU = 8
DEFAULT_CPU_MEM = 64 * 2**30
DEFAULT_ATTN_IMPL = "sdpa"
NO_BF16_GPUS = ("V100-16G", "V100-32G", "T4")
# `check` reads one DeepSpeed config, which runs one trained model: its job is a single-model workload.
CONFIG_WORKLOAD = "sft"
# What a single-model strategy leaves unsaid (the knobs that are not DeepSpeed keys, for `check`).
STRATEGY_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Strategy)}


@dataclass(frozen=True)
class JobSpec:
    """The raw description of a job, as the CLI and the Python API take it.

    The field defaults are the one place the job's defaults live: the API builds a JobSpec from its
    keywords and every ``planner`` command declares its job options from these fields
    (``planner.cli.options.job_options``). ``None`` means "derived": see ``resolve``.
    """

    model: str
    workload: str = "ppo"
    gpu_mem: str | int | None = None
    gpu: str | None = None
    gpus: int = 1
    nodes: int = 1
    cpu_mem: str | int | None = None
    batch: int | None = None
    seq_len: int | None = None
    prompt_len: int | None = None
    gen_len: int | None = None
    dtype: str | None = None
    attn_impl: str | None = None  # None: the framework's default (store.frameworks), else DEFAULT_ATTN_IMPL
    ref_model: str | None = None
    critic_model: str | None = None
    reward_model: str | None = None
    nvme_path: str | None = None
    safety_margin: float = 0.05
    ppo_epochs: int = 1
    samples_per_prompt: int | None = None
    framework: str = DEFAULT_FRAMEWORK

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class JobKeywords(TypedDict, total=False):
    """The job keywords of the Python API (``recommend``, ``predict``, ``check``, ``probe``, ``tune``): every
    ``JobSpec`` field but ``model``, with its type, so that a type checker checks a caller's keywords
    (``**job: Unpack[JobKeywords]``). Defaults and meanings are JobSpec's; sizes (``gpu_mem``, ``cpu_mem``) are
    a string with a unit (``"24G"``, ``"24GiB"``, ``"24576MiB"``) or an int of bytes, never a bare ``24``.
    """

    workload: str
    gpu_mem: str | int | None
    gpu: str | None
    gpus: int
    nodes: int
    cpu_mem: str | int | None
    batch: int | None
    seq_len: int | None
    prompt_len: int | None
    gen_len: int | None
    dtype: str | None
    attn_impl: str | None
    ref_model: str | None
    critic_model: str | None
    reward_model: str | None
    nvme_path: str | None
    safety_margin: float
    ppo_epochs: int
    samples_per_prompt: int | None
    framework: str


@dataclass(frozen=True)
class ResolvedJob:
    """A JobSpec made concrete, with a line for each value that was read or assumed."""

    workload: Workload
    hardware: Hardware
    readings: tuple[str, ...] = field(default=())


def host_memory_bytes() -> int | None:
    """Physical memory of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# What each count can meaningfully be: beyond these a number is a typo, and the search would only grind.
MAX_COUNTS: dict[str, int] = {
    "--gpus": 1024,  # per node
    "--nodes": 65_536,
    "--batch": 2**20,  # samples (prompts, pairs) per optimizer step over all GPUs
    "--samples-per-prompt": 4096,
    "--ppo-epochs": 1000,
    "--prompt-len": 2**22,
    "--gen-len": 2**22,
    "--seq-len": 2**22,
}


def _positive_int(value: Any, flag: str) -> int:
    highest = MAX_COUNTS.get(flag, 2**31)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= highest:
        shown = repr(value) if len(repr(value)) <= 24 else repr(value)[:21] + "..."
        raise InputError(f"{flag} must be a whole number from 1 to {highest}, not {shown}")
    return value


# No GPU or node has less memory than this: a smaller size is a unit left out (``gpu_mem=24`` for "24G").
MIN_MEMORY = 2**20


def memory_size(value: Any, flag: str) -> int:
    """Bytes of a GPU's or a node's memory: a size with a unit (``24G``) or an int of bytes (``store.sizes``).

    Below ``MIN_MEMORY`` (1 MiB) it is an InputError: a bare ``24`` would mean 24 bytes, never what was meant.
    """
    size = parse_size(value, flag)
    if size < MIN_MEMORY:
        text = " ".join(str(value).split())
        if isinstance(value, (int, float)) or text.isdigit():
            raise InputError(
                f"{flag} {text} would mean {text} bytes: write the unit, like {text}G ({text} GiB), "
                "or give the size in bytes"
            )
        raise InputError(f"{flag} {text} is less than 1 MiB: write the memory with its unit, like 24G")
    return size


def resolve_hardware(spec: JobSpec, readings: list[str]) -> Hardware:
    """The Hardware record of ``spec``: catalog GPU and/or ``--gpu-mem``, counts and host memory."""
    gpus = _positive_int(spec.gpus, "--gpus")
    nodes = _positive_int(spec.nodes, "--nodes")
    if not 0 <= spec.safety_margin < 0.5:
        raise InputError(f"--safety-margin must be between 0 and 0.5, not {spec.safety_margin}")
    if spec.gpu is None and spec.gpu_mem is None:
        raise InputError("say which GPU: --gpu-mem 24G, or --gpu NAME (for example --gpu A100-80G)")
    gpu = get_gpu(spec.gpu) if spec.gpu is not None else None
    if spec.gpu_mem is not None:
        memory = memory_size(spec.gpu_mem, "--gpu-mem")
        readings.append(f"GPU memory: {describe_size(spec.gpu_mem, memory)}")
        if gpu is None:
            gpu = generic_gpu(memory)
            readings.append(f"GPU rates: none given, assuming an A100's (pass --gpu NAME for yours): {gpu.name}")
    else:
        assert gpu is not None
        memory = gpu.memory_bytes
    if spec.cpu_mem is not None:
        cpu_memory = memory_size(spec.cpu_mem, "--cpu-mem")
        readings.append(f"host memory per node: {describe_size(spec.cpu_mem, cpu_memory)}")
    else:
        cpu_memory = host_memory_bytes() or DEFAULT_CPU_MEM
        readings.append(f"host memory per node: {cpu_memory / 2**30:.1f} GiB (this machine's; pass --cpu-mem)")
    if spec.nvme_path is not None and not spec.nvme_path.strip():
        raise InputError("--nvme-path must name a folder")
    return Hardware(
        gpu=gpu,
        gpu_memory_bytes=memory,
        gpus=gpus,
        nodes=nodes,
        cpu_memory_bytes=cpu_memory,
        nvme_path=spec.nvme_path,
        safety_margin=spec.safety_margin,
    )


def resolve_workload(spec: JobSpec, hardware: Hardware, readings: list[str], db: str | None = None) -> Workload:
    """The Workload record of ``spec``: models from the catalog or local configs (an architecture without a
    formula is traced once and its shape cached in the database ``db``), lengths, batch, dtype."""
    if spec.workload not in WORKLOAD_KINDS:
        raise InputError(f"--workload must be one of {', '.join(WORKLOAD_KINDS)}, not {spec.workload!r}")
    framework = check_framework(spec.framework, spec.workload)
    requested = spec.attn_impl
    if requested is None:
        requested = default_attention(framework) or DEFAULT_ATTN_IMPL
        if requested != DEFAULT_ATTN_IMPL:
            readings.append(f"attention: {requested} ({VERSIONS[framework]}'s default; pass --attn-impl)")
    if requested not in ATTN_IMPLS:
        raise InputError(f"--attn-impl must be one of {', '.join(ATTN_IMPLS)}, not {requested!r}")
    rlhf = spec.workload in RLHF_WORKLOADS
    dtype = spec.dtype
    if dtype is None:
        dtype = "fp16" if hardware.gpu.name in NO_BF16_GPUS else "bf16"
        if dtype == "fp16":
            readings.append(f"dtype: fp16 ({hardware.gpu.name} has no bf16 tensor cores)")
    elif dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    setting = (dtype, requested)  # the activation terms a traced local config needs
    model = resolve_model(spec.model, readings, db, setting)
    prompt_len: int | None = None
    gen_len: int | None = None
    if rlhf:
        prompt_len, gen_len = _rlhf_lengths(spec, readings)
        seq_len = prompt_len + gen_len
    else:
        seq_len = _sequence_length(spec)
    if spec.batch is None:
        batch = DEFAULT_BATCH_PER_GPU * hardware.world_size
        unit = "prompts" if rlhf else "samples"
        readings.append(f"global batch: {batch} {unit} ({DEFAULT_BATCH_PER_GPU} per GPU; pass --batch)")
    else:
        batch = _positive_int(spec.batch, "--batch")
    others = {role: getattr(spec, role) for role in ("ref_model", "critic_model", "reward_model")}
    if not rlhf:
        extra = [f"--{role.replace('_', '-')}" for role, name in others.items() if name and role != "ref_model"]
        if extra or (others["ref_model"] and spec.workload != "dpo"):
            raise InputError(f"{', '.join(extra) or '--ref-model'} only applies to RLHF workloads (ppo, remax, grpo)")
    if spec.workload in ("remax", "grpo") and others["critic_model"]:
        raise InputError(f"--critic-model: {spec.workload} trains no critic (only ppo does)")
    specs = {role: resolve_model(name, readings, db, setting) if name else None for role, name in others.items()}
    for role, spec_model in [("--model", model)] + [(f"--{r.replace('_', '-')}", m) for r, m in specs.items() if m]:
        if seq_len > spec_model.max_positions:
            what = f"prompt {prompt_len} + generation {gen_len}" if rlhf else "sequence length"
            raise InputError(
                f"{what} = {seq_len} tokens is longer than {spec_model.name}'s context of "
                f"{spec_model.max_positions} tokens ({role})"
            )
    attn_impl = requested
    for spec_model in [model, *(m for m in specs.values() if m)]:
        if spec_model.attn_impls and attn_impl not in spec_model.attn_impls:
            readings.append(
                f"attention: {spec_model.name} runs no {attn_impl} in transformers (its model class refuses it); "
                "planned with eager attention, which transformers picks for it"
            )
            attn_impl = "eager"
    samples = 1
    if spec.workload == "grpo":
        samples = DEFAULT_GRPO_SAMPLES if spec.samples_per_prompt is None else spec.samples_per_prompt
        samples = _positive_int(samples, "--samples-per-prompt")
    elif spec.samples_per_prompt not in (None, 1):
        raise InputError("--samples-per-prompt only applies to --workload grpo")
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
        ppo_epochs=_positive_int(spec.ppo_epochs, "--ppo-epochs"),
        samples_per_prompt=samples,
        framework=framework,
    )


def _rlhf_lengths(spec: JobSpec, readings: list[str]) -> tuple[int, int]:
    if spec.seq_len is not None:
        raise InputError("RLHF workloads take --prompt-len and --gen-len, not --seq-len")
    prompt = DEFAULT_PROMPT_LEN if spec.prompt_len is None else _positive_int(spec.prompt_len, "--prompt-len")
    gen = DEFAULT_GEN_LEN if spec.gen_len is None else _positive_int(spec.gen_len, "--gen-len")
    if spec.prompt_len is None or spec.gen_len is None:
        readings.append(f"lengths: prompt {prompt} + generation {gen} tokens (pass --prompt-len/--gen-len)")
    return prompt, gen


def _sequence_length(spec: JobSpec) -> int:
    if spec.prompt_len is not None or spec.gen_len is not None:
        if spec.seq_len is not None:
            raise InputError("give either --seq-len or --prompt-len with --gen-len, not both")
        if spec.prompt_len is None or spec.gen_len is None:
            raise InputError("--prompt-len and --gen-len go together")
        return _positive_int(spec.prompt_len, "--prompt-len") + _positive_int(spec.gen_len, "--gen-len")
    if spec.seq_len is None:
        return DEFAULT_SEQ_LEN
    return _positive_int(spec.seq_len, "--seq-len")


def resolve(spec: JobSpec, db: str | None = None) -> ResolvedJob:
    """Check and resolve every input of ``spec``; raises InputError with one clear line. ``db`` holds the
    shape cache of traced model configs (default: ``$PLANNER_DB`` or the user's data folder), written only once
    every input of the job is checked (of the whole command, under the CLI: ``shapes_saved_on_success``)."""
    readings: list[str] = []
    hardware = resolve_hardware(spec, readings)
    with shapes_saved_on_success():
        workload = resolve_workload(spec, hardware, readings, db)
    return ResolvedJob(workload=workload, hardware=hardware, readings=tuple(readings))


def job_fields(workload: dict[str, Any], hardware: dict[str, Any]) -> dict[str, Any]:
    """JobSpec fields (all but the model) from a document's ``workload`` and ``hardware`` blocks, as
    ``Workload.to_dict`` and ``Hardware.to_dict`` write them (a saved plan, a stored probe's request)."""
    w, h = workload, hardware
    fields = {
        "workload": w["kind"],
        "gpu": None if h["gpu"].startswith(GENERIC_PREFIX) else h["gpu"],  # a --gpu-mem-only job
        "gpu_mem": h["gpu_memory_bytes"],
        "gpus": h.get("gpus", 1),
        "nodes": h.get("nodes", 1),
        "cpu_mem": h["cpu_memory_bytes"],
        "nvme_path": h.get("nvme_path"),
        "safety_margin": h.get("safety_margin", 0.05),
        "batch": w["global_batch"],
        "dtype": w["dtype"],
        "attn_impl": w["attn_impl"],
    }
    for name in ("ref_model", "critic_model", "reward_model", "prompt_len", "gen_len", "ppo_epochs"):
        if w.get(name) is not None:
            fields[name] = w[name]
    if "prompt_len" not in w:
        fields["seq_len"] = w["seq_len"]
    if w.get("samples_per_prompt", 1) != 1:
        fields["samples_per_prompt"] = w["samples_per_prompt"]
    if w.get("framework", DEFAULT_FRAMEWORK) != DEFAULT_FRAMEWORK:
        fields["framework"] = w["framework"]
    return {k: v for k, v in fields.items() if v is not None}
