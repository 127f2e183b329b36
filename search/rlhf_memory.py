"""Bytes per GPU of an RLHF step: where each of the four models lives and what each phase adds.

The models of a DeepSpeed-Chat / OpenRLHF step 3 stay on the GPU together: the actor (trained, LM head),
the reference (frozen, LM head), the reward model (frozen, backbone with a scalar head) and, for PPO, the
critic (trained, backbone with a scalar head). Trained models are laid out by ``search.memory.model_states``
exactly as a single trained model is; frozen models hold 16-bit weights only: whole, 1/N under ZeRO-3, or
nothing between forwards when offloaded (a gathered layer while they run).

Each phase is a tuple of ``Live`` sub-phases: the bytes that exist only during that moment (gradients
between micro-steps, gathered parameters, activations, logits, KV cache, hybrid-engine workspace), and how
many of them are allocated and freed through torch's caching allocator (``transient``: what leaves
fragments). Pure functions, cached on their (hashable) arguments: an RLHF search predicts thousands of
strategies that share these pieces.

The last section turns phases into reserved bytes: each phase fragments a share of what it allocates and
frees (``frag_within_step``), and leaves a share cached for later phases (``frag_inference_carried`` after
generation and scoring, ``frag_carried`` after training) until an ``empty_cache`` call releases it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search.coefficients import Coefficients
from search.memory import (
    LossLogits,
    ModelStates,
    ZeroWorkspace,
    activations,
    logits_bytes,
    loss_logits,
    model_states,
    zero_workspace,
)
from search.shapes import largest_module_params, resident_params, trainable_params
from search.timing import empty_cache_time
from search.training_moments import TRAINING_PHASES, Moment, between_micro_steps, training_moments
from store.ds_defaults import zero3_buckets
from store.records import DTYPE_BYTES, FrozenModelStrategy, ModelSpec, TrainedModelStrategy

LIVE_PARTS = ("gradients", "zero3_gathered", "activations", "logits", "kv_cache", "hybrid_engine", "buffers")
INFERENCE, TRAINING = "inference", "training"
RLHF_PHASES: tuple[str, ...] = ("generation", "scoring", "actor_training", "critic_training")
PER_PHASE_RELEASES: dict[str, tuple[str, ...]] = {
    "never": (),
    "after-generation": ("generation",),
    "after-inference": ("generation", "scoring"),
    "after-phase": ("generation", "scoring", "actor_training", "critic_training"),
    "every-step": (),
}


@dataclass(frozen=True)
class Live:
    """What one moment of a phase adds to the resident bytes."""

    parts: tuple[int, ...]  # bytes per LIVE_PARTS name
    transient: int  # of which allocated and freed through torch's caching allocator within the phase

    @property
    def total(self) -> int:
        return sum(self.parts)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(LIVE_PARTS, self.parts, strict=True))


def _live(
    *,
    gradients: int = 0,
    zero3_gathered: int = 0,
    activations: int = 0,
    logits: int = 0,
    kv_cache: int = 0,
    hybrid_engine: int = 0,
    buffers: int = 0,
    transient: int,
) -> Live:
    return Live((gradients, zero3_gathered, activations, logits, kv_cache, hybrid_engine, buffers), int(transient))


# --- the models -------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TrainedPlacement:
    """A trained RLHF model (actor or critic) under its layout (one object per inputs: hashed by identity)."""

    model: ModelSpec
    lm_head: bool
    layout: TrainedModelStrategy
    trainable: int
    resident: int  # parameters held (base model plus adapters)
    states: ModelStates
    work: ZeroWorkspace  # DeepSpeed's working buffers around the states, and when they exist
    buffers: int  # DeepSpeed's buffers resident for this engine, without the shared cuBLAS workspace
    grad_accum: int
    world_size: int

    @property
    def persistent_gradients(self) -> int:
        """ZeRO-3's gradient partition buffer: allocated by the optimizer at init and kept for the whole run."""
        return self.states.gradients if self.layout.zero_stage == 3 else 0

    @property
    def carried(self) -> Moment:
        """Bytes alive between this model's micro-steps beyond its resident ones (accumulated gradients,
        ZeRO-1's reduce buckets), which the other trained model's interleaved micro-steps find live."""
        return between_micro_steps(self.work)


