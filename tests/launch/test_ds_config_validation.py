"""Every DeepSpeed config the planner can emit is accepted by DeepSpeed's own config parser.

The single-model strategy space is enumerated in full (ZeRO stage x optimizer/parameter offload x
gradient checkpointing x LoRA x micro batch / accumulation x empty_cache x allocator) for each dtype
and for 1 GPU and 8 GPUs on 2 nodes. The rendered dictionaries are deduplicated (only stage, offload,
batch shape, dtype, world size and the model's hidden size reach the DeepSpeed part) and each
distinct one goes through ``deepspeed.runtime.config.DeepSpeedConfig``, whose pydantic models reject
unknown ZeRO / offload / precision keys (``extra="forbid"``) and whose batch check asserts
``train_batch_size == micro_batch x accumulation x world_size``.

World size without a process group: ``DeepSpeedConfig.__init__`` calls ``deepspeed.comm.get_rank()``
and, when that works and an ``mpu`` is given, takes the data-parallel world size from
``mpu.get_data_parallel_world_size()``. Without an initialized process group ``get_rank`` raises and
DeepSpeed silently falls back to world size 1, so the tests patch ``deepspeed.comm.get_rank`` to
return 0 (pytest's monkeypatch, undone after each test) and pass ``DataParallelOnly`` (tests/conftest.py), an ``mpu``
stand-in that reports the hardware's world size. The parsed ``world_size`` is asserted too, so a
silent fallback to 1 would fail the test.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from tiny_models import make_hardware, make_strategy, make_workload, rough_spec, tiny_llama_spec

from launch.ds_config import EMPTY_CACHE_PLACEMENT, outside_settings, render_ds_config
from store import ds_defaults
from store.errors import InputError
from store.records import ALLOCATORS, DTYPES, EMPTY_CACHE_POLICIES, OFFLOADS, Hardware, ModelSpec, Strategy

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime import constants as ds_constants  # noqa: E402
from deepspeed.runtime.zero.config import ZERO_OPTIMIZATION  # noqa: E402

NVME_PATH = "/local_nvme/memplan"
REPO_ROOT = Path(__file__).resolve().parents[2]
BATCH_SHAPES = ((1, 1), (2, 4), (8, 1))  # (micro_batch, grad_accum)
HARDWARE = {
    "1gpu": make_hardware(gpus=1, nodes=1, nvme_path=NVME_PATH),
    "2x4gpu": make_hardware(gpus=4, nodes=2, nvme_path=NVME_PATH),
}
MODELS = {"rough-h2048": rough_spec(), "tiny-h64": tiny_llama_spec()}
# Strategy fields that must not change the DeepSpeed config (they live outside it).
OUTSIDE_FIELDS = ("gradient_checkpointing", "lora_rank", "empty_cache", "allocator")


def all_strategies() -> list[Strategy]:
    """The whole single-model strategy space (LoRA ranks 0 and 16) that store.records deems valid."""
    strategies = []
    for stage, opt_off, param_off, ckpt, lora, (mb, ga), cache, alloc in itertools.product(
        (0, 1, 2, 3), OFFLOADS, OFFLOADS, (False, True), (0, 16), BATCH_SHAPES, EMPTY_CACHE_POLICIES, ALLOCATORS
    ):
        try:
            strategy = Strategy(
                zero_stage=stage,
                offload_optimizer=opt_off,
                offload_param=param_off,
                gradient_checkpointing=ckpt,
                lora_rank=lora,
                micro_batch=mb,
                grad_accum=ga,
                empty_cache=cache,
                allocator=alloc,
            )
        except InputError:  # e.g. offload without ZeRO, parameter offload below ZeRO-3
            continue
        strategies.append(strategy)
    return strategies


def _render_space() -> tuple[dict[str, tuple[dict[str, Any], Strategy, str, Hardware, ModelSpec]], int]:
    """Render every (strategy, dtype, hardware, model); return the distinct configs and the total."""
    distinct: dict[str, tuple[dict[str, Any], Strategy, str, Hardware, ModelSpec]] = {}
    total = 0
    for strategy in all_strategies():
        for dtype, hardware, model in itertools.product(DTYPES, HARDWARE.values(), MODELS.values()):
            config = render_ds_config(strategy, make_workload(model, dtype=dtype), hardware)
            total += 1
            distinct.setdefault(json.dumps(config), (config, strategy, dtype, hardware, model))
    return distinct, total


DISTINCT, TOTAL_RENDERED = _render_space()


def _case_id(key: str) -> str:
    config, strategy, dtype, hardware, _ = DISTINCT[key]
    zero = config["zero_optimization"]
    return (
        f"z{strategy.zero_stage}-opt_{strategy.offload_optimizer}-par_{strategy.offload_param}-{dtype}"
        f"-mb{strategy.micro_batch}x{strategy.grad_accum}-w{hardware.world_size}"
        f"-rb{zero.get('reduce_bucket_size', 0)}"
    )


def test_space_dedupes_to_ds_relevant_fields() -> None:
    """Distinct configs: stage/offload mixes x batch shapes x dtypes x world sizes (x models for ZeRO-3)."""
    mixes = {(s.zero_stage, s.offload_optimizer, s.offload_param) for s in all_strategies()}
    assert {stage for stage, _, _ in mixes} == {0, 1, 2, 3}
    assert {(opt, par) for stage, opt, par in mixes if stage == 3} >= {("none", "none"), ("cpu", "cpu")}
    per_mix = len(BATCH_SHAPES) * len(DTYPES) * len(HARDWARE)
    expected = sum(per_mix * (len(MODELS) if stage == 3 else 1) for stage, _, _ in mixes)
    assert len(DISTINCT) == expected
    assert len(DISTINCT) * 10 < TOTAL_RENDERED  # the outside fields multiply the space


@pytest.mark.parametrize("key", sorted(DISTINCT), ids=_case_id)
def test_deepspeed_accepts_rendered_config(key: str, parse) -> None:
    config, strategy, dtype, hardware, model = DISTINCT[key]
    ds = parse(config, hardware.world_size)

    known_top_level = {v for v in vars(ds_constants).values() if isinstance(v, str)} | {ZERO_OPTIMIZATION}
    assert set(config) <= known_top_level, set(config) - known_top_level
    assert "activation_checkpointing" not in config

    assert ds.world_size == hardware.world_size
    assert ds.train_batch_size == strategy.micro_batch * strategy.grad_accum * hardware.world_size
    assert ds.train_batch_size == config["train_batch_size"]
    assert ds.train_micro_batch_size_per_gpu == strategy.micro_batch
    assert ds.gradient_accumulation_steps == strategy.grad_accum
    assert ds.gradient_clipping == ds_defaults.GRADIENT_CLIPPING
    assert ds.bfloat16_config.enabled == (dtype == "bf16")
    assert ds.float16_config.enabled == (dtype == "fp16")
    if dtype == "fp16":
        assert ds.float16_config.loss_scale == 0  # dynamic loss scaling
        assert ds.float16_config.initial_scale_power == 16
    assert ds.optimizer_name == "adamw"
    assert ds.optimizer_params["lr"] == ds_defaults.LEARNING_RATE
    assert ds.optimizer_params["weight_decay"] == ds_defaults.WEIGHT_DECAY
    assert ds.wall_clock_breakdown is False

    zero = ds.zero_config
    assert ds.zero_optimization_stage == strategy.zero_stage
    assert ds.zero_enabled == (strategy.zero_stage > 0)
    if strategy.zero_stage in (1, 2):
        assert zero.reduce_bucket_size == ds_defaults.ZERO12_BUCKET_ELEMENTS
        assert zero.allgather_bucket_size == ds_defaults.ZERO12_BUCKET_ELEMENTS
        assert zero.reduce_scatter is True
    if strategy.zero_stage == 3:
        buckets = ds_defaults.zero3_buckets(model)
        assert zero.reduce_bucket_size == buckets.reduce_bucket_size
        assert zero.prefetch_bucket_size == buckets.prefetch_bucket_size
        assert zero.param_persistence_threshold == buckets.param_persistence_threshold
        assert zero.max_live_parameters == buckets.max_live_parameters
        assert zero.max_reuse_distance == buckets.max_reuse_distance
        assert zero.gather_16bit_weights_on_model_save is True
        assert zero.sub_group_size == ds_defaults.ZERO3_SUB_GROUP_SIZE  # left to DeepSpeed's default
    if strategy.zero_stage > 0:
        assert zero.overlap_comm == ds_defaults.OVERLAP_COMM
        assert zero.contiguous_gradients == ds_defaults.CONTIGUOUS_GRADIENTS

    for name, wanted in (("offload_optimizer", strategy.offload_optimizer), ("offload_param", strategy.offload_param)):
        block = getattr(zero, name)
        if wanted == "none":
            assert block is None
            continue
        assert block.device == wanted
        assert block.pin_memory == ds_defaults.PIN_MEMORY
        assert (str(block.nvme_path) if block.nvme_path else None) == (NVME_PATH if wanted == "nvme" else None)


def test_outside_fields_do_not_change_ds_config() -> None:
    """gradient checkpointing, LoRA, empty_cache and allocator live outside the DeepSpeed config."""
    workload, hardware = make_workload(rough_spec()), HARDWARE["2x4gpu"]
    groups: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    for strategy in all_strategies():
        inside = tuple(v for k, v in strategy.to_dict().items() if k not in OUTSIDE_FIELDS)
        groups[inside].add(json.dumps(render_ds_config(strategy, workload, hardware)))
    assert all(len(configs) == 1 for configs in groups.values())


def test_render_is_deterministic_in_fixed_order() -> None:
    strategy = make_strategy(zero_stage=3, offload_optimizer="cpu", offload_param="nvme", micro_batch=4)
    workload, hardware = make_workload(rough_spec(), dtype="fp16"), HARDWARE["1gpu"]
    first = render_ds_config(strategy, workload, hardware)
    assert json.dumps(first) == json.dumps(render_ds_config(strategy, workload, hardware))
    assert list(first) == [
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "bf16",
        "fp16",
        "optimizer",
        "zero_optimization",
        "steps_per_print",
        "wall_clock_breakdown",
    ]
    assert first["zero_optimization"]["offload_param"] == {
        "device": "nvme",
        "pin_memory": ds_defaults.PIN_MEMORY,
        "nvme_path": NVME_PATH,
    }


def test_stage0_and_fp32_shapes() -> None:
    config = render_ds_config(make_strategy(), make_workload(rough_spec(), dtype="fp32"), HARDWARE["1gpu"])
    assert config["zero_optimization"] == {"stage": 0}
    assert config["bf16"] == {"enabled": False}
    assert config["fp16"] == {"enabled": False}


@pytest.mark.parametrize(
    "changes",
    [
        {"zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme"},
        {"zero_stage": 3, "offload_optimizer": "nvme"},
        {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "nvme"},
    ],
)
def test_nvme_without_path_is_input_error(changes: dict[str, Any]) -> None:
    with pytest.raises(InputError, match="nvme offload needs --nvme-path"):
        render_ds_config(make_strategy(**changes), make_workload(rough_spec()), make_hardware(nvme_path=None))


def test_outside_settings_per_policy() -> None:
    texts = {}
    for policy in EMPTY_CACHE_POLICIES:
        settings = outside_settings(make_strategy(empty_cache=policy))
        assert settings["empty_cache"] == EMPTY_CACHE_PLACEMENT[policy]
        texts[policy] = settings["empty_cache"]
    assert len(set(texts.values())) == len(EMPTY_CACHE_POLICIES)
    assert "do not call" in texts["never"]
    for policy in ("after-generation", "after-inference", "after-phase", "every-step"):
        assert "torch.cuda.empty_cache()" in texts[policy]
    assert "generation" in texts["after-generation"]
    assert "inference" in texts["after-inference"]
    assert "every phase" in texts["after-phase"]
    assert "engine.step()" in texts["every-step"]


def test_outside_settings_allocator_checkpointing_lora() -> None:
    plain = outside_settings(make_strategy())
    assert set(plain) == {"gradient_checkpointing", "empty_cache", "PYTORCH_CUDA_ALLOC_CONF"}
    assert plain["PYTORCH_CUDA_ALLOC_CONF"] == ""
    assert "off" in plain["gradient_checkpointing"]

    tuned = outside_settings(make_strategy(gradient_checkpointing=True, lora_rank=16, allocator="expandable-segments"))
    assert tuned["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "gradient_checkpointing_enable(" in tuned["gradient_checkpointing"]
    assert '"use_reentrant": False' in tuned["gradient_checkpointing"]
    assert "r=16" in tuned["lora"]
    assert 'target_modules="all-linear"' in tuned["lora"]


def test_ds_config_module_imports_no_heavy_libraries() -> None:
    """``planner recommend`` imports launch.ds_config on its fast path: no torch/deepspeed/transformers."""
    code = (
        "import sys, launch.ds_config; "
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


def test_parser_checks_what_we_rely_on(parse) -> None:
    """Guard the guard: the parser really checks the batch product and rejects unknown ZeRO keys."""
    strategy = make_strategy(zero_stage=2, micro_batch=2, grad_accum=4)
    hardware = HARDWARE["2x4gpu"]
    config = render_ds_config(strategy, make_workload(rough_spec()), hardware)
    assert parse(config, hardware.world_size).world_size == 8
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        parse(config, 1)
    bogus = json.loads(json.dumps(config))
    bogus["zero_optimization"]["stage3_bogus_knob"] = 1
    with pytest.raises(ValueError, match="stage3_bogus_knob"):
        parse(bogus, hardware.world_size)


def test_nvme_optimizer_offload_below_stage_3_is_refused() -> None:
    """ZeRO-1/2 keep 'nvme'-offloaded optimizer states in host memory (stage_1_and_2.py only checks
    device != none), so the planner refuses the setting rather than promise NVMe it would not get."""
    with pytest.raises(InputError, match="nvme needs zero_stage 3"):
        make_strategy(zero_stage=2, offload_optimizer="nvme")


def test_a_chunked_loss_says_how_to_turn_it_on_outside_the_config() -> None:
    from launch.ds_config import outside_settings
    from store.records import Strategy

    assert "loss" not in outside_settings(Strategy())
    said = outside_settings(Strategy(loss="chunked"))["loss"]
    assert "use_liger_kernel=True" in said and "planner.runtime.chunked_causal_lm_loss" in said
