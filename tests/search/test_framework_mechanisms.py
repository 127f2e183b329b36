"""Issue 31's leftovers: TRL's ``disable_dropout``, OpenRLHF's frozen-model config, veRL's rollout engine.

Each difference is a pure function of the framework's code at its pinned version (``store.frameworks.VERSIONS``),
tested byte by byte, then in the prediction it changes: the plan for the framework differs from memplan's own
loop's by exactly that mechanism (the same workload with ``framework`` changed and nothing else).
"""

from __future__ import annotations

from dataclasses import replace

from search import DEFAULT_COEFFICIENTS, predict
from search.frameworks import differences, modelled
from search.model.activations import activations, layer_saved_tensors
from search.model.placement import frozen_placement
from search.model.shapes import largest_module_params
from search.rlhf.engine import engine_limits
from search.rlhf.job import rlhf_context
from search.rlhf.models import frozen_model
from store.ds_buckets import DS_PREFETCH_BUCKET_SIZE
from store.ds_defaults import zero3_buckets
from store.frameworks import (
    FRAMEWORKS,
    VERL_VLLM_BATCH,
    framework_engine_batch,
    framework_frozen_buckets,
    framework_sleep_level,
    openrlhf_eval_buckets,
)
from store.gpus import get_gpu
from store.models import get_model
from store.module_dropout import without_module_dropout, workload_as_run
from store.records import FrozenModelStrategy, Hardware, RLHFStrategy, Strategy, TrainedModelStrategy, Workload
from store.rollout import RolloutStrategy

GIB = 2**30
C = DEFAULT_COEFFICIENTS
GPT2 = get_model("gpt2-large")
H100 = get_gpu("H100-80G")
ONE_80G = Hardware(H100, 80 * GIB, gpus=1, nodes=1, cpu_memory_bytes=256 * GIB)
EIGHT_80G = Hardware(H100, 80 * GIB, gpus=8, nodes=1, cpu_memory_bytes=1024 * GIB)


# --- TRL's disable_dropout (DPOConfig, RewardConfig: True) ------------------------------------------------------


