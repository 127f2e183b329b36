"""The job as a user describes it (CLI flags or API keywords), its defaults, and the job once resolved.

``JobSpec``'s field defaults and the named constants here are the one place the job's defaults live; the
resolution of each part is :mod:`planner.job.hardware` and :mod:`planner.job.workload`, composed by
:func:`planner.job.inputs.resolve`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypedDict

from store.errors import InputError
from store.frameworks import DEFAULT_FRAMEWORK
from store.records import Hardware, Strategy, Workload

DEFAULT_SEQ_LEN = 512
DEFAULT_PROMPT_LEN = 256  # DeepSpeed-Chat step 3's --max_prompt_seq_len
DEFAULT_GEN_LEN = 256  # and --max_answer_seq_len
DEFAULT_GRPO_SAMPLES = 4
DEFAULT_BATCH_PER_GPU = 8
DEFAULT_GPUS = 1  # per node, when neither --gpus nor --node says
DEFAULT_ATTN_IMPL = "sdpa"
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


def positive_int(value: Any, flag: str) -> int:
    """``value`` as a count of ``flag``: a whole number from 1 to its ``MAX_COUNTS``; one InputError line else."""
    highest = MAX_COUNTS.get(flag, 2**31)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= highest:
        shown = repr(value) if len(repr(value)) <= 24 else repr(value)[:21] + "..."
        raise InputError(f"{flag} must be a whole number from 1 to {highest}, not {shown}")
    return value
