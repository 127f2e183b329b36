"""The counts of one RLHF step per GPU, checked against the hardware, and the context every piece is cached on."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search.batches import per_gpu_batch
from search.coefficients import Coefficients
from search.rollout.engine_accepts import tensor_parallel_refusal
from store.errors import InputError
from store.records import Hardware, RLHFStrategy, Workload
from store.workload_kinds import traits


@dataclass(frozen=True)
class RLHFJob:
    """The counts of one RLHF step per GPU, checked against the hardware."""

    prompts_per_gpu: int
    samples_per_prompt: int
    prompt_len: int
    gen_len: int
    generate_passes: int  # generate calls per prompt batch: 2 for ReMax (sampled + greedy baseline)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.gen_len

    @property
    def sequences_per_gpu(self) -> int:
        return self.prompts_per_gpu * self.samples_per_prompt


def rlhf_job(workload: Workload, hardware: Hardware) -> RLHFJob:
    """Prompts and sequences per GPU per step; InputError when the workload cannot be an RLHF step."""
    if not workload.is_rlhf:
        raise InputError(f"workload {workload.kind!r} is not an RLHF workload (ppo, remax, grpo)")
    if workload.prompt_len is None or workload.gen_len is None:
        raise InputError(f"{workload.kind} needs a prompt length and a generation length")
    for name in ("prompt_len", "gen_len", "ppo_epochs", "samples_per_prompt"):
        value = getattr(workload, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{name} must be a whole number >= 1, not {value!r}")
    return RLHFJob(
        prompts_per_gpu=per_gpu_batch(workload, hardware),
        samples_per_prompt=workload.samples_per_prompt,
        prompt_len=workload.prompt_len,
        gen_len=workload.gen_len,
        generate_passes=traits(workload.kind).generate_passes,
    )


def check_rlhf_strategy(workload: Workload, strategy: RLHFStrategy, job: RLHFJob) -> None:
    """InputError when ``strategy`` does not match the workload or does not split its batches evenly."""
    if not isinstance(strategy, RLHFStrategy):
        raise InputError(f"{workload.kind} needs an RLHF strategy (actor/critic/reference/reward blocks)")
    s = strategy
    if workload.has_critic and s.critic is None:
        raise InputError("ppo trains a critic: the strategy needs a critic block")
    if not workload.has_critic and s.critic is not None:
        raise InputError(f"{workload.kind} trains no critic (only ppo does): drop the strategy's critic block")
    refused = s.rollout and tensor_parallel_refusal(s.rollout.engine, workload.model, s.rollout.tensor_parallel)
    if refused:
        raise InputError(refused)  # the engine stops at start (search.rollout.engine_accepts)
    if job.prompts_per_gpu % s.generation_batch:
        raise InputError(
            f"generation_batch {s.generation_batch} does not divide the {job.prompts_per_gpu} prompts per GPU"
        )
    if s.micro_batch * s.grad_accum != job.sequences_per_gpu:
        raise InputError(
            f"micro_batch {s.micro_batch} x grad_accum {s.grad_accum} must equal the {job.sequences_per_gpu} "
            f"sequences per GPU per step ({job.prompts_per_gpu} prompts x {job.samples_per_prompt} samples)"
        )


@dataclass(frozen=True, eq=False)
class RLHFContext:
    """A workload on its hardware with its coefficients: the cache key of every piece (hashed by identity)."""

    workload: Workload
    hardware: Hardware
    coef: Coefficients
    job: RLHFJob


@lru_cache(maxsize=64)
def rlhf_context(workload: Workload, hardware: Hardware, coef: Coefficients) -> RLHFContext:
    """The context of a workload; InputError when it is not an RLHF step that splits over the GPUs."""
    return RLHFContext(workload, hardware, coef, rlhf_job(workload, hardware))
