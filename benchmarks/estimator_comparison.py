"""Model-state bytes per GPU: memplan's cost model against DeepSpeed's own estimators.

Usage: DS_ACCELERATOR=cpu .venv/bin/python benchmarks/estimator_comparison.py
Prints a markdown table (GiB per GPU, mixed-precision Adam, full fine-tune).
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs  # noqa: E402

from search.model.shapes import largest_module_params  # noqa: E402
from search.model.states import model_states  # noqa: E402
from store.models import get_model  # noqa: E402

GiB = 2**30
CASES = [
    # (stage, offload_optimizer, offload_param)
    (2, "none", "none"),
    (2, "cpu", "none"),
    (3, "none", "none"),
    (3, "cpu", "none"),
    (3, "cpu", "cpu"),
]


def deepspeed_gpu_bytes(model_name: str, stage: int, off_opt: str, off_param: str, gpus: int) -> int:
    model = get_model(model_name)
    if stage == 2:
        return estimate_zero2_model_states_mem_needs(model.total_params, gpus, 1, cpu_offload=off_opt != "none")[1]
    return estimate_zero3_model_states_mem_needs(
        model.total_params,
        largest_module_params(model),
        gpus,
        1,
        cpu_offload=off_opt != "none",
        cpu_offload_params=off_param != "none",
    )[1]


def main() -> None:
    print("| model | GPUs | layout | memplan steady | memplan at step | DeepSpeed estimator | at step / DS |")
    print("|---|---|---|---|---|---|---|")
    for name in ("opt-1.3b", "llama-3.1-8b", "qwen2.5-14b"):
        model = get_model(name)
        for gpus in (1, 8):
            for stage, off_opt, off_param in CASES:
                states = model_states(
                    model=model,
                    trainable=model.total_params,
                    frozen=0,
                    dtype="bf16",
                    zero_stage=stage,
                    offload_optimizer=off_opt,
                    offload_param=off_param,
                    world_size=gpus,
                    grad_accum=1,
                )
                ours, peak = states.gpu_total, states.gpu_total + states.step_transient
                theirs = deepspeed_gpu_bytes(name, stage, off_opt, off_param, gpus)
                layout = f"ZeRO-{stage}" + (f" opt->{off_opt}" if off_opt != "none" else "")
                layout += f" param->{off_param}" if off_param != "none" else ""
                print(
                    f"| {name} | {gpus} | {layout} | {ours / GiB:.2f} | {peak / GiB:.2f} | {theirs / GiB:.2f} "
                    f"| {peak / theirs:.3f} |"
                )


if __name__ == "__main__":
    main()
