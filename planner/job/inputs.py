"""Turning what a user typed (CLI flags or API keywords) into a Workload and a Hardware record.

Every check of user input lives here, so that each bad value gets one clear InputError.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypedDict

from planner.job.model_shapes import resolve_model
from planner.job.model_shapes import shapes_saved_on_success as shapes_saved_on_success  # the CLI's, from here
from store.errors import InputError
from store.frameworks import (
    DEFAULT_FRAMEWORK,
    KL_COEF_REFUSED,
    RULE_REWARD_REFUSED,
    VERSIONS,
    check_framework,
    default_attention,
    default_kl_coef,
)
from store.frameworks import FRAMEWORKS as FRAMEWORKS  # for the CLI, which reaches data through planner.job.inputs
from store.gpus import GENERIC_PREFIX, bf16_refusal, generic_gpu, get_gpu, gpus_without_bf16
from store.nodes import NodeSpec, get_node, least_host_memory_ratio, reference_node
from store.records import ATTN_IMPLS, DTYPES, RULE_REWARD, WORKLOAD_KINDS, Hardware, Strategy, Workload
from store.sizes import describe_size, format_bytes, parse_size
from store.workload_kinds import traits

DEFAULT_SEQ_LEN = 512
DEFAULT_PROMPT_LEN = 256  # DeepSpeed-Chat step 3's --max_prompt_seq_len
DEFAULT_GEN_LEN = 256  # and --max_answer_seq_len
DEFAULT_GRPO_SAMPLES = 4
DEFAULT_BATCH_PER_GPU = 8
DEFAULT_GPUS = 1  # per node, when neither --gpus nor --node says
# Host memory per node assumed for a probe on this machine where the OS does not say how much it has.
DEFAULT_CPU_MEM = 64 * 2**30
# One 200 Gb/s InfiniBand or RoCE link per node (GB/s, one direction): the network between nodes assumed only
# where nothing better is known (no --inter-node-gbps, no --node, no catalog node for the GPU), and what plans
# saved before the node catalog were made with.
FALLBACK_INTER_NODE_GBPS = 25.0
MAX_INTER_NODE_GBPS = 100_000.0  # GB/s per node: 800 Tb/s, beyond any node's NICs; larger is a typo
DEFAULT_ATTN_IMPL = "sdpa"
FLASH_ATTENTION_2_CC = (8, 0)  # flash-attn 2.x: Ampere, Ada and Hopper GPUs
NO_BF16_GPUS = gpus_without_bf16()  # compute capability under 8.0: V100-16G, V100-32G, T4
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
    node: str | None = None  # a node catalog name (store.nodes): the GPU, GPUs per node, host memory, network
    gpus: int | None = None  # None: the node's GPUs per node with --node, else DEFAULT_GPUS
    nodes: int = 1
    cpu_mem: str | int | None = None  # None: the node's, this machine's for a probe, else assumed (resolve_hardware)
    inter_node_gbps: float | None = None  # GB/s per node, one direction; None: the node's or the GPU's typical node's
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
    # RLHF: the KL coefficient; None: the framework's default (store.frameworks.DEFAULT_KL_COEF); 0: no reference
    kl_coef: float | None = None

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
    node: str | None
    gpus: int | None
    nodes: int
    cpu_mem: str | int | None
    inter_node_gbps: float | None
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
    kl_coef: float | None


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


def resolve_hardware(spec: JobSpec, readings: list[str], *, local: bool = False) -> Hardware:
    """The Hardware record of ``spec``: catalog GPU and/or ``--gpu-mem``, the node, counts, host memory and the
    network between nodes, each assumption said in ``readings`` with where it comes from.

    ``local``: the job runs on this machine (``planner probe`` and ``tune``), so its host memory is this
    machine's unless ``--cpu-mem`` says otherwise. Otherwise the target is another machine and the planning
    machine's memory never stands in for it: the host memory comes from ``--cpu-mem``, ``--node`` or the GPU's
    typical node (:func:`default_host_memory`)."""
    node = _node(spec, local)
    gpus = _positive_int(spec.gpus if spec.gpus is not None else node.gpus_per_node if node else DEFAULT_GPUS, "--gpus")
    if node is not None and gpus > node.gpus_per_node:
        raise InputError(f"--gpus {gpus}: a {node.name} has {node.gpus_per_node} GPUs (give --nodes for more of them)")
    nodes = _positive_int(spec.nodes, "--nodes")
    if not 0 <= spec.safety_margin < 0.5:
        raise InputError(f"--safety-margin must be between 0 and 0.5, not {spec.safety_margin}")
    if spec.gpu is None and spec.gpu_mem is None and node is None:
        raise InputError(
            "say which GPU: --gpu-mem 24G, --gpu NAME (for example --gpu A100-80G) or --node NAME "
            "(for example --node dgx-h100)"
        )
    gpu = get_gpu(spec.gpu) if spec.gpu is not None else get_gpu(node.gpu) if node is not None else None
    if node is not None:
        readings.append(f"node: {node.describe()}")
        overridden = [
            f"{flag} {value}"
            for flag, value in (("--gpu", spec.gpu), ("--gpus", spec.gpus), ("--cpu-mem", spec.cpu_mem))
            if value is not None
        ] + ([f"--inter-node-gbps {spec.inter_node_gbps}"] if spec.inter_node_gbps is not None else [])
        if overridden:
            readings.append(f"node: {', '.join(overridden)} given, in place of {node.name}'s")
        if gpu is not None and gpu.name == node.gpu and gpu.interconnect_gbps != node.intra_node_gbps:
            gpu = replace(gpu, interconnect_gbps=node.intra_node_gbps)
    if spec.gpu_mem is not None:
        memory = memory_size(spec.gpu_mem, "--gpu-mem")
        readings.append(f"GPU memory: {describe_size(spec.gpu_mem, memory)}")
        if gpu is None:
            gpu = generic_gpu(memory)
            readings.append(
                f"GPU rates: none given, so {gpu.name} is assumed to compute at an A100-80G's rates (the GPU "
                "catalog; pass --gpu NAME for yours)"
            )
    else:
        assert gpu is not None
        memory = gpu.memory_bytes
    cpu_memory = _host_memory(spec, node, gpu.name, memory, gpus, local, readings)
    inter_node = _inter_node_gbps(spec, node, gpu.name, nodes, readings)
    if gpus > 1:
        readings.append(
            f"GPU-to-GPU link in a node: {gpu.interconnect_gbps:g} GB/s per GPU, one direction "
            f"({_link_source(node, gpu.name)})"
        )
    if spec.nvme_path is not None and not spec.nvme_path.strip():
        raise InputError("--nvme-path must name a folder")
    return Hardware(
        gpu=gpu,
        gpu_memory_bytes=memory,
        gpus=gpus,
        nodes=nodes,
        cpu_memory_bytes=cpu_memory,
        nvme_path=spec.nvme_path,
        inter_node_gbps=inter_node,
        safety_margin=spec.safety_margin,
        node=node.name if node is not None else None,
    )


def _node(spec: JobSpec, local: bool) -> NodeSpec | None:
    if spec.node is None:
        return None
    if not isinstance(spec.node, str):
        raise InputError(f"--node must be a node's name, not {spec.node!r}"[:120])
    if local:
        raise InputError(
            "--node names a machine to plan for, but a probe runs on this one: give --gpus and --cpu-mem instead"
        )
    return get_node(spec.node)


def default_host_memory(gpu_name: str, gpu_memory: int, gpus: int) -> tuple[int, str]:
    """Host memory per node assumed for ``gpus`` GPUs of ``gpu_name`` on a machine that is not this one, and
    where that comes from: the host memory per GPU of the GPU's typical node (``store.nodes.REFERENCE_NODES``),
    else the least host memory per byte of GPU memory among the catalog's nodes (p4de.24xlarge's 1152 GiB for
    8 x 80 GB: 1.8 x), times the GPU's memory. Both are per GPU, so a job on part of a node is not promised the
    memory of the whole node."""
    typical = reference_node(gpu_name)
    if typical is not None:
        per_gpu = typical.host_memory_per_gpu_bytes
        how = (
            f"{format_bytes(per_gpu)}, the host memory per GPU of {typical.name}, {gpu_name}'s typical node "
            f"({typical.cited})"
        )
    else:
        ratio, least = least_host_memory_ratio()
        per_gpu = int(ratio * gpu_memory) // 2**20 * 2**20
        how = (
            f"{format_bytes(per_gpu)}, {ratio:g} x its {format_bytes(gpu_memory)} of GPU memory: the least ratio of "
            f"host to GPU memory among the node catalog's machines ({least.name}: {least.cited})"
        )
    return gpus * per_gpu, f"{gpus} GPU{'s' if gpus > 1 else ''} x {how}"


def _host_memory(
    spec: JobSpec, node: NodeSpec | None, gpu_name: str, gpu_memory: int, gpus: int, local: bool, readings: list[str]
) -> int:
    if spec.cpu_mem is not None:
        cpu_memory = memory_size(spec.cpu_mem, "--cpu-mem")
        readings.append(f"host memory per node, from --cpu-mem: {describe_size(spec.cpu_mem, cpu_memory)}")
        return cpu_memory
    if node is not None:
        readings.append(
            f"host memory per node: {format_bytes(node.host_memory_bytes)} ({node.name}: {node.cited}; "
            "pass --cpu-mem for another)"
        )
        return node.host_memory_bytes
    if local:
        here = host_memory_bytes()
        if here is None:
            readings.append(
                f"host memory per node: {format_bytes(DEFAULT_CPU_MEM)} (assumed: this machine does not say how "
                "much it has; pass --cpu-mem)"
            )
            return DEFAULT_CPU_MEM
        readings.append(
            f"host memory per node: {format_bytes(here)} (this machine's, where the probes run; pass --cpu-mem)"
        )
        return here
    cpu_memory, how = default_host_memory(gpu_name, gpu_memory, gpus)
    readings.append(
        f"host memory per node: {format_bytes(cpu_memory)} (assumed: {how}; not this machine's: it plans the "
        "job, it does not run it; pass --cpu-mem or --node)"
    )
    return cpu_memory


def _inter_node_gbps(spec: JobSpec, node: NodeSpec | None, gpu_name: str, nodes: int, readings: list[str]) -> float:
    """GB/s per node, one direction, between nodes: ``--inter-node-gbps``, else the node's, else the GPU's
    typical node's, else :data:`FALLBACK_INTER_NODE_GBPS`; said in ``readings`` when there are nodes to link."""
    given = spec.inter_node_gbps
    if given is not None:
        # compared before any conversion: nan and inf fail the bounds, and a 400-digit int never becomes a float
        if isinstance(given, bool) or not isinstance(given, (int, float)) or not 0 < given <= MAX_INTER_NODE_GBPS:
            shown = repr(given) if len(repr(given)) <= 24 else repr(given)[:21] + "..."
            raise InputError(
                f"--inter-node-gbps must be GB/s per node, above 0 and at most {MAX_INTER_NODE_GBPS:g}, not {shown}"
            )
        readings.append(f"between nodes: {given:g} GB/s per node, one direction (--inter-node-gbps)")
        return float(given)
    if node is not None:
        if node.inter_node_gbps is None:
            if nodes > 1:
                raise InputError(
                    f"--node {node.name} has no network to other nodes: give --inter-node-gbps for the link between "
                    f"the {nodes} nodes"
                )
            return FALLBACK_INTER_NODE_GBPS  # one node: nothing crosses a network
        if nodes > 1:
            readings.append(
                f"between nodes: {node.inter_node_gbps:g} GB/s per node, one direction ({node.name}: {node.cited}; "
                "pass --inter-node-gbps for another)"
            )
        return node.inter_node_gbps
    typical = reference_node(gpu_name)
    if typical is not None and typical.inter_node_gbps is not None:
        gbps, how = typical.inter_node_gbps, f"as in {typical.name}, {gpu_name}'s typical node ({typical.cited})"
    else:
        gbps = FALLBACK_INTER_NODE_GBPS
        how = f"one 200 Gb/s InfiniBand or RoCE link per node: the node catalog has no node of {gpu_name}"
    if nodes > 1:
        readings.append(
            f"between nodes: {gbps:g} GB/s per node, one direction (assumed: {how}; pass --inter-node-gbps or --node)"
        )
    return gbps


