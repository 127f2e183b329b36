"""Frozen value records shared by every package: models, GPUs, hardware, workloads and strategies.

These are plain data (no torch, no ORM rows). Each record converts to and from the JSON shapes of
docs/contracts.md with ``to_dict`` / ``from_dict``; the database stores exactly those dictionaries. The
strategies live in :mod:`store.strategies` and are re-exported here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from store.strategies import ALLOCATORS as ALLOCATORS
from store.strategies import EMPTY_CACHE_POLICIES as EMPTY_CACHE_POLICIES
from store.strategies import MAX_COUNT as MAX_COUNT
from store.strategies import OFFLOADS as OFFLOADS
from store.strategies import FrozenModelStrategy as FrozenModelStrategy
from store.strategies import RLHFStrategy as RLHFStrategy
from store.strategies import Strategy as Strategy
from store.strategies import TrainedModelStrategy as TrainedModelStrategy
from store.strategies import layout_problems as layout_problems
from store.strategies import quantization_problems as quantization_problems
from store.strategies import strategy_problems as strategy_problems
from store.workload_kinds import KINDS, traits

Dtype = Literal["bf16", "fp16", "fp32"]
AttnImpl = Literal["eager", "sdpa", "flash_attention_2"]
Offload = Literal["none", "cpu", "nvme"]
EmptyCache = Literal["never", "after-generation", "after-inference", "after-phase", "every-step"]
Allocator = Literal["default", "expandable-segments"]

DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp32")
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
ATTN_IMPLS: tuple[str, ...] = ("eager", "sdpa", "flash_attention_2")
# The workload kinds by what they train (store.workload_kinds.KINDS says what each implies).
SINGLE_MODEL_WORKLOADS: tuple[str, ...] = tuple(kind for kind, t in KINDS.items() if not t.rlhf)
RLHF_WORKLOADS: tuple[str, ...] = tuple(kind for kind, t in KINDS.items() if t.rlhf)
WORKLOAD_KINDS: tuple[str, ...] = RLHF_WORKLOADS + SINGLE_MODEL_WORKLOADS


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a transformer, enough to count its bytes and FLOPs without building it.

    ``hf_config`` is the dictionary (``model_type`` included) that ``transformers.AutoConfig.for_model(**hf_config)``
    turns back into the real config class; probes build the model from it with random weights.
    Parameter counts are exact (they equal what transformers instantiates on the meta device).
    """

    name: str
    model_type: str  # transformers' model_type: "opt", "gpt2", "llama", "mistral", "qwen2"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    tie_word_embeddings: bool
    gated_mlp: bool  # SwiGLU (3 matrices) rather than a 2-matrix MLP
    dropout: float  # the largest of the config's hidden/attention dropout probabilities
    total_params: int  # causal LM: embeddings, blocks, final norm, LM head (counted once if tied)
    layer_params: int  # one decoder block
    embedding_params: int  # token (and learned position) embeddings plus any projections around them
    lm_head_params: int  # 0 when the head is tied to the token embedding
    hf_config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # Where the counts come from: "formula" (store.model_params) or "traced" (transformers' own module tree,
    # built on the meta device: the catalog's package data and the shape cache of the store).
    shape_source: str = "formula"
    # Read from the traced module tree (0 or empty: not traced; search.model.shapes then uses the formulas).
    layer_param_counts: tuple[int, ...] = ()  # parameters of each decoder layer, in order
    largest_module: int = 0  # the most parameters one module holds directly (DeepSpeed's largest_layer_params)
    lora_in_out: int = 0  # the sum of (in + out) over every nn.Linear of every decoder layer
    lora_widest: int = 0  # the widest side of any decoder-layer nn.Linear
    # Mixture of experts: routed experts per MoE layer, experts each token runs, and the parameters of all
    # routed experts of all layers (``total_params`` includes them; a token's compute uses experts_per_token).
    num_experts: int = 0
    experts_per_token: int = 0
    expert_params: int = 0
    expert_param_counts: tuple[int, ...] = ()  # routed-expert parameters of each decoder layer, in order
    # What each layer's KV cache keeps in transformers' DynamicCache (cache_utils.get_layer_types_and_kwargs):
    # 0 every token, W > 0 a sliding window of W tokens, -1 nothing (a layer that reuses another's cache).
    # Empty: every layer keeps every token.
    kv_windows: tuple[int, ...] = ()
    # K and V elements the cache keeps per token in one layer, read from a real DynamicCache (an MLA model keeps
    # a compressed latent); 0: 2 x num_kv_heads x head_dim
    kv_token_elements: int = 0
    # The attention implementations transformers' class of this model accepts (empty: not traced, any)
    attn_impls: tuple[str, ...] = ()
    # Activation and loss bytes traced from the model's code (store.activation_terms), by terms_key; empty:
    # the cost model uses its formulas (search.model.activations).
    activation_terms: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # The settings (terms keys) the trace could not fit, and why: the plan names them where it uses the formulas
    activation_unfitted: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    # Where a local config's shape stands against the catalog (store.model_identity.Twin.describe): the catalog
    # model of the same shape, or what differs from the nearest one; empty for a catalog name
    identity: str = field(default="", compare=False, hash=False)
    # What makes two specs with different terms unequal (predictions are cached by spec): their digest.
    activation_digest: str = field(init=False, default="", repr=False)

    def __post_init__(self) -> None:
        if self.activation_terms:
            text = json.dumps(self.activation_terms, sort_keys=True).encode()
            object.__setattr__(self, "activation_digest", hashlib.sha256(text).hexdigest()[:16])

    @property
    def kv_elements_per_token(self) -> int:
        """K and V elements one layer's KV cache keeps per token."""
        return self.kv_token_elements or 2 * self.num_kv_heads * self.head_dim

    @property
    def backbone_params(self) -> int:
        """Parameters without the LM head: what a reward or critic model shares with the LM."""
        return self.total_params - self.lm_head_params

    @property
    def active_params(self) -> int:
        """Parameters one token's forward uses: all but the routed experts it does not run."""
        if not self.num_experts:
            return self.total_params
        idle = self.expert_params * (self.num_experts - self.experts_per_token) // self.num_experts
        return self.total_params - idle

    def to_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "name": self.name,
            "model_type": self.model_type,
            "params": self.total_params,
            "shape_source": self.shape_source,
        }
        if self.num_experts:
            shown["active_params"] = self.active_params
            shown["experts"] = {"routed": self.num_experts, "per_token": self.experts_per_token}
        return shown


