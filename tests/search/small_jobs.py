"""Small RLHF jobs the search's tests share: cheap to predict, with engine points and DeepSpeed's alike."""

from __future__ import annotations

from store.gpus import generic_gpu, get_gpu
from store.models import get_model
from store.records import Hardware, Workload

GiB = 2**30


def grpo_opt125m(gpu_memory: int | None = None) -> tuple[Workload, Hardware]:
    """OPT-125m GRPO (8 prompts x 4 samples, 256 + 256 tokens) on two L4s, or two GPUs of ``gpu_memory`` bytes."""
    spec = get_gpu("L4") if gpu_memory is None else generic_gpu(gpu_memory)
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=2, cpu_memory_bytes=256 * GiB)
    workload = Workload(
        kind="grpo", model=get_model("opt-125m"), seq_len=512, global_batch=8, prompt_len=256, gen_len=256,
        samples_per_prompt=4,
    )  # fmt: skip
    return workload, hardware
