"""Bytes per GPU that only an RLHF step has: the rollout buffer, generation and the scoring forwards,
and the actor's and critic's training moments with the other model's carried gradients.

The models of a DeepSpeed-Chat / OpenRLHF step 3 stay on the GPU together (:mod:`search.model.placement`).
Pure functions, cached on their (hashable) arguments: an RLHF search predicts thousands of strategies that
share these pieces.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from search.coefficients import Coefficients
from search.model.activation_sources import traced_terms
from search.model.activations import activations, logits_bytes
from search.model.micro_batch import MicroBatchContext
from search.model.moment_parts import TRAINING_PHASES, NamedTensors
from search.model.placement import TrainedPlacement, micro_step
from search.model.shapes import kv_tokens_held
from search.streams.phases import Live, live, live_of
from store.activation_terms import GENERATION_WINDOWS, left_by, peak_of
from store.records import DTYPE_BYTES, ModelSpec


def experience_bytes(sequences: int, seq_len: int, dtype: str) -> int:
    """The rollout buffer: token ids and attention mask (int64) plus log-probs, reference log-probs,
    values and rewards (compute dtype) for every token of the step's sequences."""
    return sequences * seq_len * (16 + 4 * DTYPE_BYTES[dtype])


# --- generation ---------------------------------------------------------------------------------------


def traced_windows(model: ModelSpec, dtype: str, attn_impl: str) -> dict[str, Any] | None:
    """The model's traced generation and scoring windows (``store.activation_terms.GENERATION_WINDOWS``, as
    ``probes.trace.generation`` reads them from transformers' generate), or None: formulas."""
    traced = traced_terms(model, dtype, attn_impl)
    if traced is None or not all(w in traced["windows"] for w in GENERATION_WINDOWS):
        return None
    return dict(traced["windows"])


def traced_moment(windows: dict[str, Any], body: str, head: str, sequences: int, tokens: int) -> tuple[int, int]:
    """(the peak until the LM head, the whole moment's peak) of a traced window and the head's window after it."""
    working = peak_of(windows[body], sequences, tokens)
    return working, max(working, left_by(windows[body], sequences, tokens) + peak_of(windows[head], sequences, tokens))


def kv_cache_bytes(
    model: ModelSpec, sequences: int, tokens: int, dtype: str, *, windows: bool = False, prefill: bool = False
) -> int:
    """Layers x sequences x tokens x the K and V elements a layer keeps per token (2 x kv_heads x head_dim, or
    what a traced cache keeps: ``ModelSpec.kv_elements_per_token``) x dtype bytes; with ``windows``, what
    transformers' DynamicCache holds per layer (sliding-window layers keep their window; see
    :func:`search.model.shapes.kv_tokens_held`)."""
    held = kv_tokens_held(model, tokens, prefill=prefill) if windows else model.num_layers * tokens
    return int(sequences * held * model.kv_elements_per_token * DTYPE_BYTES[dtype])


# Decoder layers DeepSpeed 0.19.8's hybrid engine replaces with inference containers (module_inject/replace_policy.py
# replace_policies, each policy's _orig_layer_class in module_inject/containers/): GPT-2, GPT-J, GPT-Neo, GPT-NeoX,
# BLOOM, Llama. Its populate_all_inference_policies (runtime/hybrid_engine.py) drops the OPT policy when the layer's
# forward takes ``cache_position`` or ``past_key_values`` (transformers 5's Cache-based OPTDecoderLayer does), and
# no policy exists for the others (Qwen2, Mistral, Gemma, ...): with no container, create_inference_module leaves
# ``module.generate`` as transformers' own, so the hybrid engine allocates no workspace and HF's DynamicCache holds
# the K/V in torch's allocator, as without the hybrid engine.
INJECTED_MODEL_TYPES = frozenset({"gpt2", "gptj", "gpt_neo", "gpt_neox", "bloom", "llama"})


def hybrid_engine_injects(model: ModelSpec) -> bool:
    """Whether DeepSpeed's hybrid engine generates with its own inference containers (workspace and KV cache
    outside torch's allocator) for ``model``, rather than through transformers' generate."""
    return model.model_type in INJECTED_MODEL_TYPES