# The catalog fields that carry a rate or an achieved fraction: each entry names where every one comes from
# (``GPUSpec.sources``; docs/gpus.md).
GPU_RATE_FIELDS: tuple[str, ...] = (
    "bf16_tflops", "fp16_tflops", "fp32_tflops", "hbm_gbps", "pcie_gbps", "interconnect_gbps",
)  # fmt: skip
GPU_FRACTION_FIELDS: tuple[str, ...] = (
    "matmul_efficiency", "matmul_half_dim", "hbm_efficiency", "pcie_efficiency", "kernel_floor_s",
)  # fmt: skip


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model from the catalog: memory and the rates the time model needs.

    ``compute_capability`` is what ``torch.cuda.get_device_capability()`` reports, (major, minor); it decides
    the generation-specific paths (bf16 needs 8.0 or newer; which sdpa kernels exist). None: not known (a GPU
    described only by a measurement), taken as a current one. ``sources`` pairs each rate and achieved
    fraction (:data:`GPU_RATE_FIELDS`, :data:`GPU_FRACTION_FIELDS`) with where its value comes from: a vendor
    datasheet by name, a mechanism, or the device it was calibrated on (:meth:`source`).
    """

    name: str
    memory_bytes: int
    bf16_tflops: float  # dense, no sparsity
    fp16_tflops: float
    fp32_tflops: float  # the rate an fp32 matmul gets (TF32 where the GPU has it)
    hbm_gbps: float  # device memory bandwidth, GB/s (10^9 bytes)
    pcie_gbps: float  # host link, one direction, GB/s
    interconnect_gbps: float  # GPU-to-GPU inside a node (NVLink or PCIe), per GPU, one direction
    aliases: tuple[str, ...] = ()
    # Achieved fractions and floors of the time model (search.model.roofline); calibration fits them per GPU.
    # The defaults are the Hopper values set against the H100 records; store.gpus gives every catalog entry
    # its generation's own (docs/gpus.md).
    matmul_efficiency: float = 0.78  # share of the dense peak a large cuBLAS GEMM reaches (H100 bf16: ~750 TF/s)
    matmul_half_dim: float = 64.0  # smallest GEMM dimension (m, n or k) at which the achieved rate halves
    hbm_efficiency: float = 0.8  # share of the HBM bandwidth that streaming element-wise kernels reach
    pcie_efficiency: float = 0.8  # share of the host link that pinned copies reach
    kernel_floor_s: float = 3e-6  # the least GPU time of one kernel (launch latency on the device side)
    compute_capability: tuple[int, int] | None = None  # (major, minor), as torch reports it; None: not known
    # (field, where its value comes from), see source(); not part of equality or the hash (no prediction reads it)
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def tflops(self, dtype: str) -> float:
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops}[dtype]

    def source(self, field_name: str) -> str:
        """Where the value of ``field_name`` comes from, or ``"not stated"``."""
        return dict(self.sources).get(field_name, "not stated")

    def source_map(self) -> dict[str, str]:
        """Every stated source, field -> where its value comes from (the JSON of ``planner gpus``)."""
        return dict(self.sources)

    @property
    def has_bf16(self) -> bool:
        """Whether the GPU has bf16 arithmetic (compute capability 8.0 or newer; an unknown one is assumed to)."""
        return self.compute_capability is None or self.compute_capability >= (8, 0)


@dataclass(frozen=True)
class Hardware:
    """What the job runs on. Memory figures are per GPU and per node (host)."""

    gpu: GPUSpec
    gpu_memory_bytes: int  # total memory of one GPU (``--gpu-mem`` or the catalog's)
    gpus: int = 1  # GPUs per node
    nodes: int = 1
    cpu_memory_bytes: int = 64 * 2**30  # host memory per node
    nvme_path: str | None = None
    # per node, one direction, GB/s; 25: one 200 Gb/s InfiniBand or RoCE link (planner.job.inputs fills it from
    # --inter-node-gbps, --node or the GPU's typical node, store.nodes)
    inter_node_gbps: float = 25.0
    safety_margin: float = 0.05  # fraction of GPU memory kept free on top of the CUDA context
    node: str | None = None  # the node catalog entry (store.nodes) the job was planned for, if any

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape; ``inter_node_gbps`` only where there are several nodes to link (a probe's one node
        hashes as before), ``node`` only when one was named."""
        out: dict[str, Any] = {
            "gpu": self.gpu.name,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "cpu_memory_bytes": self.cpu_memory_bytes,
            "nvme_path": self.nvme_path,
            "safety_margin": self.safety_margin,
        }
        if self.nodes > 1:
            out["inter_node_gbps"] = self.inter_node_gbps
        if self.node is not None:
            out["node"] = self.node
        return out