def _link_source(node: NodeSpec | None, gpu_name: str) -> str:
    if node is not None and node.gpu == gpu_name:
        return f"{node.name}'s {node.intra_node}: {node.cited}"
    if gpu_name.startswith(GENERIC_PREFIX):
        return "assumed: an A100's NVLink, the rates of a GPU known only by its memory; pass --gpu NAME"
    return f"{gpu_name} in the GPU catalog"


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
    kind = traits(spec.workload)
    rlhf = kind.rlhf
    dtype = spec.dtype
    if dtype is None:
        dtype = "bf16" if hardware.gpu.has_bf16 else "fp16"
        if dtype == "fp16":
            readings.append(f"dtype: fp16 ({hardware.gpu.name} has no bf16 tensor cores)")
    elif dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    elif dtype == "bf16" and not hardware.gpu.has_bf16:
        raise InputError(bf16_refusal(hardware.gpu.name, hardware.gpu.compute_capability))
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
    if kind.group_samples:
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
        rule_reward=rule_reward,
        kl_coef=kl_coef,
    )


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


def resolve(spec: JobSpec, db: str | None = None, *, local: bool = False) -> ResolvedJob:
    """Check and resolve every input of ``spec``; raises InputError with one clear line. ``db`` holds the
    shape cache of traced model configs (default: ``$PLANNER_DB`` or the user's data folder), written only once
    every input of the job is checked (of the whole command, under the CLI: ``shapes_saved_on_success``).
    ``local``: the job runs on this machine (a probe), so this machine's host memory is the default."""
    readings: list[str] = []
    hardware = resolve_hardware(spec, readings, local=local)
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
        "node": h.get("node"),
        # saved before the node catalog, a multi-node plan was made with the fallback network
        "inter_node_gbps": h.get("inter_node_gbps", FALLBACK_INTER_NODE_GBPS if h.get("nodes", 1) > 1 else None),
        "nvme_path": h.get("nvme_path"),
        "safety_margin": h.get("safety_margin", 0.05),
        "batch": w["global_batch"],
        "dtype": w["dtype"],
        "attn_impl": w["attn_impl"],
    }
    for name in ("ref_model", "critic_model", "reward_model", "prompt_len", "gen_len", "ppo_epochs", "kl_coef"):
        if w.get(name) is not None:
            fields[name] = w[name]
    if "prompt_len" not in w:
        fields["seq_len"] = w["seq_len"]
    if w.get("samples_per_prompt", 1) != 1:
        fields["samples_per_prompt"] = w["samples_per_prompt"]
    if w.get("framework", DEFAULT_FRAMEWORK) != DEFAULT_FRAMEWORK:
        fields["framework"] = w["framework"]
    return {k: v for k, v in fields.items() if v is not None}