def hybrid_engine_workspace_bytes(model: ModelSpec, sequences: int, tokens: int, dtype: str, coef: Coefficients) -> int:
    """DeepSpeed inference workspace beside the KV cache (``InferenceContext::GenWorkSpace``).

    Per token of the batch ``hybrid_engine_workspace_hidden`` hidden-size vectors, plus the attention
    score buffer (sequences x heads x tokens x tokens) that it allocates twice, plus, for grouped-query
    models, the part of its KV cache sized for every query head rather than the KV heads. DeepSpeed takes
    it with cudaMalloc, outside torch's caching allocator: it forms no fragments, and torch's counters miss it.
    """
    d = DTYPE_BYTES[dtype]
    hidden = coef.hybrid_engine_workspace_hidden * sequences * tokens * model.hidden_size
    scores = 2 * sequences * model.num_heads * tokens * tokens
    all_heads = 2 * model.num_layers * sequences * tokens * (model.num_heads - model.num_kv_heads) * model.head_dim
    return int(d * (hidden + scores + all_heads))


@lru_cache(maxsize=4096)
def generation_live(
    actor: TrainedPlacement,
    hybrid_engine: bool,
    sequences: int,
    prompt_len: int,
    gen_len: int,
    dtype: str,
    attn_impl: str,
    coef: Coefficients,
) -> tuple[Live, ...]:
    """(prefill, last decoding step) of one generate call over ``sequences`` sequences.

    The KV cache grows to prompt + generation tokens; only the last token's logits are computed (with the
    fp32 upcast of sampling). Under ZeRO-3 the hybrid engine gathers the actor's whole 16-bit weights for
    the call; without it the actor is gathered module by module, as in any ZeRO-3 forward. With the hybrid
    engine's inference containers (:func:`hybrid_engine_injects`) the KV cache lives in DeepSpeed's own workspace
    (cudaMalloc) and is released after the call (``release_inference_cache``); without them HF's cache grows
    through torch's allocator token by token.

    Where the actor has traced generation windows (:func:`traced_windows`) the working set and the last-token
    logits are what transformers' generate was traced to hold beside its cache: the prefill, and a decoding
    step (attention over the cache, the step's K/V copies, the fp32 logits, processors, softmax, sampling, and
    what the previous step left); otherwise a no-grad forward of one token and the logits formula.
    """
    model, d = actor.model, DTYPE_BYTES[dtype]
    seq_len = prompt_len + gen_len
    zero3 = actor.layout.zero_stage == 3
    if zero3 and hybrid_engine:
        gathered = d * actor.resident
    elif zero3:
        gathered = actor.states.zero3_gathered // 2  # parameters of the live module, no gradients
    else:
        gathered = 0
    injected = hybrid_engine and hybrid_engine_injects(model)
    workspace = hybrid_engine_workspace_bytes(model, sequences, seq_len, dtype, coef) if injected else 0
    _, last_logits = logits_bytes(model, sequences, 1, dtype, coef)
    windows = traced_windows(model, dtype, attn_impl)
    moments = []
    for kv_tokens, run_tokens in ((prompt_len, prompt_len), (seq_len, 1)):
        # HF's own cache (no hybrid engine) keeps sliding-window layers to their window
        kv = kv_cache_bytes(model, sequences, kv_tokens, dtype, windows=not injected, prefill=run_tokens > 1)
        working = activations(model, sequences, run_tokens, dtype, attn_impl, False, coef).forward_working
        logits = last_logits
        if windows is not None:  # traced: the prefill over the prompt; the last step over seq_len - 2 cached tokens
            body, head, tokens = (
                ("prefill", "prefill_head", prompt_len)
                if run_tokens > 1
                else ("decode_step", "decode_head", max(1, seq_len - 2))
            )
            working, whole = traced_moment(windows, body, head, sequences, tokens)
            logits = whole - working
        in_torch = gathered + working + logits + (0 if injected else kv)
        moments.append(
            live(
                zero3_gathered=gathered,
                activations=working,
                logits=logits,
                kv_cache=kv,
                hybrid_engine=workspace,
                transient=in_torch,
            )
        )
    return tuple(moments)