MODEL_ROLES: tuple[str, ...] = ("actor", "critic", "reference", "reward")
# ``--reward-model none`` and a document's ``"reward_model": "none"``: rewards from rules, no reward model
RULE_REWARD = "none"


@dataclass(frozen=True)
class Workload:
    """One training job: which models, which sequences, how many per optimizer step.

    ``global_batch`` counts samples per optimizer step over all GPUs; for ``reward`` and ``dpo`` a
    sample is a pair (chosen and rejected), for RLHF a prompt. The RLHF fields (``prompt_len``,
    ``gen_len``, the extra models) are None for the single-model kinds.
    """

    kind: str
    model: ModelSpec  # the trained model (the actor in RLHF)
    seq_len: int
    global_batch: int
    dtype: str = "bf16"
    attn_impl: str = "sdpa"
    ref_model: ModelSpec | None = None  # dpo and RLHF: frozen reference
    critic_model: ModelSpec | None = None
    reward_model: ModelSpec | None = None
    prompt_len: int | None = None
    gen_len: int | None = None
    ppo_epochs: int = 1  # RLHF: training passes over each batch of experience
    samples_per_prompt: int = 1  # grpo: k completions per prompt
    # the program that runs the plan (store.frameworks.FRAMEWORKS); "deepspeed", memplan's own loop, is the default
    framework: str = "deepspeed"
    # RLHF: rewards from rules (a verifiable reward: a function of the text, ``--reward-model none``), so no reward
    # model is held and none scores the rollouts
    rule_reward: bool = False
    # RLHF: the KL coefficient against the reference (TRL's ``beta``, OpenRLHF's ``--algo.kl.init_coef``, veRL's
    # ``kl_loss_coef``); 0 loads no reference model and computes no reference log-probs. None: memplan's own loop,
    # a KL penalty with a reference held (DeepSpeed-Chat's fixed ``kl_ctl`` 0.1)
    kl_coef: float | None = None
    # how the program builds a ZeRO-3 model (store.model_build.MODEL_BUILDS): by ``framework``'s rule, or as a probe
    # of the user's program saw it ("zero-init", "whole"; recommend --program)
    model_build: str = "framework"

    @property
    def is_rlhf(self) -> bool:
        return traits(self.kind).rlhf

    @property
    def holds_reference(self) -> bool:
        """A frozen reference model is loaded: DPO always; RLHF unless its KL coefficient is 0 (TRL's
        GRPOTrainer ``if self.beta == 0.0: self.ref_model = None``; OpenRLHF's ``train_ppo_ray`` builds the
        ReferenceModelActor only ``if args.algo.kl.init_coef > 0``; veRL only with ``use_kl_loss`` or
        ``use_kl_in_reward``)."""
        kind = traits(self.kind)
        return kind.reference_model and not (kind.rlhf and self.kl_coef == 0)

    @property
    def holds_reward_model(self) -> bool:
        """A reward model scores the rollouts: RLHF unless its rewards come from rules (``rule_reward``)."""
        return traits(self.kind).rlhf and not self.rule_reward

    @property
    def has_critic(self) -> bool:
        """Only PPO trains a critic; ReMax and GRPO drop it."""
        return traits(self.kind).trains_critic

    def model_for(self, role: str) -> ModelSpec:
        """The model that plays ``role`` (see :data:`MODEL_ROLES`), following DeepSpeed-Chat's convention.

        ``actor``: the trained model. ``reference``: ``ref_model``, else the actor's model (the frozen
        starting point of the policy). ``critic``: ``critic_model``, else the reward model (DeepSpeed-Chat
        step 3 initializes the critic from the step-2 reward model), else the actor's model. ``reward``:
        ``reward_model``, else the critic's, else the actor's model. The cost model, the config renderer,
        the probes and the report all ask here.
        """
        if role == "actor":
            return self.model
        if role == "reference":
            return self.ref_model or self.model
        if role == "critic":
            return self.critic_model or self.reward_model or self.model
        if role == "reward":
            return self.reward_model or self.critic_model or self.model
        raise ValueError(f"unknown model role {role!r}; roles: {', '.join(MODEL_ROLES)}")

    def role_models(self) -> dict[str, ModelSpec]:
        """Each role of this workload and its model: RLHF has actor, critic (PPO only), reference, reward;
        DPO has actor and reference; the other single-model kinds the actor alone."""
        kind = traits(self.kind)
        held = {
            "actor": True,
            "critic": kind.trains_critic,
            "reference": self.holds_reference,
            "reward": self.holds_reward_model,
        }
        return {role: self.model_for(role) for role in MODEL_ROLES if held[role]}

    @property
    def sequences_per_sample(self) -> int:
        """Sequences that one sample puts through the model: 2 for preference pairs."""
        return traits(self.kind).sequences_per_sample

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "model": self.model.name,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "dtype": self.dtype,
            "attn_impl": self.attn_impl,
        }
        for role in ("ref_model", "critic_model", "reward_model"):
            spec = getattr(self, role)
            if spec is not None:
                out[role] = spec.name
        if self.rule_reward:
            out["reward_model"] = RULE_REWARD  # as --reward-model takes it: rule-based rewards, no model
        if self.kl_coef is not None:
            out["kl_coef"] = self.kl_coef
        for name in ("prompt_len", "gen_len"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.is_rlhf:
            out["ppo_epochs"] = self.ppo_epochs
            out["samples_per_prompt"] = self.samples_per_prompt
        if self.framework != "deepspeed":  # only when named: documents of the default stay as they were
            out["framework"] = self.framework
        if self.model_build != "framework":  # only when a probe of the program saw it
            out["model_build"] = self.model_build
        return out


def strategy_label(strategy: Strategy | RLHFStrategy, workload: Workload) -> str:
    """The short label of ``strategy`` for ``workload``: an RLHF strategy names only the frozen models the job holds
    (no reference at a KL coefficient of 0, no reward model with rule-based rewards)."""
    if isinstance(strategy, RLHFStrategy):
        return strategy.describe(workload.role_models())
    return strategy.describe()
