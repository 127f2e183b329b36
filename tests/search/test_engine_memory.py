"""The rollout engines' memory rules (search.rollout), each pinned by a hand-derived case.

Every expected number is computed here from the rule as the engine's source states it (vLLM 0.19.1 and SGLang
0.5.23, their PyPI wheels), not by the code under test; each test names the file and function it follows.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import pytest

from search.coefficients import DEFAULT_COEFFICIENTS
from search.model.activations import activations
from search.rollout.engine_memory import EngineMemory
from search.rollout.engine_setup import EngineLimits, EngineSetup
from search.rollout.engine_shape import EngineRefusal, kv_bytes_per_token, weights_per_gpu
from search.rollout.sglang_rules import sglang_capture_sizes, sglang_memory
from search.rollout.solve import utilization_range
from search.rollout.vllm_rules import vllm_capture_sizes, vllm_default_batch, vllm_graph_count, vllm_memory
from store.records import ModelSpec

GIB = 2**30
GPU = 80 * GIB + 1  # one byte over 80 GiB: total x u is never a whole number of bytes
# Round coefficients so that the hand arithmetic stays readable.
COEF = DEFAULT_COEFFICIENTS.with_(
    rollout_non_torch_bytes=256 * 2**20,
    rollout_tp_comm_bytes=GIB,
    cuda_context_bytes=512 * 2**20,
    rollout_graph_bytes_per_capture=2**20,
)
# A Qwen2.5-7B shape: 28 layers, 28 query heads and 4 KV heads of 128, bf16.
QWEN7B = ModelSpec(
    name="qwen2.5-7b-like",
    model_type="qwen2",
    hidden_size=3584,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    head_dim=128,
    intermediate_size=18944,
    vocab_size=152064,
    max_positions=32768,
    tie_word_embeddings=False,
    gated_mlp=True,
    dropout=0.0,
    total_params=7_615_616_512,
    layer_params=233_057_792,
    embedding_params=544_997_376,
    lm_head_params=544_997_376,
)
LAYER_PAGE = 16 * 2 * 4 * 128 * 2  # one layer's page at tp=1: 2 x block_size x heads x head_size x bf16 bytes


def _setup(
    engine: str, *, block: int, enforce_eager: bool = False, own_process: bool = True, tp: int = 1
) -> EngineSetup:
    # vLLM: max_num_seqs 256, max_num_batched_tokens 8192; SGLang: cuda_graph_max_bs 256, chunked_prefill_size 8192
    limits = EngineLimits(max_num_seqs=256, max_num_batched_tokens=8192, block=block)
    return EngineSetup(engine, QWEN7B, "bf16", tp, GPU, limits, enforce_eager=enforce_eager, own_process=own_process)


def _vllm(u: float, *, enforce_eager: bool = False, own_process: bool = True, **kw: Any) -> EngineMemory:
    args: dict[str, Any] = {"max_model_len": 4096, "coef": COEF}
    args.update(kw)
    setup = _setup("vllm", block=16, enforce_eager=enforce_eager, own_process=own_process)
    return vllm_memory(setup, u, **args)


def _sglang(f: float, free: int, *, enforce_eager: bool = False, page_size: int = 1) -> EngineMemory:
    setup = _setup("sglang", block=page_size, enforce_eager=enforce_eager)
    return sglang_memory(setup, f, free_bytes_at_start=free, coef=COEF)


def test_kv_bytes_per_token_splits_kv_heads_and_replicates_them_past_their_count() -> None:
    # vllm config/model.py ModelConfig.get_num_kv_heads: max(1, num_kv_heads // tp);
    # v1/kv_cache_interface.py AttentionSpec.real_page_size_bytes: 2 x block x heads x head_size x dtype bytes
    assert kv_bytes_per_token(QWEN7B, "bf16", 1) == 28 * 2 * 4 * 128 * 2 == 57344
    assert kv_bytes_per_token(QWEN7B, "bf16", 2) == 57344 // 2
    assert kv_bytes_per_token(QWEN7B, "bf16", 4) == 28 * 2 * 1 * 128 * 2
    assert kv_bytes_per_token(QWEN7B, "bf16", 8) == 28 * 2 * 1 * 128 * 2  # one replicated head a rank
    assert kv_bytes_per_token(QWEN7B, "bf16", 1, kv_cache_dtype="fp8") == 28 * 2 * 4 * 128 * 1


def test_kv_bytes_per_token_of_mla_and_of_layers_without_a_cache() -> None:
    # vllm MLAAttentionSpec.real_page_size_bytes: block x 1 head x (kv_lora_rank + qk_rope_head_dim) x dtype
    # bytes, the same on every rank (get_num_kv_heads returns 1 when use_mla)
    mla = dataclasses.replace(QWEN7B, hf_config={"kv_lora_rank": 512, "qk_rope_head_dim": 64})
    assert kv_bytes_per_token(mla, "bf16", 1) == kv_bytes_per_token(mla, "bf16", 8) == 28 * 576 * 2
    # a layer that reuses another's cache (kv_windows -1) keeps none; sliding layers count in full
    # (kv_cache_utils.unify_hybrid_kv_cache_specs makes every SlidingWindowSpec a FullAttentionSpec)
    shared = dataclasses.replace(QWEN7B, kv_windows=(0, 4096) * 10 + (-1,) * 8)
    assert kv_bytes_per_token(shared, "bf16", 1) == 20 * 2 * 4 * 128 * 2


def test_requested_is_the_ceiling_of_total_times_utilization() -> None:
    # vllm v1/worker/utils.py request_memory: math.ceil(total_memory * gpu_memory_utilization)
    memory = _vllm(0.9)
    assert memory.requested == math.ceil(GPU * 0.9) == 77_309_411_329


def test_kv_cache_is_requested_minus_non_kv_in_whole_blocks() -> None:
    # vllm gpu_worker.Worker.determine_available_memory: requested - (weights + torch peak + non-torch);
    # kv_cache_utils.get_num_blocks: available // page_size // num_layers
    m = _vllm(0.9)
    assert m.weights == 7_615_616_512 * 2
    assert m.non_torch == 256 * 2**20
    available = math.ceil(GPU * 0.9) - (7_615_616_512 * 2 + m.activation_peak + 256 * 2**20)
    blocks = available // LAYER_PAGE // 28
    assert m.kv_tokens == blocks * 16
    assert m.kv_cache == blocks * LAYER_PAGE * 28
    assert 0 <= m.requested - (m.weights + m.activation_peak + m.non_torch + m.kv_cache) < LAYER_PAGE * 28
    assert m.awake == m.requested + m.cuda_graphs + m.context


def test_activation_peak_is_the_profile_runs_forward_or_sampler() -> None:
    # gpu_model_runner.GPUModelRunner.profile_run: _dummy_run(max_num_batched_tokens) over min(tokens, max_num_seqs)
    # requests, then _dummy_sampler_run: fp32 logits over the vocabulary, softmax probs and the exponential noise
    tokens, rows, d, h, v = 8192, 256, 2, 3584, 152064
    forward = activations(QWEN7B, 1, tokens, "bf16", "flash_attention_2", False, COEF).forward_working
    sampler = d * (tokens + 2 * rows) * h + (d + 4) * rows * v + 2 * 4 * rows * v
    assert _vllm(0.9).activation_peak == max(forward, sampler)


def test_cuda_graphs_lie_outside_the_budget_and_enforce_eager_drops_them() -> None:
    # config/vllm.py _set_cudagraph_sizes: largest min(2 x 256, 512, 8192) = 512; 1, 2, 4, 8..248 by 8, 256..512
    # by 16 -> 3 + 31 + 17 = 51 sizes; cudagraph_dispatcher.initialize_cudagraph_keys (FULL_AND_PIECEWISE): a
    # piecewise graph at each size and a full decode graph at each size <= max_num_seqs (3 + 31 + 1 = 35)
    assert len(vllm_capture_sizes(256, 8192)) == 51 and vllm_capture_sizes(256, 8192)[-1] == 512
    assert vllm_graph_count(256, 8192) == 51 + 35
    assert vllm_graph_count(1024, 16384) == 51 + 51
    assert vllm_capture_sizes(4, 8192) == (1, 2, 4, 8)
    graphed, eager = _vllm(0.9), _vllm(0.9, enforce_eager=True)
    pool = activations(QWEN7B, 1, 512, "bf16", "flash_attention_2", False, COEF).forward_working
    assert graphed.cuda_graphs == pool + 85 * 2**20 and eager.cuda_graphs == 0
    # 0.19.1 determine_available_memory subtracts the estimate only under VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
    assert graphed.kv_tokens == eager.kv_tokens
    assert graphed.awake - eager.awake == graphed.cuda_graphs
    inside = _vllm(0.9, graphs_in_budget=True)
    assert inside.kv_tokens == (eager.kv_cache - graphed.cuda_graphs) // (LAYER_PAGE * 28) * 16
    assert inside.awake == inside.requested + inside.context


def test_vllm_refuses_when_free_memory_at_start_is_below_requested() -> None:
    # v1/worker/utils.py request_memory: free_memory < requested_memory -> ValueError; the free memory is read
    # after the engine's own CUDA context; vLLM's KV cache does not depend on it
    requested, context = math.ceil(GPU * 0.5), 512 * 2**20
    with pytest.raises(EngineRefusal, match="less than desired GPU memory utilization"):
        _vllm(0.5, free_bytes_at_start=requested + context - 1)
    just = _vllm(0.5, free_bytes_at_start=requested + context)
    assert just.kv_tokens == _vllm(0.5, free_bytes_at_start=GPU).kv_tokens


def test_vllm_refuses_without_room_for_one_max_model_len_sequence() -> None:
    # kv_cache_utils._check_enough_kv_cache_memory: available <= 0 -> "No available memory for the cache blocks";
    # cdiv(max_model_len, block_size) x page_size per layer (FullAttentionSpec.max_memory_usage_bytes) > available
    with pytest.raises(EngineRefusal, match="No available memory"):
        _vllm(0.15)
    m = _vllm(0.3)
    available = m.requested - (m.weights + m.activation_peak + m.non_torch)
    fits = available // (LAYER_PAGE * 28) * 16  # the longest max_model_len whose pages fit
    assert _vllm(0.3, max_model_len=fits).kv_tokens == fits
    with pytest.raises(EngineRefusal, match="max seq len"):
        _vllm(0.3, max_model_len=fits + 1)


def test_sglang_pool_depends_on_the_free_memory_at_start() -> None:
    # mem_cache/kv_cache_configurator.py _profile_available_bytes: rest = free after loading - B x (1 - fraction),
    # B the free memory before loading (after the engine's context); pool_configurator calculate_pool_sizes:
    # tokens = rest // cell_size, floored to pages
    weights, context, cell = 7_615_616_512 * 2, 512 * 2**20, 57344
    for free in (60 * GIB, 70 * GIB):
        b = free - context
        rest = int((b - weights) - b * (1 - 0.8))
        m = _sglang(0.8, free)
        assert m.kv_tokens == rest // cell and m.kv_cache == rest // cell * cell
    assert _sglang(0.8, 70 * GIB).kv_tokens > _sglang(0.8, 60 * GIB).kv_tokens
    assert _sglang(0.8, 60 * GIB, page_size=64).kv_tokens % 64 == 0
    with pytest.raises(EngineRefusal, match="Loaded weights leave no GPU memory"):
        _sglang(0.2, 60 * GIB)  # 0.2 x 59.5 GiB < 14.2 GiB of weights


def test_sglang_graph_sizes_and_what_lies_outside_its_budget() -> None:
    # arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes: 1, 2, 4, 8, 12, 16..256 by 8
    assert sglang_capture_sizes(256) == (1, 2, 4, 8, 12, *range(16, 257, 8))
    assert sglang_capture_sizes(100)[-1] == 100
    m = _sglang(0.8, 60 * GIB)
    assert m.awake == m.requested + m.activation_peak + m.non_torch + m.cuda_graphs + m.context
    assert _sglang(0.8, 60 * GIB, enforce_eager=True).cuda_graphs == 0


def test_sleep_levels_free_the_pool_allocations_and_back_up_weights_at_level_one() -> None:
    # device_allocator/cumem.py CuMemAllocator.sleep: tags "weights" (level 1: copied to pinned host memory) and
    # "kv_cache" leave the GPU, then torch.cuda.empty_cache(); graphs, non-torch and context stay
    m = _vllm(0.9)
    assert m.asleep(0) == m.awake
    assert m.asleep(1) == m.asleep(2) == m.non_torch + m.cuda_graphs + m.context
    assert m.host_backup(1) == 7_615_616_512 * 2 and m.host_backup(2) == m.host_backup(0) == 0
    # SGLang weight_updater.release_memory_occupation releases kv_cache, weights and cuda_graph
    s = _sglang(0.8, 60 * GIB)
    assert s.asleep(2) == s.non_torch + s.context
    with pytest.raises(ValueError):
        m.asleep(3)


def test_context_only_for_an_engine_process_of_its_own_and_tp_adds_comm_buffers() -> None:
    shared = _vllm(0.9, own_process=False)
    assert shared.context == 0 and _vllm(0.9).awake - shared.awake == 512 * 2**20
    tp2 = vllm_memory(_setup("vllm", block=16, enforce_eager=True, tp=2), 0.9, coef=COEF)
    assert tp2.non_torch == 256 * 2**20 + GIB
    kv_proj = 2 * 28 * 3584 * 4 * 128  # K and V projections, replicated with their heads past 4 ranks
    assert weights_per_gpu(QWEN7B, "bf16", 2) == 2 * 7_615_616_512 // 2
    assert weights_per_gpu(QWEN7B, "bf16", 8) == 2 * ((7_615_616_512 - kv_proj) // 8 + kv_proj // 4)


def test_vllm_llm_class_defaults() -> None:
    # engine/arg_utils.py EngineArgs.get_batch_defaults: >= 70 GiB and not an A100: 16384 tokens, 1024 sequences
    assert vllm_default_batch(80 * GIB, "NVIDIA H100 80GB HBM3") == (16384, 1024)
    assert vllm_default_batch(80 * GIB, "NVIDIA A100-SXM4-80GB") == (8192, 256)
    assert vllm_default_batch(24 * GIB) == (8192, 256)


def _solve(engine: str, room: int, free: int | None = None, sequences: int = 300) -> tuple[float, float] | None:
    setup = _setup(engine, block=16 if engine == "vllm" else 1)
    return utilization_range(
        setup, sequences=sequences, tokens_per_sequence=1025, room_bytes=room, free_bytes_at_start=free, coef=COEF
    )


def test_utilization_range_is_exact_at_both_ends() -> None:
    # least: ceil(total x u) - non_kv >= sequences x cdiv(1025, 16) blocks x page x layers (a sequence of 1025
    # tokens takes 65 blocks); most: ceil(total x u) + graphs + context <= room. Both over hundredths.
    probe = _vllm(0.9, max_model_len=1025)
    non_kv = probe.weights + probe.activation_peak + probe.non_torch
    need = 300 * 65 * LAYER_PAGE * 28
    least = math.floor(Fraction(100 * (non_kv + need - 1), GPU)) + 1  # smallest k: ceil(GPU k / 100) >= non_kv + need
    room = 60 * GIB
    outside = probe.cuda_graphs + probe.context
    most = math.floor(Fraction(100 * (room - outside), GPU))  # largest k: GPU k / 100 <= room - outside
    assert least < most
    assert _solve("vllm", room) == (least / 100, most / 100)
    below = _vllm((least - 1) / 100, max_model_len=1025)
    assert below.kv_tokens // 16 < 300 * 65 <= _vllm(least / 100, max_model_len=1025).kv_tokens // 16
    assert _vllm((most + 1) / 100, max_model_len=1025).awake > room >= _vllm(most / 100, max_model_len=1025).awake
    # None when the least exceeds the most: the room holds less than the KV the rollout needs
    small = math.ceil(GPU * (least / 100)) + outside - 1
    assert _solve("vllm", small) is None
    assert _solve("vllm", small + 1) == (least / 100, least / 100)


def test_utilization_range_of_sglang_moves_with_the_free_memory() -> None:
    # SGLang's pool is fraction x B - weights (B = free at start - context): more free memory, smaller fraction
    low, high = _solve("sglang", 70 * GIB, free=60 * GIB), _solve("sglang", 70 * GIB, free=78 * GIB)
    assert low is not None and high is not None and high[0] < low[0]
    b = 60 * GIB - 512 * 2**20
    need = 300 * 1025 * 57344  # page size 1: every token a cell
    least = next(k for k in range(1, 101) if int((b - 7_615_616_512 * 2) - b * (1 - k / 100)) // 57344 * 57344 >= need)
    assert low[0] == least / 100
    with pytest.raises(ValueError, match="free_bytes_at_start"):
        _solve("sglang", 70 * GIB)


def test_an_engine_setup_names_a_vllm_or_sglang_engine_and_each_rule_reads_its_own() -> None:
    # store.rollout.INFERENCE_ENGINES: DeepSpeed's hybrid engine has no start-up rule of its own here
    with pytest.raises(ValueError, match="engine must be vllm or sglang"):
        _setup("hybrid-engine", block=16)
    with pytest.raises(ValueError, match="not 'sglang'"):
        vllm_memory(_setup("sglang", block=1), 0.9, coef=COEF)
    with pytest.raises(ValueError, match="not 'vllm'"):
        sglang_memory(_setup("vllm", block=16), 0.8, free_bytes_at_start=60 * GIB, coef=COEF)
