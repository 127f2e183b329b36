"""How the program a plan is made for (``--framework``) builds a model it trains under ZeRO-3: partitioned as its
modules are made (``deepspeed.zero.Init``), or whole on each GPU before ``deepspeed.initialize`` partitions it.

The difference is the GPU bytes at engine init: built whole, every GPU holds the whole 16-bit model once
(``d x params``), which DeepSpeed then partitions and frees; under ``zero.Init`` no GPU ever holds more than its
partition. Read from each program's pinned source (``store.frameworks.VERSIONS``):

- ``hf``, ``trl``: ``TrainingArguments.__post_init__`` with a ZeRO-3 ``deepspeed`` config makes an
  ``HfTrainerDeepSpeedConfig`` and ``set_hf_deepspeed_config`` keeps a weak reference to it, so
  ``transformers.integrations.deepspeed.is_deepspeed_zero3_enabled()`` is true and
  ``PreTrainedModel.from_pretrained`` / ``from_config`` build under ``deepspeed.zero.Init``
  (``modeling_utils.py``, ``get_init_context``). TRL's trainers subclass the Trainer and take the same path.
- ``accelerate``: ``DeepSpeedPlugin.zero3_init_flag`` defaults to true for a stage-3 config
  (``accelerate/utils/dataclasses.py``: ``ACCELERATE_DEEPSPEED_ZERO3_INIT`` defaults to ``is_stage3()``), and
  ``set_hf_deepspeed_config`` makes transformers build under ``zero.Init`` as above.
- ``openrlhf``: ``Actor.__init__`` (``openrlhf/models/actor.py``) makes ``HfDeepSpeedConfig(ds_config)`` when the
  config's stage is 3, before ``from_pretrained``.
- ``deepspeed-chat``: ``create_hf_model`` (``dschat/utils/model/model_utils.py``) makes
  ``HfDeepSpeedConfig(ds_config)`` for stage 3 before ``from_pretrained``.
- ``verl``: trains with FSDP; its workers build the model on the CPU (meta device on all but rank 0,
  ``init_empty_weights``) and shard it as FSDP wraps it: no GPU holds the whole model either.
- ``deepspeed`` (memplan's own loop, as its probes run it): the model is built, moved to the GPU, and then given to
  ``deepspeed.initialize``, whose ``Init._convert_to_zero_parameters`` partitions it: the whole 16-bit model sits
  on every GPU first. A model larger than the GPU cannot be built so; such a program must use ``zero.Init``.

Quantized (QLoRA) models are the exception everywhere: transformers loads them without ``zero.Init``
(``store.quantization.qlora_loading``).

A program probed with ``planner probe ... -- CMD`` shows its own build: the probe's hook sees whether the model it
hands to ``deepspeed.initialize`` is already partitioned (its parameters carry ``ds_id``, which only
``zero.Init`` gives before ``initialize``). ``recommend --program`` plans with what was seen
(``Workload.model_build``: :data:`SEEN_ZERO_INIT` or :data:`SEEN_WHOLE`) in place of the framework's rule.
"""

from __future__ import annotations

# The programs that build a ZeRO-3 model partitioned (module docstring); the others build it whole first.
BUILDS_UNDER_ZERO_INIT: frozenset[str] = frozenset({"hf", "trl", "accelerate", "openrlhf", "deepspeed-chat", "verl"})

# Workload.model_build: the framework's rule (the default), or what a probe of the user's program saw
BY_FRAMEWORK = "framework"
SEEN_ZERO_INIT = "zero-init"
SEEN_WHOLE = "whole"
MODEL_BUILDS: tuple[str, ...] = (BY_FRAMEWORK, SEEN_ZERO_INIT, SEEN_WHOLE)


def builds_partitioned(
    framework: str,
    *,
    quantized: bool = False,
    model_bytes: int = 0,
    device_bytes: int = 0,
    model_build: str = BY_FRAMEWORK,
) -> bool:
    """Whether the program builds a ZeRO-3 model partitioned (``deepspeed.zero.Init``). ``model_build`` as the
    probed program was seen (:data:`SEEN_ZERO_INIT`, :data:`SEEN_WHOLE`) decides over ``framework``; by the
    framework, always for the programs of :data:`BUILDS_UNDER_ZERO_INIT`. A model whose 16-bit weights
    (``model_bytes``) are larger than the GPU (``device_bytes``) can only be built partitioned; a quantized model
    never is (transformers loads it whole)."""
    if quantized:
        return False
    if model_build == SEEN_ZERO_INIT or (model_build == BY_FRAMEWORK and framework in BUILDS_UNDER_ZERO_INIT):
        return True
    return device_bytes > 0 and model_bytes > device_bytes


def program_build(framework: str, model_build: str = BY_FRAMEWORK) -> str:
    """How the program builds a model it trains under ZeRO-3, as a plan assumes it: :data:`SEEN_ZERO_INIT`
    (partitioned as it is made) or :data:`SEEN_WHOLE` (whole on every GPU, then partitioned by
    ``deepspeed.initialize``): the probed program's own build (``model_build``) where a probe saw it, else
    ``framework``'s rule. A model larger than the GPU, or quantized, is the exception the plan's notes state
    (:func:`builds_partitioned`)."""
    return SEEN_ZERO_INIT if builds_partitioned(framework, model_build=model_build) else SEEN_WHOLE


def build_note(framework: str, partitioned: bool, *, quantized: bool = False, model_build: str = BY_FRAMEWORK) -> str:
    """The line a ZeRO-3 plan says its model build with (what the prediction assumed, and from what)."""
    if quantized:
        return "model build: whole, quantized as it loads (transformers loads a quantized model without zero.Init)"
    if partitioned:
        if model_build == SEEN_ZERO_INIT:
            how = "your program builds it under deepspeed.zero.Init, as planner probe's hook saw"
        elif model_build == BY_FRAMEWORK and framework in BUILDS_UNDER_ZERO_INIT:
            how = f"--framework {framework} builds it under deepspeed.zero.Init"
        else:
            how = "it is larger than the GPU, so it can only be built under deepspeed.zero.Init"
        return f"model build: partitioned as it is made ({how}); the whole model never sits on one GPU"
    if model_build == SEEN_WHOLE:
        return (
            "model build: whole on every GPU, then partitioned by deepspeed.initialize (your program builds the "
            "model before deepspeed.initialize, as planner probe's hook saw with a ZeRO-3 config); building it "
            "under deepspeed.zero.Init starts lower"
        )
    return (
        f"model build: whole on every GPU, then partitioned by deepspeed.initialize (--framework {framework}: the "
        "program builds the model before deepspeed.initialize); a program that builds it under deepspeed.zero.Init "
        "(the HF Trainer, Accelerate, TRL) starts lower"
    )
