"""A user's ZeRO bucket settings (``Strategy.ds_buckets``): read from a config as DeepSpeed reads it, counted by the
cost model, written back by the renderer, and memplan's own export read back as memplan's own strategy."""

from __future__ import annotations

from typing import Any

import pytest

from launch.ds_config import render_ds_config
from launch.ds_config_read import strategy_from_ds_config
from search import DEFAULT_COEFFICIENTS
from search.single.predict import place
from store.ds_buckets import ZeroBuckets
from store.errors import InputError
from store.gpus import generic_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # noqa: E402

GiB = 2**30
MODEL = get_model("opt-1.3b")
WORKLOAD = Workload(kind="sft", model=MODEL, seq_len=512, global_batch=8)
HARDWARE = Hardware(gpu=generic_gpu(80 * GiB), gpu_memory_bytes=80 * GiB, gpus=1, cpu_memory_bytes=256 * GiB)
FIELDS = (
    "reduce_bucket_size",
    "allgather_bucket_size",
    "overlap_comm",
    "contiguous_gradients",
    "prefetch_bucket_size",
    "param_persistence_threshold",
    "max_live_parameters",
    "max_reuse_distance",
    "sub_group_size",
)


def _config(zero: dict[str, Any]) -> dict[str, Any]:
    return {"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": True}, "zero_optimization": zero}


def _read(zero: dict[str, Any]) -> Strategy:
    strategy, _ = strategy_from_ds_config(_config(zero), 1, hidden_size=MODEL.hidden_size)
    return strategy


def _as_deepspeed_reads_it(zero: dict[str, Any]) -> dict[str, Any]:
    parsed = DeepSpeedZeroConfig(**zero)
    return {name: getattr(parsed, name) for name in FIELDS}


@pytest.mark.parametrize(
    "zero",
    [
        {"stage": 2},
        {"stage": 1, "overlap_comm": True},
        {"stage": 2, "reduce_bucket_size": 5e7, "allgather_bucket_size": 2e8, "contiguous_gradients": False},
        {"stage": 3},
        {"stage": 3, "overlap_comm": False, "stage3_prefetch_bucket_size": 1e7, "stage3_max_reuse_distance": 0},
        {"stage": 3, "sub_group_size": 1e8},
    ],
    ids=["z2-defaults", "z1-overlap", "z2-sizes", "z3-defaults", "z3-keys", "z3-sub-group"],
)
def test_a_configs_buckets_are_those_deepspeed_runs_with(zero: dict[str, Any]) -> None:
    """Every key left out takes DeepSpeed's own default (overlap_comm: on for stage 3 only), as its parser does."""
    buckets = _read(zero).ds_buckets
    assert buckets is not None
    assert buckets.to_dict() == _as_deepspeed_reads_it(zero)


def test_auto_values_are_those_transformers_fills_in() -> None:
    h = MODEL.hidden_size
    zero = {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "overlap_comm": False}
    buckets = _read({**zero, "stage3_param_persistence_threshold": "auto"}).ds_buckets
    assert buckets is not None
    assert (buckets.reduce_bucket_size, buckets.prefetch_bucket_size) == (h * h, int(0.9 * h * h))
    assert buckets.param_persistence_threshold == 10 * h
    with pytest.raises(InputError, match="hidden size"):
        strategy_from_ds_config(_config(zero), 1)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_memplans_own_export_reads_back_as_the_same_strategy(stage: int, offload: str) -> None:
    """A plan's exported config checked again is that plan: its buckets are memplan's, so none are kept."""
    planned = Strategy(zero_stage=stage, offload_optimizer=offload, micro_batch=8)
    config = render_ds_config(planned, WORKLOAD, HARDWARE)
    read, _ = strategy_from_ds_config(config, 1, hidden_size=MODEL.hidden_size)
    assert read.ds_buckets is None
    assert read.with_(empty_cache=planned.empty_cache, allocator=planned.allocator) == planned


def test_the_cost_model_counts_the_configs_reduce_buckets() -> None:
    """ZeRO-2's ``setup_buckets`` makes one ``reduce_bucket_size`` buffer of the gradient dtype, and a second
    with ``overlap_comm`` (stage_1_and_2.py); contiguous_gradients off makes none (without offload)."""
    cases = {
        (5e8, False, True): 1 * 500_000_000 * 2,
        (5e8, True, True): 2 * 500_000_000 * 2,
        (1e8, True, True): 2 * 100_000_000 * 2,
        (5e8, True, False): 0,
    }
    for (size, overlap, contiguous), expected in cases.items():
        zero = {"stage": 2, "reduce_bucket_size": size, "overlap_comm": overlap, "contiguous_gradients": contiguous}
        placed = place(WORKLOAD, _read(zero), HARDWARE, DEFAULT_COEFFICIENTS)
        assert placed.work.backward_buckets == expected, zero