@lru_cache(maxsize=1024)
def trained_placement(
    model: ModelSpec,
    lm_head: bool,
    layout: TrainedModelStrategy,
    dtype: str,
    world_size: int,
    grad_accum: int,
    coef: Coefficients,
) -> TrainedPlacement:
    """Model states and buckets of a trained model, exactly as for single-model training."""
    trainable = trainable_params(model, layout.lora_rank, lm_head=lm_head)
    resident = resident_params(model, layout.lora_rank, lm_head=lm_head)
    states = model_states(
        model=model,
        trainable=trainable,
        frozen=resident - trainable,
        dtype=dtype,
        zero_stage=layout.zero_stage,
        offload_optimizer=layout.offload_optimizer,
        offload_param=layout.offload_param,
        world_size=world_size,
        grad_accum=grad_accum,
    )
    work = zero_workspace(
        model=model,
        trainable=trainable,
        dtype=dtype,
        zero_stage=layout.zero_stage,
        offload_optimizer=layout.offload_optimizer,
        world_size=world_size,
        grad_accum=grad_accum,
        lora_rank=layout.lora_rank,
        lm_head=lm_head,
        coef=coef,
    )
    # ZeRO-1/2's reduce buckets exist only while a backward runs: they are part of the training moments
    buffers = work.resident - int(coef.cublas_workspace_bytes)
    return TrainedPlacement(model, lm_head, layout, trainable, resident, states, work, buffers, grad_accum, world_size)


@dataclass(frozen=True, eq=False)
class FrozenPlacement:
    """A frozen RLHF model (reference or reward) under its block (one object per inputs: hashed by identity)."""

    model: ModelSpec
    lm_head: bool
    block: FrozenModelStrategy
    params: int  # parameters of the whole model
    resident: int  # 16-bit bytes on the GPU between its forwards
    gathered: int  # bytes gathered while its own forward runs (ZeRO-3: a module plus the prefetch bucket)
    host: int  # 16-bit bytes per GPU held in host memory (offloaded partition)


@lru_cache(maxsize=1024)
def frozen_placement(
    model: ModelSpec, lm_head: bool, block: FrozenModelStrategy, dtype: str, world_size: int
) -> FrozenPlacement:
    """16-bit weights whole (ZeRO-0), partitioned (ZeRO-3) or on the host (ZeRO-3 + offload)."""
    d = DTYPE_BYTES[dtype]
    params = resident_params(model, 0, lm_head=lm_head)
    if block.zero_stage == 0:
        return FrozenPlacement(model, lm_head, block, params, d * params, 0, 0)
    gathered = d * (largest_module_params(model) + zero3_buckets(model).prefetch_bucket_size)
    partition = d * params // world_size
    if block.offload != "none":
        return FrozenPlacement(model, lm_head, block, params, 0, gathered, partition)
    return FrozenPlacement(model, lm_head, block, params, partition, gathered, 0)


def ema_bytes(actor: TrainedPlacement, dtype: str, world_size: int) -> tuple[int, int]:
    """(GPU, host per GPU) bytes of DeepSpeed-Chat's ``--enable_ema`` copy: 16-bit, placed like the actor."""
    d = DTYPE_BYTES[dtype]
    layout = actor.layout
    if layout.zero_stage != 3:
        return d * actor.resident, 0
    partition = d * actor.resident // world_size
    return (0, partition) if layout.offload_param != "none" else (partition, 0)


def experience_bytes(sequences: int, seq_len: int, dtype: str) -> int:
    """The rollout buffer: token ids and attention mask (int64) plus log-probs, reference log-probs,
    values and rewards (compute dtype) for every token of the step's sequences."""
    return sequences * seq_len * (16 + 4 * DTYPE_BYTES[dtype])


# --- generation ---------------------------------------------------------------------------------------


