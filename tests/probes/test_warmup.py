"""Warm-up steps and the spread of the measured steps (fault 3 of the H100 run, issue 15).

ZeRO-3 measured after one warm-up step was about twice its steady step time: DeepSpeed records its
parameter-fetch trace in the first step and prefetches by it from the second. These tests pin the warm-up
count per strategy (and what ``steps`` then means), the trace check against fake and real coordinators, the
spread the clock reports, and one real ZeRO-3 probe on DeepSpeed's CPU accelerator.
"""

from __future__ import annotations

from typing import Any

import pytest
from one_starter import settle_environment

from probes.step.phases import PhaseClock
from probes.step.warmup import ZERO3_WARMUP_STEPS, trace_complete, warmup_steps, zero3_roles
from store.measurements import ProbeRequest
from store.records import FrozenModelStrategy, RLHFStrategy, Strategy, TrainedModelStrategy

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


def rlhf(actor: int = 2, reference: int = 0) -> RLHFStrategy:
    return RLHFStrategy(
        actor=TrainedModelStrategy(actor),
        critic=TrainedModelStrategy(2),
        reference=FrozenModelStrategy(reference),
    )


def test_zero3_needs_two_warmup_steps_anything_else_one() -> None:
    assert ZERO3_WARMUP_STEPS == 2
    for stage in (0, 1, 2):
        assert warmup_steps(Strategy(zero_stage=stage), 5) == (1, None)
    assert warmup_steps(Strategy(zero_stage=3), 5) == (2, None)
    assert warmup_steps(Strategy(zero_stage=3, offload_param="cpu", offload_optimizer="cpu"), 3) == (2, None)
    assert warmup_steps(rlhf(), 4) == (1, None)
    assert warmup_steps(rlhf(actor=3), 4) == (2, None)
    assert warmup_steps(rlhf(reference=3), 4) == (2, None)  # a frozen ZeRO-3 engine records its trace too
    assert zero3_roles(rlhf(actor=3, reference=3)) == ("actor", "reference")


def test_steps_count_all_steps_and_one_is_always_measured() -> None:
    count, note = warmup_steps(Strategy(zero_stage=3), 2)
    assert count == 1 and note is not None and "at least 3 steps" in note and "ZeRO-3" in note
    assert warmup_steps(Strategy(zero_stage=2), 2) == (1, None)
    count, note = warmup_steps(Strategy(zero_stage=2), 1)
    assert count == 0 and note is not None and "at least 2 steps" in note


class Coordinator:
    def __init__(self, complete: bool) -> None:
        self.complete = complete

    def is_complete_trace(self) -> bool:
        return self.complete


class Holder:
    def __init__(self, complete: bool) -> None:
        self.coordinator = Coordinator(complete)

    def get_param_coordinator(self) -> Coordinator:
        return self.coordinator


class Engine:
    def __init__(self, stage: int, optimizer: Any) -> None:
        self.stage, self.optimizer = stage, optimizer

    def zero_optimization_stage(self) -> int:
        return self.stage


class Stage3Optimizer:
    def __init__(self, complete: bool) -> None:
        self.parameter_offload = Holder(complete)


def test_trace_check_reads_trained_and_frozen_stage3_engines() -> None:
    engines = {
        "actor": Engine(3, Stage3Optimizer(True)),  # trained: the optimizer's parameter_offload
        "reference": Engine(3, Holder(False)),  # frozen: DeepSpeedZeRoOffload itself
        "critic": Engine(2, object()),
        "reward": None,
    }
    assert trace_complete(engines) == {"actor": True, "reference": False}


def test_the_clock_reports_the_spread_of_the_measured_steps() -> None:
    now = [0.0]
    clock = PhaseClock("cpu", "never")
    clock._start = lambda: now[0]  # type: ignore[method-assign]
    clock._stop = lambda start: {  # type: ignore[method-assign]
        "allocated": 1,
        "reserved": 1,
        "inactive": 0,
        "retries": 0,
        "ooms": 0,
        "time": now[0] - start,
    }
    durations = [(9.0, 9.0), (1.0, 2.0), (1.5, 2.0), (1.0, 4.0)]  # (forward, backward) per step; step 1 warms up
    for index, (forward, backward) in enumerate(durations):
        clock.start_step()
        with clock.phase("forward"):
            now[0] += forward
        with clock.phase("backward"):
            now[0] += backward
        clock.finish_step(measured=index >= 1)
    spread = clock.spread()
    assert spread["step_time_s"] == {"min": 3.0, "median": 3.5, "max": 5.0, "steps": [3.0, 3.5, 5.0]}
    assert spread["phase_time_s"] == {"forward": [1.0, 1.0, 1.5], "backward": [2.0, 2.0, 4.0]}
    assert PhaseClock("cpu", "never").spread() == {}


@pytest.mark.slow
def test_a_zero3_probe_warms_up_until_the_fetch_trace_is_complete() -> None:
    """A real ZeRO-3 engine on the CPU accelerator: 4 steps are 2 warm-up and 2 measured, the coordinator's
    trace is complete when measuring starts, and the result carries the spread of the measured steps. With
    2 steps, after 1 warm-up step, the trace is still being recorded (what the H100 probe measured)."""
    from probes import run_probe

    settle_environment()
    workload = {"kind": "sft", "model": "tiny", "seq_len": 16, "global_batch": 2, "dtype": "bf16"}
    workload.update(attn_impl="sdpa", hf_configs={"model": LLAMA})
    hardware = {"gpu": "generic-24G", "gpu_memory_bytes": 24 * 2**30, "gpus": 1, "nodes": 1}
    strategy = {"zero_stage": 3, "micro_batch": 2}
    request = ProbeRequest(workload, strategy, hardware, device="cpu", steps=4, timeout_s=1800.0)
    result = run_probe(request)
    detail = f"{result.message}\n{result.extra.get('traceback', '')}\n{result.extra.get('log_tail', '')[-3000:]}"
    assert result.outcome == "ok", detail
    extra = result.extra
    assert extra["warmup_steps"] == 2 and extra["measured_steps"] == 2 and "warmup_note" not in extra
    assert extra["zero3_trace_complete"] == {"model": True}
    step = extra["step_time_s"]
    assert len(step["steps"]) == 2 and 0 < step["min"] <= step["median"] <= step["max"]
    assert set(extra["phase_time_s"]) == {"forward", "backward", "optimizer_step"}

    short = run_probe(ProbeRequest(workload, strategy, hardware, device="cpu", steps=2, timeout_s=1800.0))
    assert short.outcome == "ok", short.message
    assert short.extra["warmup_steps"] == 1 and "at least 3 steps" in short.extra["warmup_note"]
    assert short.extra["zero3_trace_complete"] == {"model": False}
