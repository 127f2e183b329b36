"""QLoRA under ZeRO-3: the cost model's figures for the cases issue 32 names, beside the one published figure.

``python benchmarks/qlora_zero3.py`` prints, per case, the strategy, peak reserved of the step and of the engines'
init (the model as loaded), host memory per node and step seconds, and whether it fits:

- PEFT's DeepSpeed guide ("Use PEFT QLoRA and DeepSpeed with ZeRO3"): Llama-2-70B on 2 x 40 GB, ZeRO-3 without
  offload, nf4 stored in bf16, LoRA r8, seq 2048, batch 2 x 2 per GPU, checkpointing, flash attention: 36.6 GB
  per GPU published (its largest moment is the load: every rank holds the whole 4-bit model first);
- 70B on one 24 GB GPU: nf4 with ZeRO-3 parameter and optimizer offload (loaded on the host), against the same
  layout in 16 bits and against ZeRO-2 (the whole 4-bit model on the GPU);
- 70B on 2 x 24 GB without parameter offload: the partitioned step would fit, the load does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from search import DEFAULT_COEFFICIENTS, predict
from search.single.predict import checked_step
from search.step.replayed import replay_step
from store.gpus import generic_gpu, get_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload

GiB = 2**30


@dataclass(frozen=True)
class Case:
    name: str
    workload: Workload
    strategy: Strategy
    hardware: Hardware
    published: str = ""


def _cases() -> list[Case]:
    a100 = get_gpu("A100-40G")
    peft = Hardware(gpu=a100, gpu_memory_bytes=a100.memory_bytes, gpus=2, cpu_memory_bytes=512 * GiB)
    llama2 = Workload(
        kind="sft", model=get_model("llama-2-70b"), seq_len=2048, global_batch=8, attn_impl="flash_attention_2"
    )
    ckpt = {"gradient_checkpointing": True}
    small = Hardware(gpu=generic_gpu(24 * GiB), gpu_memory_bytes=24 * GiB, cpu_memory_bytes=64 * GiB)
    llama3 = Workload(kind="sft", model=get_model("llama-3.1-70b"), seq_len=1024, global_batch=1)
    hosted = {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", **ckpt, "lora_rank": 16}
    two = Hardware(gpu=generic_gpu(24 * GiB), gpu_memory_bytes=24 * GiB, gpus=2, cpu_memory_bytes=512 * GiB)
    return [
        Case(
            "PEFT guide: llama-2-70b, 2 x A100-40G, ZeRO-3 nf4",
            llama2,
            Strategy(3, **ckpt, lora_rank=8, micro_batch=2, grad_accum=2, quantization="nf4"),
            peft,
            "36.6 GB per GPU",
        ),
        Case("llama-3.1-70b, 1 x 24G, ZeRO-3 + offload, nf4", llama3, Strategy(**hosted, quantization="nf4"), small),
        Case("llama-3.1-70b, 1 x 24G, ZeRO-3 + offload, bf16 LoRA", llama3, Strategy(**hosted), small),
        Case(
            "llama-3.1-70b, 1 x 24G, ZeRO-2 + opt offload, nf4",
            llama3,
            Strategy(2, "cpu", **ckpt, lora_rank=16, quantization="nf4"),
            small,
        ),
        Case(
            "llama-3.1-70b, 2 x 24G, ZeRO-3 (no offload), nf4",
            Workload(kind="sft", model=get_model("llama-3.1-70b"), seq_len=1024, global_batch=2),
            Strategy(3, **ckpt, lora_rank=16, quantization="nf4"),
            two,
        ),
    ]


def main() -> None:
    coef = DEFAULT_COEFFICIENTS
    print("| case | step peak reserved | init peak reserved | host / node | step | fits | published |")
    print("|---|---|---|---|---|---|---|")
    for case in _cases():
        prediction = predict(case.workload, case.strategy, case.hardware, coef)
        step = checked_step(case.workload, case.strategy, case.hardware, coef)
        replayed = replay_step(step, case.strategy.empty_cache, case.strategy.allocator, coef)
        print(
            f"| {case.name} | {prediction.peak_reserved_bytes / GiB:.2f} GiB "
            f"| {replayed.init_peak_reserved / GiB:.2f} GiB ({replayed.init_peak_reserved / 1e9:.1f} GB) "
            f"| {prediction.host_bytes / GiB:.2f} GiB | {prediction.step_time_s:.2f} s | {prediction.fits} "
            f"| {case.published} |"
        )


if __name__ == "__main__":
    main()
