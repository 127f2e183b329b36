"""empty_cache after every inference phase against never, from the allocator replay, for DeepSpeed-Chat's
OPT-1.3b actor with OPT-350m critic and reward (PPO) on 24 GiB GPUs: the setting of arXiv 2410.15651, which
measured about 25% less peak memory for about 2% more time.

Each strategy's step is built by the cost model (search.rlhf.step.rlhf_step), its allocation stream built
from those bytes (search.streams.build) with the empty_cache calls where each policy puts them, and replayed
through the port of torch's caching allocator (search.step.replayed.replay_step). Memory is the step's peak
reserved (torch's allocator plus what the hybrid engine holds outside it); time is the step's predicted
seconds plus what the replayed calls cost (their cudaFree now, the cudaMalloc later). Beside it, the
fragment coefficients' answer (the search's screen, `search.screen`; `planner predict` gives the replay's since
2026-11-25). Predictions only: nothing here runs a GPU.

Usage: .venv/bin/python benchmarks/empty_cache_replay.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search import DEFAULT_COEFFICIENTS, screen  # noqa: E402
from search.rlhf.predict import rlhf_step  # noqa: E402
from search.step.replayed import replay_step  # noqa: E402
from store.gpus import generic_gpu  # noqa: E402
from store.models import get_model  # noqa: E402
from store.records import FrozenModelStrategy, Hardware, RLHFStrategy, TrainedModelStrategy, Workload  # noqa: E402

GiB = 2**30
COEF = DEFAULT_COEFFICIENTS


def _replayed(w: Workload, s: RLHFStrategy, hw: Hardware, policy: str) -> tuple[float, float]:
    """(peak reserved GiB, step seconds) of the replayed stream under ``policy``."""
    step = rlhf_step(w, s, hw, COEF)
    replayed = replay_step(step, policy, s.allocator, COEF)
    return max(p.reserved for p in replayed.phases) / GiB, step.base_time_s + replayed.cache_seconds


def main() -> None:
    gpu = generic_gpu(24 * GiB)
    print(
        "| GPUs | ZeRO | offload | ckpt | hybrid engine | replay: never -> after-inference (GiB) | memory | time "
        "| coefficients: memory | time |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for gpus in (1, 4):
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
        for stage in (1, 2, 3):
            for offload in ("none", "cpu"):
                for ckpt in (False, True):
                    for hybrid in (False, True):
                        layout = TrainedModelStrategy(stage, offload_optimizer=offload, gradient_checkpointing=ckpt)
                        frozen = FrozenModelStrategy(3 if stage == 3 else 0)
                        strategy = RLHFStrategy(
                            actor=layout,
                            critic=layout,
                            reference=frozen,
                            reward=frozen,
                            hybrid_engine=hybrid,
                            generation_batch=4,
                            micro_batch=4,
                            grad_accum=2,
                        )
                        never, never_s = _replayed(w, strategy, hw, "never")
                        after, after_s = _replayed(w, strategy, hw, "after-inference")
                        closed_never = screen(w, strategy.with_(empty_cache="never"), hw, COEF)
                        closed_after = screen(w, strategy.with_(empty_cache="after-inference"), hw, COEF)
                        closed_memory = closed_after.peak_reserved_bytes / closed_never.peak_reserved_bytes - 1
                        closed_time = closed_after.step_time_s / closed_never.step_time_s - 1
                        print(
                            f"| {gpus} | {stage} | {offload} | {'yes' if ckpt else 'no'} | {'yes' if hybrid else 'no'} "
                            f"| {never:.2f} -> {after:.2f} | {after / never - 1:+.1%} | {after_s / never_s - 1:+.1%} "
                            f"| {closed_memory:+.1%} | {closed_time:+.1%} |"
                        )


if __name__ == "__main__":
    main()