def test_a_larger_overlapped_bucket_raises_the_backwards_peak() -> None:
    """The same step predicted with DeepSpeed's 5e8-element buckets double-buffered holds more in its backward
    than with 1e8-element ones: the prediction of a user's config follows the config."""
    from search import predict

    short = Workload(kind="sft", model=MODEL, seq_len=64, global_batch=1)  # logits far below the buckets

    def backward_peak(size: float) -> int:
        zero = {"stage": 2, "reduce_bucket_size": size, "overlap_comm": True}
        strategy, _ = strategy_from_ds_config(
            {**_config(zero), "train_micro_batch_size_per_gpu": 1}, 1, hidden_size=MODEL.hidden_size
        )
        phases = predict(short, strategy, HARDWARE, DEFAULT_COEFFICIENTS).phases
        return next(p.peak_allocated_bytes for p in phases if p.name == "backward")

    assert backward_peak(5e8) - backward_peak(1e8) == 2 * 2 * (500_000_000 - 100_000_000)


def test_the_renderer_writes_a_strategys_own_buckets_back() -> None:
    zero = {"stage": 2, "reduce_bucket_size": 5e7, "overlap_comm": False, "contiguous_gradients": True}
    strategy = _read(zero)
    rendered = render_ds_config(strategy, WORKLOAD, HARDWARE)["zero_optimization"]
    assert _as_deepspeed_reads_it(rendered) == _as_deepspeed_reads_it(zero)


def test_the_strategy_json_keeps_the_buckets_and_refuses_unknown_keys() -> None:
    strategy = Strategy(zero_stage=2, ds_buckets=ZeroBuckets(reduce_bucket_size=10**8, overlap_comm=True))
    assert Strategy.from_dict(strategy.to_dict()) == strategy
    assert "ds_buckets" not in Strategy(zero_stage=2).to_dict()
    with pytest.raises(InputError, match="unknown key"):
        Strategy.from_dict({"zero_stage": 2, "ds_buckets": {"bucket": 1}})


@pytest.mark.parametrize(
    ("key", "value"),
    [("reduce_bucket_size", -5), ("reduce_bucket_size", 0), ("overlap_comm", "sometimes"), ("reduce_bucket_size", 1.5)],
)  # ("overlap_comm", "yes") is true, as DeepSpeed's pydantic model reads it
def test_bad_bucket_values_are_one_input_error(key: str, value: Any) -> None:
    with pytest.raises(InputError, match=f"zero_optimization.*{key}"):
        _read({"stage": 2, key: value})


def test_zero3_steps_the_optimizer_one_sub_group_at_a_time() -> None:
    """stage3.py ``_prepare_fp32_grad_for_sub_group``: a sub-group's flattened 16-bit gradient and its fp32 upcast
    exist while it steps, so the step's transient bytes follow the config's ``sub_group_size``."""
    trainable = place(WORKLOAD, Strategy(zero_stage=3, micro_batch=8), HARDWARE, DEFAULT_COEFFICIENTS).trainable
    for size in (1e9, 1e8):
        placed = place(WORKLOAD, _read({"stage": 3, "sub_group_size": size}), HARDWARE, DEFAULT_COEFFICIENTS)
        assert placed.states.step_transient == (2 + 4) * min(trainable, int(size))


def test_without_overlap_comm_the_reductions_are_not_hidden_behind_the_backward() -> None:
    """overlap_comm off: ZeRO-2 reduces on the compute stream, so none of the collectives' time is hidden
    (``comm_overlap`` is the share hidden when they run on their own stream)."""
    from search import predict

    two = Hardware(gpu=generic_gpu(80 * GiB), gpu_memory_bytes=80 * GiB, gpus=2, cpu_memory_bytes=256 * GiB)
    workload = Workload(kind="sft", model=MODEL, seq_len=512, global_batch=16)
    seconds = {}
    for overlap in (True, False):
        config = {**_config({"stage": 2, "overlap_comm": overlap}), "train_batch_size": 16}
        strategy, _ = strategy_from_ds_config(config, 2, hidden_size=MODEL.hidden_size)
        seconds[overlap] = predict(workload, strategy, two, DEFAULT_COEFFICIENTS).time_breakdown["communication"]
    assert seconds[True] > 0
    assert seconds[False] == pytest.approx(seconds[True] / (1 - DEFAULT_COEFFICIENTS.comm_overlap))