def kv_cache_bytes(model: ModelSpec, sequences: int, tokens: int, dtype: str) -> int:
    """2 (K and V) x layers x sequences x tokens x kv_heads x head_dim x dtype bytes."""
    return 2 * model.num_layers * sequences * tokens * model.num_kv_heads * model.head_dim * DTYPE_BYTES[dtype]


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
    engine the KV cache lives in DeepSpeed's own workspace (cudaMalloc) and is released after the call
    (``release_inference_cache``); without it HF's cache grows through torch's allocator token by token.
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
    workspace = hybrid_engine_workspace_bytes(model, sequences, seq_len, dtype, coef) if hybrid_engine else 0
    _, last_logits = logits_bytes(model, sequences, 1, dtype, coef)
    moments = []
    for kv_tokens, run_tokens in ((prompt_len, prompt_len), (seq_len, 1)):
        kv = kv_cache_bytes(model, sequences, kv_tokens, dtype)
        working = activations(model, sequences, run_tokens, dtype, attn_impl, False, coef).forward_working
        in_torch = gathered + working + last_logits + (0 if hybrid_engine else kv)
        moments.append(
            _live(
                zero3_gathered=gathered,
                activations=working,
                logits=last_logits,
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
) -> Live:
    """One model's no-grad forward: a layer's working set, logits with the fp32 log-softmax (LM heads
    only, as single-model inference counts them), and its ZeRO-3 gathered module."""
    working = activations(model, sequences, seq_len, dtype, attn_impl, False, coef).forward_working
    logits = logits_bytes(model, sequences, seq_len, dtype, coef)[1] if lm_head else 0
    return _live(zero3_gathered=gathered, activations=working, logits=logits, transient=gathered + working + logits)


# --- training: forward, backward and optimizer step of one micro-batch ---------------------------------


@lru_cache(maxsize=4096)
def training_live(
    trained: TrainedPlacement,
    other: TrainedPlacement | None,
    micro_batch: int,
    seq_len: int,
    dtype: str,
    attn_impl: str,
    coef: Coefficients,
) -> tuple[Live, ...]:
    """Every moment of one trained model's forward, backward and optimizer step, as single-model training
    counts them (:func:`search.training_moments.training_moments`).

    ``other`` is the other trained model at the same accumulation: DeepSpeed-Chat and OpenRLHF interleave
    actor and critic micro-steps, so its gradients (and ZeRO-1 buckets) carried between micro-steps are
    live too. ZeRO-3 gradient partitions are resident bytes here (``Models.resident``), not moments.
    """
    s, model = trained.layout, trained.model
    acts = activations(model, micro_batch, seq_len, dtype, attn_impl, s.gradient_checkpointing, coef)
    logits = loss_logits(model, micro_batch, seq_len, dtype, coef) if trained.lm_head else LossLogits(0, 0, 0)
    moments = training_moments(
        model=model,
        lm_head=trained.lm_head,
        dtype=dtype,
        zero_stage=s.zero_stage,
        lora_rank=s.lora_rank,
        gradient_checkpointing=s.gradient_checkpointing,
        grad_accum=trained.grad_accum,
        world_size=trained.world_size,
        states=trained.states,
        work=trained.work,
        acts=acts,
        logits=logits,
        backward_working=int(coef.backward_working_layers * acts.layer),
    )
    kept = trained.persistent_gradients
    others = other.carried if other is not None else {}
    steady = moments.steady - kept + sum(others.values())
    lives = []
    for name in TRAINING_PHASES:
        for parts in moments.phases[name]:
            live = dict(parts, gradients=parts["gradients"] - kept)
            for part, value in others.items():
                live[part] += value
            lives.append(_live(**live, transient=max(0, sum(live.values()) - steady)))
    return tuple(lives)


# --- fragments: what the caching allocator keeps beyond the live bytes (arXiv 2410.15651) ------------------


@dataclass(frozen=True)
class StepPhase:
    """One phase of an RLHF step before the allocator's policy is applied."""

    name: str
    group: str  # INFERENCE or TRAINING: phases repeated together (generate calls; micro-steps)
    moments: tuple[Live, ...]
    factor: float  # fragmentation multiplier of the layouts that run in it (ZeRO-3, offload, recompute)
    carry: float  # share of its transient bytes left cached as fragments for later phases
    time_s: float  # per step
    count: int  # runs per step
    transient: int = 0  # the most bytes it allocates and frees at once (derived)
    live: int = 0  # the most bytes it adds to the resident ones (derived)
    moment_bytes: tuple[tuple[int, int], ...] = ()  # (live, transient) of each moment (derived)

    def __post_init__(self) -> None:
        moment_bytes = tuple((m.total, m.transient) for m in self.moments)
        object.__setattr__(self, "moment_bytes", moment_bytes)
        object.__setattr__(self, "transient", max(transient for _, transient in moment_bytes))
        object.__setattr__(self, "live", max(live for live, _ in moment_bytes))


def _factor(coef: Coefficients, *, zero3: bool, offload: bool, checkpointing: bool = False) -> float:
    factor = coef.frag_zero3_factor if zero3 else 1.0
    if offload:
        factor *= coef.frag_offload_factor
    if checkpointing:
        factor *= coef.frag_checkpointing_factor
    return factor


def trained_factor(p: TrainedPlacement, coef: Coefficients, *, training: bool) -> float:
    """How much a trained model's layout multiplies fragments (recompute only counts while training)."""
    s = p.layout
    offload = s.offload_optimizer != "none" or s.offload_param != "none"
    return _factor(coef, zero3=s.zero_stage == 3, offload=offload, checkpointing=training and s.gradient_checkpointing)


def frozen_factor(p: FrozenPlacement, coef: Coefficients) -> float:
    """How much a frozen model's block multiplies fragments."""
    return _factor(coef, zero3=p.block.zero_stage == 3, offload=p.block.offload != "none")


def _survives(structure: tuple[tuple[str, str, bool], ...], q: int, p: int, policy: str) -> bool:
    """Do fragments left by phase ``q`` remain when phase ``p`` starts (no empty_cache in between)?"""
    releases = PER_PHASE_RELEASES[policy]
    m = len(structure)
    # along the step, wrapping into the next step (where every-step releases)
    path = [(q + i) % m for i in range((p - q) % m)]
    if not any(structure[k][0] in releases for k in path) and not (p <= q and policy == "every-step"):
        return True
    # inside a repeated loop (several generate calls; interleaved micro-steps) p also follows q directly
    group, repeated = structure[q][1], structure[q][2]
    if structure[p][1] != group or not repeated:
        return False
    members = [k for k in range(m) if structure[k][1] == group]
    a, b = members.index(q), members.index(p)
    inner = [members[(a + i) % len(members)] for i in range((b - a) % len(members))]
    return not any(structure[k][0] in releases for k in inner)


@lru_cache(maxsize=512)
def release_plan(
    structure: tuple[tuple[str, str, bool], ...], policy: str
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, tuple[int, ...]], ...]]:
    """For each phase the other phases whose fragments it still finds; for each phase followed by an
    ``empty_cache`` call, the phases whose cached blocks that call returns (itself included)."""
    m = len(structure)
    sees = tuple(tuple(q for q in range(m) if q != p and _survives(structure, q, p, policy)) for p in range(m))
    releases = tuple((p, (p, *sees[p])) for p in range(m) if structure[p][0] in PER_PHASE_RELEASES[policy])
    return sees, releases


