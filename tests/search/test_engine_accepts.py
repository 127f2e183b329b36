"""Issue 42 part 3: a rollout engine's tensor-parallel size is one the engine accepts for the model, each rule the
engine's own start-up check (``search.rollout.engine_accepts``), and the search and ``predict`` obey it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from search.choose.rollout_space import rollout_options, searched_generations
from search.coefficients import DEFAULT_COEFFICIENTS
from search.predictor import predict
from search.rollout.engine_accepts import accepted_tensor_parallel, tensor_parallel_refusal
from store.errors import InputError
from store.gpus import get_gpu
from store.models import get_model
from store.records import FrozenModelStrategy, Hardware, RLHFStrategy, TrainedModelStrategy, Workload
from store.rollout import RolloutStrategy

ENGINES = ("vllm", "sglang")
GIB = 2**30
QWEN_7B = get_model("qwen2.5-7b")  # 28 attention heads, 4 KV heads


def test_qwen_7b_has_the_heads_the_issue_names() -> None:
    assert (QWEN_7B.num_heads, QWEN_7B.num_kv_heads) == (28, 4)


@pytest.mark.parametrize("engine", ENGINES)
def test_attention_heads_must_divide_by_the_tensor_parallel_size(engine: str) -> None:
    # vLLM ModelConfig.verify_with_parallel_config; SGLang Qwen2Attention: total_num_heads % tp_size == 0
    assert accepted_tensor_parallel(engine, QWEN_7B, (1, 2, 4, 8)) == (1, 2, 4)
    refusal = tensor_parallel_refusal(engine, QWEN_7B, 8) or ""
    assert "Total number of attention heads (28) must be divisible by tensor parallel size (8)" in refusal


@pytest.mark.parametrize("engine", ENGINES)
def test_kv_heads_split_evenly_or_replicate_a_whole_number_of_times(engine: str) -> None:
    # QKVParallelLinear: divide(kv_heads, tp) when kv_heads > tp, divide(tp, kv_heads) when replicated
    replicated = replace(QWEN_7B, num_heads=32, num_kv_heads=2, intermediate_size=16384)
    assert tensor_parallel_refusal(engine, replicated, 8) is None  # each KV head on 4 ranks
    uneven = replace(QWEN_7B, num_heads=48, num_kv_heads=6, intermediate_size=16384)
    assert "KV heads" in (tensor_parallel_refusal(engine, uneven, 4) or "")  # 6 heads over 4 ranks
    assert "KV heads" in (tensor_parallel_refusal(engine, uneven, 8) or "")  # 8 ranks share 6 heads unevenly
    assert tensor_parallel_refusal(engine, uneven, 2) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_the_mlp_width_must_divide_by_the_tensor_parallel_size(engine: str) -> None:
    # MergedColumnParallelLinear: assert all(output_size % tp_size == 0 ...)
    narrow = replace(QWEN_7B, num_heads=32, num_kv_heads=8, intermediate_size=5462)  # 2 x 2731
    assert tensor_parallel_refusal(engine, narrow, 2) is None
    assert "intermediate_size 5462" in (tensor_parallel_refusal(engine, narrow, 4) or "")


@pytest.mark.parametrize("engine", ENGINES)
def test_the_vocabulary_is_padded_to_64_before_it_is_split(engine: str) -> None:
    # VocabParallelEmbedding: pad_vocab_size(vocab, 64), then divided over the ranks
    wide = replace(QWEN_7B, num_heads=128, num_kv_heads=128, intermediate_size=128 * 128, vocab_size=100)
    assert tensor_parallel_refusal(engine, wide, 64) is None  # 100 -> 128 rows
    assert "vocabulary padded to 128" not in (tensor_parallel_refusal(engine, wide, 128) or "")
    odd = replace(wide, vocab_size=130)  # 130 -> 192 rows: not 128-way
    assert "vocabulary padded to 192" in (tensor_parallel_refusal(engine, odd, 128) or "")


def _grpo(model: str = "qwen2.5-7b", framework: str = "deepspeed") -> Workload:
    return Workload(
        kind="grpo",
        model=get_model(model),
        seq_len=512,
        global_batch=64,
        prompt_len=256,
        gen_len=256,
        samples_per_prompt=4,
        dtype="bf16",
        framework=framework,
    )


def _h100s() -> Hardware:
    spec = get_gpu("H100-80G")
    return Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=8, cpu_memory_bytes=1024 * GIB)


def test_the_search_offers_only_accepted_sizes() -> None:
    hardware = _h100s()
    sizes = {r.tensor_parallel for r in rollout_options(_grpo(), hardware)}
    assert sizes == {1, 2, 4}
    llama = {r.tensor_parallel for r in rollout_options(_grpo("llama-3.1-8b"), hardware)}  # 32 heads, 8 KV heads
    assert 8 in llama


def test_predict_refuses_a_size_the_engine_refuses() -> None:
    hardware = _h100s()
    strategy = RLHFStrategy(
        actor=TrainedModelStrategy(3),
        critic=None,
        reference=FrozenModelStrategy(3),
        reward=FrozenModelStrategy(3),
        hybrid_engine=False,
        rollout=RolloutStrategy(engine="vllm", placement="colocate", tensor_parallel=8, sleep_level=2),
        generation_batch=8,
        micro_batch=8,
        grad_accum=4,
    )
    with pytest.raises(InputError, match=r"attention heads \(28\) must be divisible by tensor parallel size \(8\)"):
        predict(_grpo(), strategy, hardware, DEFAULT_COEFFICIENTS)
    accepted = strategy.with_(rollout=RolloutStrategy(engine="vllm", placement="colocate", tensor_parallel=4))
    assert predict(_grpo(), accepted, hardware).peak_reserved_bytes > 0  # tp 4 is predicted


def test_deepspeed_chat_is_offered_no_rollout_engine_and_openrlhf_only_vllm() -> None:
    hardware = _h100s()
    chat = searched_generations(_grpo(framework="deepspeed-chat"), hardware)
    assert chat and all(rollout is None for _, rollout in chat)
    openrlhf = searched_generations(_grpo(framework="openrlhf"), hardware)
    assert openrlhf and {rollout.engine for _, rollout in openrlhf if rollout is not None} == {"vllm"}
    assert all(rollout is not None for _, rollout in openrlhf)


def test_asking_only_for_engines_the_framework_does_not_run_is_one_input_error() -> None:
    hardware = _h100s()
    with pytest.raises(InputError, match=r"--framework openrlhf generates with vllm: --rollout sglang plans none"):
        searched_generations(_grpo(framework="openrlhf"), hardware, ("sglang",))
    with pytest.raises(InputError, match=r"it takes hybrid-engine\)"):
        searched_generations(_grpo(framework="deepspeed-chat"), hardware, ("vllm",))
    # DeepSpeed's own generation alone stays a stand-in (probes and suggestions weigh it for every framework)
    assert searched_generations(_grpo(framework="openrlhf"), hardware, ("hybrid-engine",)) == (
        (True, None),
        (False, None),
    )
