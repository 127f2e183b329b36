"""Predicted effect of empty_cache after every inference phase against never, for DeepSpeed-Chat's
OPT-1.3b actor / OPT-350m critic and reward PPO on 24 GB GPUs (the setting of arXiv 2410.15651, which
measured about 25% less memory for about 2% more time). Predictions only: nothing here runs a GPU.

Usage: .venv/bin/python benchmarks/empty_cache_effect.py
"""

from __future__ import annotations

from search import DEFAULT_COEFFICIENTS, predict
from store.gpus import generic_gpu
from store.models import get_model
from store.records import FrozenModelStrategy, Hardware, RLHFStrategy, TrainedModelStrategy, Workload

GiB = 2**30


def main() -> None:
    gpu = generic_gpu(24 * GiB)
    print(
        "| GPUs | actor/critic ZeRO | allocator | peak reserved never (GiB) | after-inference (GiB) | memory | time |"
    )
    print("|---|---|---|---|---|---|---|")
    for gpus in (1, 8):
        hw = Hardware(gpu=gpu, gpu_memory_bytes=gpu.memory_bytes, gpus=gpus, cpu_memory_bytes=256 * GiB)
        w = Workload(
            kind="ppo",
            model=get_model("opt-1.3b"),
            seq_len=512,
            global_batch=8 * gpus,
            prompt_len=256,
            gen_len=256,
            critic_model=get_model("opt-350m"),
            reward_model=get_model("opt-350m"),
        )
        for stage in (2, 3):
            for allocator in ("default", "expandable-segments"):
                frozen = FrozenModelStrategy(3 if stage == 3 else 0)
                strategy = RLHFStrategy(
                    actor=TrainedModelStrategy(stage, gradient_checkpointing=True),
                    critic=TrainedModelStrategy(stage, gradient_checkpointing=True),
                    reference=frozen,
                    reward=frozen,
                    generation_batch=4,
                    micro_batch=4,
                    grad_accum=2,
                    allocator=allocator,
                )
                never = predict(w, strategy.with_(empty_cache="never"), hw, DEFAULT_COEFFICIENTS)
                after = predict(w, strategy.with_(empty_cache="after-inference"), hw, DEFAULT_COEFFICIENTS)
                saved = 1 - after.peak_reserved_bytes / never.peak_reserved_bytes
                slower = after.step_time_s / never.step_time_s - 1
                print(
                    f"| {gpus} | {stage} | {allocator} | {never.peak_reserved_bytes / GiB:.2f} | "
                    f"{after.peak_reserved_bytes / GiB:.2f} | {-saved:+.1%} | {slower:+.1%} |"
                )


if __name__ == "__main__":
    main()