def test_trl_dpo_and_reward_run_the_models_without_module_dropout() -> None:
    dpo = Workload("dpo", GPT2, seq_len=512, global_batch=4, framework="trl", ref_model=GPT2)
    run = workload_as_run(dpo)
    for spec in (run.model, run.ref_model):
        assert spec is not None and spec.dropout == 0.0
        assert all(spec.hf_config[key] == 0.0 for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop"))
    assert workload_as_run(replace(dpo, kind="reward", ref_model=None)).model.dropout == 0.0
    # the default loop, TRL's SFT (no disable_dropout key) and GRPO (default False) keep it
    for other in (replace(dpo, framework="deepspeed"), replace(dpo, kind="sft", ref_model=None)):
        assert workload_as_run(other) is other
    # OPT's dropout is functional (modeling_opt.py: nn.functional.dropout(p=self.dropout)): untouched
    opt = get_model("opt-1.3b")
    assert without_module_dropout(opt) is opt


def test_no_dropout_drops_the_masks_from_the_formulas() -> None:
    formula = replace(GPT2, activation_terms={})
    off = without_module_dropout(formula)
    b, s, h = 4, 512, GPT2.hidden_size
    on_saved = layer_saved_tensors(formula, b, s, "bf16", "sdpa", C)
    off_saved = layer_saved_tensors(off, b, s, "bf16", "sdpa", C)
    # the two residual dropout masks (one byte per element) are gone, nothing else
    assert sum(on_saved) - sum(off_saved) == 2 * b * s * h
    assert list(off_saved) == [t for t in on_saved if t != b * s * h]


def test_no_dropout_traced_terms_lose_every_mask() -> None:
    off = without_module_dropout(GPT2)
    assert off.activation_terms != GPT2.activation_terms and off.activation_digest != GPT2.activation_digest
    b, s, h, layers = 4, 512, GPT2.hidden_size, GPT2.num_layers
    on_saved = sum(layer_saved_tensors(GPT2, b, s, "bf16", "sdpa", C))
    off_saved = sum(layer_saved_tensors(off, b, s, "bf16", "sdpa", C))
    assert on_saved - off_saved == 2 * b * s * h  # traced: the same two one-byte masks per layer
    on = activations(GPT2, b, s, "bf16", "sdpa", False, C)
    no = activations(off, b, s, "bf16", "sdpa", False, C)
    # every layer's two masks and the embedding dropout's mask (GPT2Model.drop)
    assert on.saved - no.saved == layers * 2 * b * s * h + b * s * h


def test_trl_dpo_plan_is_the_plan_of_the_model_without_dropout() -> None:
    dpo = Workload("dpo", GPT2, seq_len=512, global_batch=4, framework="trl")
    strategy = Strategy(zero_stage=2, micro_batch=2, grad_accum=2)
    off = without_module_dropout(GPT2)
    trl, trl_off = predict(dpo, strategy, ONE_80G, C), predict(replace(dpo, model=off), strategy, ONE_80G, C)
    assert trl.peak_allocated_bytes == trl_off.peak_allocated_bytes and trl.step_time_s == trl_off.step_time_s
    # memplan's own loop keeps GPT-2's dropout: the same plan differs by exactly the masks (4 sequences of 512
    # tokens: two one-byte masks per layer and the embedding's) and the dropout kernels' time
    ours = predict(replace(dpo, framework="deepspeed"), strategy, ONE_80G, C)
    ours_off = predict(replace(dpo, framework="deepspeed", model=off), strategy, ONE_80G, C)
    b, s, h = 4, 512, GPT2.hidden_size
    masks = GPT2.num_layers * 2 * b * s * h + b * s * h
    peaks = {p.name: p.peak_allocated_bytes for p in ours.phases}
    peaks_off = {p.name: p.peak_allocated_bytes for p in ours_off.phases}
    assert peaks["forward"] - peaks_off["forward"] == masks and peaks["backward"] - peaks_off["backward"] == masks
    assert ours_off.step_time_s < ours.step_time_s
    assert "dropout" in modelled("trl", "dpo") and "dropout" not in modelled("trl", "sft")
    assert any("nn.Dropout modules at p = 0" in line for line in differences("trl", "deepspeed", "dpo"))


# --- OpenRLHF's frozen models: get_eval_ds_config -----------------------------------------------------------------


def test_openrlhf_frozen_models_prefetch_deepspeeds_default() -> None:
    llama = get_model("llama-3.1-8b")
    buckets = openrlhf_eval_buckets(llama.hidden_size)
    assert buckets.prefetch_bucket_size == DS_PREFETCH_BUCKET_SIZE == 50_000_000
    assert buckets.param_persistence_threshold == 100_000 and buckets.overlap_comm  # stage 3's dynamic default
    for framework in FRAMEWORKS:
        assert (framework_frozen_buckets(framework, llama.hidden_size) is None) == (framework != "openrlhf")
    block = FrozenModelStrategy(zero_stage=3)
    ours = frozen_placement(llama, True, block, "bf16", 8)
    theirs = frozen_placement(llama, True, block, "bf16", 8, DS_PREFETCH_BUCKET_SIZE)
    assert theirs.gathered - ours.gathered == 2 * (DS_PREFETCH_BUCKET_SIZE - zero3_buckets(llama).prefetch_bucket_size)
    assert (theirs.resident, theirs.host, theirs.params) == (ours.resident, ours.host, ours.params)
    # ZeRO-0 frozen models (OpenRLHF's when the trained ones are not ZeRO-3) gather nothing: no difference
    whole = FrozenModelStrategy(zero_stage=0)
    assert frozen_placement(llama, True, whole, "bf16", 8, DS_PREFETCH_BUCKET_SIZE).gathered == 0


def test_openrlhf_plan_scores_with_the_larger_prefetch() -> None:
    llama = get_model("llama-3.1-8b")
    rlhf = dict(seq_len=1024, global_batch=64, prompt_len=512, gen_len=512)
    block = FrozenModelStrategy(zero_stage=3)
    for framework in ("deepspeed", "openrlhf"):
        workload = Workload("ppo", llama, framework=framework, **rlhf)  # type: ignore[arg-type]
        ctx = rlhf_context(workload, EIGHT_80G, C)
        placed = frozen_model(ctx, "reference", block)
        assert placed is not None
        expected = zero3_buckets(llama).prefetch_bucket_size if framework == "deepspeed" else DS_PREFETCH_BUCKET_SIZE
        assert placed.gathered == 2 * (largest_module_params(llama) + expected), framework
    assert "frozen_buckets" in modelled("openrlhf", "ppo")
    assert any("eval config" in line for line in differences("openrlhf", "deepspeed", "ppo"))


# --- veRL's rollout engine ------------------------------------------------------------------------------------------


def test_verl_starts_vllm_with_its_own_batch_limits() -> None:
    assert VERL_VLLM_BATCH == (8192, 256)  # _generated_ppo_trainer.yaml actor_rollout_ref.rollout
    ours = engine_limits("vllm", 80 * GIB, "H100-80G")
    verl = engine_limits("vllm", 80 * GIB, "H100-80G", "verl")
    assert (ours.max_num_batched_tokens, ours.max_num_seqs) == (16384, 1024)  # vllm.LLM on a big GPU
    assert (verl.max_num_batched_tokens, verl.max_num_seqs) == VERL_VLLM_BATCH and verl.block == ours.block
    assert framework_engine_batch("verl", "sglang") is None and framework_engine_batch("openrlhf", "vllm") is None


def test_verl_sleeps_a_colocated_engine_at_level_two() -> None:
    assert framework_sleep_level("verl", 1, 0) == 2
    assert framework_sleep_level("verl", 2, 16) == 1  # LoRA served as an adapter
    assert framework_sleep_level("verl", 0, 0) == 0  # free_cache_engine=False: never sleeps
    assert framework_sleep_level("openrlhf", 1, 0) == 1 and framework_sleep_level("trl", 1, 0) == 1


def test_verl_plan_runs_its_engine_as_veRL_starts_it() -> None:
    qwen = get_model("qwen2.5-1.5b")
    rlhf = dict(seq_len=1536, global_batch=512, prompt_len=512, gen_len=1024, samples_per_prompt=8)
    strategy = RLHFStrategy(
        actor=TrainedModelStrategy(zero_stage=3, gradient_checkpointing=True),
        critic=None,
        hybrid_engine=False,
        generation_batch=4,
        micro_batch=8,
        grad_accum=64,
        rollout=RolloutStrategy(engine="vllm", gpu_memory_utilization=0.5, sleep_level=1),
    )
    ours = predict(Workload("grpo", qwen, **rlhf), strategy, EIGHT_80G, C)  # type: ignore[arg-type]
    verl = predict(Workload("grpo", qwen, framework="verl", **rlhf), strategy, EIGHT_80G, C)  # type: ignore[arg-type]
    assert ours.rollout is not None and verl.rollout is not None
    assert ours.rollout["sleep_level"] == 1 and verl.rollout["sleep_level"] == 2
    # 512 sequences per GPU: vLLM's own max_num_seqs (1024) lets the KV cache run them at once, veRL's 256 in two
    # waves; its 8192-token profile run leaves more of the same share to the KV cache
    assert ours.rollout["max_running_sequences"] >= 512 and verl.rollout["max_running_sequences"] == 256
    assert verl.rollout["kv_cache_tokens"] > ours.rollout["kv_cache_tokens"]
    # level 2 keeps no host copy of the weights (vLLM's level 1 does, pinned)
    assert ours.rollout["host_backup_bytes"] > 0 and verl.rollout["host_backup_bytes"] == 0
    assert verl.host_bytes < ours.host_bytes and verl.step_time_s > ours.step_time_s
    assert "rollout_engine" in modelled("verl", "grpo")