# --- scoring: no-grad forwards of every model over the generated sequences ------------------------------


@lru_cache(maxsize=4096)
def forward_live(
    model: ModelSpec,
    lm_head: bool,
    gathered: int,
    sequences: int,
    seq_len: int,
    dtype: str,
    attn_impl: str,
    coef: Coefficients,
    fused_head: int | None = None,
) -> Live:
    """One model's no-grad forward: a layer's working set, logits with the fp32 log-softmax (LM heads
    only, as single-model inference counts them), and its ZeRO-3 gathered module. Traced where the model has
    traced scoring windows: the forward until its LM head, then the logits and ``token_logprobs`` as the RLHF
    probe scores (the larger of the two is the moment; ``logits`` is what the head adds above the forward).
    ``fused_head``: the bytes of TRL's fused head in place of the logits (``FusedHead.forward``,
    :mod:`search.rlhf.scoring`); the working set until the head stays the forward's (traced or formula)."""
    working = activations(model, sequences, seq_len, dtype, attn_impl, False, coef).forward_working
    logits = logits_bytes(model, sequences, seq_len, dtype, coef)[1] if lm_head else 0
    windows = traced_windows(model, dtype, attn_impl)
    if windows is not None:  # traced: the forward until its LM head, then the logits and token_logprobs
        working, whole = traced_moment(windows, "scoring_forward", "scoring_head", sequences, seq_len)
        logits = whole - working if lm_head else 0
    if fused_head is not None:
        logits = fused_head
    return live(zero3_gathered=gathered, activations=working, logits=logits, transient=gathered + working + logits)


# --- training: forward, backward and optimizer step of one micro-batch ---------------------------------


@lru_cache(maxsize=4096)
def training_live(
    trained: TrainedPlacement, other: TrainedPlacement | None, batch: MicroBatchContext
) -> tuple[Live, ...]:
    """Every moment of one trained model's forward, backward and optimizer step over ``batch``, as single-model
    training counts them (:func:`search.model.placement.micro_step`; ``batch.head``: TRL's fused log-prob head
    in place of the logits, :func:`search.rlhf.models.role_micro_batch`).

    ``other`` is the other trained model at the same accumulation: DeepSpeed-Chat and OpenRLHF interleave
    actor and critic micro-steps, so its gradients (and ZeRO-1 buckets) carried between micro-steps are
    live too. ZeRO-3 gradient partitions are resident bytes here (``Models.resident``), not moments.
    """
    moments = micro_step(trained, batch).moments
    kept = trained.persistent_gradients
    others = other.carried if other is not None else {}
    steady = moments.steady - kept + sum(others.values())
    lives = []
    for name in TRAINING_PHASES:
        for parts in moments.phases[name]:
            now = dict(parts, gradients=parts["gradients"] - kept)
            for part, value in others.items():
                now[part] += value
            lives.append(live_of(now, steady))
    return tuple(lives)


# Side-stream ids each trained engine takes (search.model.moment_parts.Named.stream): engine k's are k x this + s
STREAMS_PER_ENGINE = 16


def training_named(trained: TrainedPlacement, batch: MicroBatchContext, engine: int = 0) -> tuple[NamedTensors, ...]:
    """The tensors each moment of :func:`training_live` holds by name (DeepSpeed's gradient partition and
    the optimizer step's copies, :class:`search.model.moment_parts.Named`), in the same order.

    ``engine`` numbers the trained engines of the step (the actor 0, the critic 1): each DeepSpeedZeroOptimizer
    makes a reduction stream of its own (``self.reduction_stream = get_accelerator().Stream()``,
    stage_1_and_2.py l. 599, DeepSpeed 0.19.8), and torch's caching allocator keeps each stream's blocks in a pool
    apart, so the critic's gradient partition cannot take the blocks the actor's left cached: its side-stream
    tensors are on streams of their own."""
    moments = micro_step(trained, batch).moments
    named = tuple(tensors for name in TRAINING_PHASES for tensors in moments.named_of(name))
    if not engine:
        return named
    side = engine * STREAMS_PER_ENGINE
    return tuple(tuple(replace(t, stream=t.stream + side) if t.stream else t for t in tensors) for tensors in named)