def apply_policy(
    phases: tuple[StepPhase, ...],
    structure: tuple[tuple[str, str, bool], ...],
    resident: int,
    empty_cache: str,
    allocator: str,
    coef: Coefficients,
) -> tuple[list[int], list[int], float]:
    """(reserved, index of the moment setting it) per phase, and the seconds of the empty_cache calls.

    Reserved = resident + the moment's live bytes + its within-phase fragments + the fragments other phases
    left that no ``empty_cache`` call has released since (``release_plan``).
    """
    sees, releases = release_plan(structure, empty_cache)
    scale = coef.frag_expandable_factor if allocator == "expandable-segments" else 1.0
    residue = [scale * ph.factor * ph.carry * ph.transient for ph in phases]
    within = scale * coef.frag_within_step
    reserved, chosen = [], []
    for p, phase in enumerate(phases):
        carried = sum(residue[q] for q in sees[p])
        share = within * phase.factor
        best, best_live, best_k = -1, -1, 0
        for k, (live, transient) in enumerate(phase.moment_bytes):
            total = resident + live + int(share * transient + carried)
            if total > best or (total == best and live > best_live):
                best, best_live, best_k = total, live, k
        reserved.append(best)
        chosen.append(best_k)
    # each empty_cache call costs the release and, later, the cudaMalloc of what it released
    cache_seconds = 0.0
    for p, cached in releases:
        cache_seconds += empty_cache_time(phases[p].count, max(phases[q].transient for q in cached), coef)
    if empty_cache == "every-step":
        cache_seconds += empty_cache_time(1, max(phase.transient for phase in phases), coef)
    return reserved, chosen, cache_seconds
