"""Issue 31: the cost model follows the program the plan is made for (``Workload.framework``).

Each difference is tested as a pure function against the bytes its framework's code makes (read from the
pinned release: TRL 1.16's ``trl/kernels/chunked_logprob.py`` and ``trl/trainer/utils.py``, OpenRLHF 0.11.2's
``get_train_ds_config``), then in the prediction it changes. The default framework moves nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from search import DEFAULT_COEFFICIENTS, predict
from search.choose.single_space import inner_choices
from search.frameworks import differences, modelled
from search.model.fused_head import (
    TOKEN_CHUNK_SIZE,
    VOCAB_CHUNK_SIZE,
    scored_tokens,
    trl_fused_head,
    workload_head,
)
from search.rlhf.job import rlhf_context
from search.rlhf.models import trained_model
from store.ds_buckets import DS_ALLGATHER_BUCKET_SIZE, DS_REDUCE_BUCKET_SIZE
from store.ds_defaults import ZERO12_BUCKET_ELEMENTS
from store.errors import InputError
from store.frameworks import FRAMEWORKS, check_framework, framework_buckets
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, RLHFStrategy, Strategy, TrainedModelStrategy, Workload

GIB = 2**30
C = DEFAULT_COEFFICIENTS
QWEN = get_model("qwen2.5-1.5b")
A10 = get_gpu("A10")
ONE_24G = Hardware(A10, 24 * GIB, gpus=1, nodes=1, cpu_memory_bytes=64 * GIB)
# The case: qwen2.5-1.5b DPO with LoRA 16, checkpointing, 8 pairs per micro-batch
DPO_LORA = Strategy(zero_stage=0, gradient_checkpointing=True, lora_rank=16, micro_batch=8, grad_accum=1)


def _dpo(framework: str) -> Workload:
    return Workload("dpo", QWEN, seq_len=512, global_batch=8, framework=framework)


# --- TRL's fused head, byte by byte -------------------------------------------------------------------------


def test_fused_head_bytes_follow_chunked_logprob() -> None:
    n, h, v = 8176, QWEN.hidden_size, QWEN.vocab_size
    head = trl_fused_head(QWEN, n, "bf16", head_trainable=True, outputs=("log_probs", "entropy"))
    assert head.hidden_copy == 2 * n * h  # hidden_states[mask], saved for backward
    assert head.tile == TOKEN_CHUNK_SIZE * VOCAB_CHUNK_SIZE * 2  # mm_buf: 4096 x 32768 whatever the vocabulary
    # 7 running statistics, log_z, log_probs and entropy: fp32 vectors of N
    assert head.vectors == (7 + 1 + 2) * 4 * n
    assert head.saved_vectors == 2 * 4 * n  # log_z and the entropy
    assert head.grad_hidden == 4 * n * h and head.grad_weight == 4 * v * h  # fp32 accumulators
    assert head.casts == 2 * n * h + 2 * v * h  # .to(bf16) of both at return
    assert head.forward == head.hidden_copy + head.tile + head.vectors
    assert head.backward == (
        head.hidden_copy + head.saved_vectors + head.tile + head.grad_hidden + head.grad_weight + head.casts
    )
    # nowhere near the (tokens, vocab) logits: 2 bytes x n x v is 2.3 GiB alone
    assert head.backward < 2 * n * v


def test_fused_head_without_a_trained_head_or_in_fp32() -> None:
    lora = trl_fused_head(QWEN, 100, "bf16", head_trainable=False)
    assert lora.grad_weight == 0 and lora.casts == 2 * 100 * QWEN.hidden_size
    assert lora.tile == 100 * VOCAB_CHUNK_SIZE * 2  # fewer tokens than a tile: min(N, 4096) rows
    fp32 = trl_fused_head(QWEN, 100, "fp32", head_trainable=True)
    assert fp32.casts == 0  # .to(torch.float32) of an fp32 tensor is the tensor itself
    assert fp32.sizes()[0] == fp32.hidden_copy  # made first, then the tile


def test_scored_tokens_are_the_shifted_labels() -> None:
    assert scored_tokens("sft", 4, 512) == 4 * 511
    assert scored_tokens("dpo", 16, 512) == 16 * 511
    assert scored_tokens("grpo", 8, 512, gen_len=256) == 8 * 256  # only the completion is labelled


def test_only_trl_workloads_get_the_fused_head() -> None:
    assert workload_head(_dpo("trl"), 0, 16, 512) is not None
    for framework in FRAMEWORKS:
        if framework != "trl":
            assert workload_head(_dpo(framework), 0, 16, 512) is None
    reward = Workload("reward", QWEN, seq_len=512, global_batch=8, framework="trl")
    assert workload_head(reward, 0, 8, 512) is None  # a scalar head: no vocabulary


# --- the DPO case -----------------------------------------------------------------------------------


def test_trl_dpo_does_not_count_the_logits() -> None:
    ours = predict(_dpo("deepspeed"), DPO_LORA, ONE_24G, C)
    trl = predict(_dpo("trl"), DPO_LORA, ONE_24G, C)
    assert ours.breakdown["logits"] > 16 * GIB  # the issue: 16.2 of 20.1 GiB
    assert not ours.fits
    head = trl_fused_head(QWEN, scored_tokens("dpo", 16, 512), "bf16", head_trainable=False)
    assert trl.breakdown.get("logits", 0) <= head.backward + head.forward  # at most the head's own tensors
    assert trl.peak_allocated_bytes < ours.peak_allocated_bytes - 14 * GIB


def test_trl_dpo_runs_the_reference_after_the_policy_forward() -> None:
    ours = predict(_dpo("deepspeed"), DPO_LORA, ONE_24G, C)
    trl = predict(_dpo("trl"), DPO_LORA, ONE_24G, C)
    assert [p.name for p in ours.phases][:3] == ["reference_forward", "forward", "backward"]
    assert [p.name for p in trl.phases][:3] == ["forward", "reference_forward", "backward"]
    # beside the policy's saved activations: more than the policy's own forward
    by_name = {p.name: p for p in trl.phases}
    assert by_name["reference_forward"].peak_allocated_bytes > by_name["forward"].peak_allocated_bytes


def test_trl_refuses_liger_and_searches_its_own_cache_policies() -> None:
    sft = Workload("sft", QWEN, seq_len=512, global_batch=8, framework="trl")
    with pytest.raises(InputError, match="fused log-prob head"):
        predict(sft, Strategy(micro_batch=8, loss="chunked"), ONE_24G, C)
    choices = inner_choices(sft, ONE_24G)
    assert {loss for *_, loss in choices} == {"hf"}
    assert {policy for _, _, policy, _, _ in choices} == {"never", "every-step"}
    ours = inner_choices(replace(sft, framework="deepspeed"), ONE_24G)
    assert {loss for *_, loss in ours} == {"hf", "chunked"}


def test_frameworks_without_a_modelled_difference_predict_as_memplan() -> None:
    sft = Workload("sft", QWEN, seq_len=512, global_batch=8)
    strategy = Strategy(zero_stage=2, offload_optimizer="cpu", micro_batch=4, grad_accum=2)
    ours = predict(sft, strategy, ONE_24G, C)
    for framework in ("hf", "accelerate"):
        theirs = predict(replace(sft, framework=framework), strategy, ONE_24G, C)
        assert theirs.peak_reserved_bytes == ours.peak_reserved_bytes, framework


def test_deepspeed_chat_sft_holds_the_logits_through_the_backward() -> None:
    sft = Workload("sft", QWEN, seq_len=512, global_batch=8)
    strategy = Strategy(zero_stage=2, offload_optimizer="cpu", micro_batch=4, grad_accum=2)
    ours = predict(sft, strategy, ONE_24G, C)
    chat = predict(replace(sft, framework="deepspeed-chat"), strategy, ONE_24G, C)
    # step 1's `outputs` keeps the 16-bit logits: 2 bytes x 4 x 512 x vocabulary more at the backward
    held = 2 * 4 * 512 * QWEN.vocab_size
    backward = {p.name: p.peak_allocated_bytes for p in ours.phases}["backward"]
    assert {p.name: p.peak_allocated_bytes for p in chat.phases}["backward"] - backward == held
    assert differences("deepspeed-chat", "hf", "sft") == [
        "planned for deepspeed-chat (the model output (its logits) held through the backward); transformers 5.23 "
        "runs only the loss kept through the backward"
    ]


# --- OpenRLHF's own DeepSpeed config --------------------------------------------------------------------------


def test_openrlhf_buckets_are_deepspeeds_defaults() -> None:
    buckets = framework_buckets("openrlhf", 2, QWEN.hidden_size, True)
    assert buckets is not None
    assert buckets.reduce_bucket_size == DS_REDUCE_BUCKET_SIZE  # "auto" dropped: DeepSpeed's 5e8
    assert buckets.allgather_bucket_size == DS_ALLGATHER_BUCKET_SIZE
    assert buckets.overlap_comm and buckets.contiguous_gradients  # --ds.overlap_comm
    assert not framework_buckets("openrlhf", 2, QWEN.hidden_size, False).overlap_comm  # type: ignore[union-attr]
    for framework in FRAMEWORKS:
        if framework != "openrlhf":
            assert framework_buckets(framework, 2, QWEN.hidden_size, True) is None


def test_openrlhf_actor_runs_with_its_buckets() -> None:
    opt = get_model("opt-1.3b")
    rlhf = dict(seq_len=512, global_batch=8, prompt_len=256, gen_len=256)
    layout = TrainedModelStrategy(zero_stage=2)
    hardware = Hardware(get_gpu("A100-80G"), 80 * GIB, gpus=1, nodes=1, cpu_memory_bytes=64 * GIB)
    for framework, elements in (("deepspeed", ZERO12_BUCKET_ELEMENTS), ("openrlhf", DS_REDUCE_BUCKET_SIZE)):
        workload = Workload("remax", opt, framework=framework, **rlhf)  # type: ignore[arg-type]
        placed = trained_model(rlhf_context(workload, hardware, C), "actor", layout, 1)
        assert placed.work.reduce_bucket == 2 * elements, framework
        assert placed.work.backward_buckets == 2 * 2 * elements, framework  # two with overlap_comm, bf16
    strategy = RLHFStrategy(actor=layout, critic=None, micro_batch=8, generation_batch=4)
    ours = predict(Workload("remax", opt, **rlhf), strategy, hardware, C)  # type: ignore[arg-type]
    theirs = predict(Workload("remax", opt, framework="openrlhf", **rlhf), strategy, hardware, C)  # type: ignore[arg-type]
    # the larger buckets are made in the backward and cached by the allocator for the rest of the step
    assert theirs.peak_reserved_bytes > ours.peak_reserved_bytes


def test_trl_grpo_actor_trains_through_the_fused_head() -> None:
    small = get_model("opt-350m")
    rlhf = dict(seq_len=512, global_batch=8, prompt_len=256, gen_len=256, samples_per_prompt=4)
    strategy = RLHFStrategy(critic=None, micro_batch=8, grad_accum=4, generation_batch=2)
    hardware = Hardware(get_gpu("A100-80G"), 80 * GIB, gpus=1, nodes=1, cpu_memory_bytes=64 * GIB)
    ours = predict(Workload("grpo", small, **rlhf), strategy, hardware, C)  # type: ignore[arg-type]
    trl = predict(Workload("grpo", small, framework="trl", **rlhf), strategy, hardware, C)  # type: ignore[arg-type]
    ours_training = {p.name: p for p in ours.phases}["actor_training"]
    trl_training = {p.name: p for p in trl.phases}["actor_training"]
    assert trl_training.peak_allocated_bytes < ours_training.peak_allocated_bytes


# --- the workloads each program runs, and what an export of another framework's plan says -------------------


@pytest.mark.parametrize(
    ("framework", "kind"), [("hf", "dpo"), ("openrlhf", "sft"), ("verl", "dpo"), ("trl", "ppo"), ("trl", "remax")]
)
def test_a_framework_that_does_not_run_the_workload_is_refused(framework: str, kind: str) -> None:
    with pytest.raises(InputError) as err:
        check_framework(framework, kind)
    assert "\n" not in str(err.value) and f"--framework {framework} runs" in str(err.value)


def test_an_unknown_framework_is_one_line() -> None:
    with pytest.raises(InputError, match="--framework must be one of deepspeed, hf"):
        check_framework("megatron", "sft")


def test_differences_name_each_modelled_aspect_once() -> None:
    assert differences("trl", "trl", "dpo") == []
    assert differences("deepspeed-chat", "deepspeed", "dpo") == []  # nothing modelled apart for dpo
    lines = differences("trl", "deepspeed", "dpo")
    assert len(lines) == 3 and "fused log-prob head" in lines[0] and "reference forward" in lines[1]
    assert "nn.Dropout modules at p = 0" in lines[2]  # TRL's disable_dropout (tests/search/test_framework_mechanisms)
    assert len(differences("trl", "hf", "sft")) == 1
    assert differences("openrlhf", "verl", "ppo")[0] == (
        "planned for openrlhf (OpenRLHF's own DeepSpeed config (DeepSpeed's default buckets, 5e8 elements)); veRL "
        "0.9.1 runs the exported DeepSpeed config's ZeRO buckets"
    )
    assert len(differences("openrlhf", "verl", "ppo")) == 3  # and the frozen models' prefetch, the rollout engine
    assert "lm_head" not in modelled("trl", "reward")
