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
"""

from __future__ import annotations

# The programs that build a ZeRO-3 model partitioned (module docstring); the others build it whole first.
BUILDS_UNDER_ZERO_INIT: frozenset[str] = frozenset({"hf", "trl", "accelerate", "openrlhf", "deepspeed-chat", "verl"})


def builds_partitioned(framework: str, *, quantized: bool = False, model_bytes: int = 0, device_bytes: int = 0) -> bool:
    """Whether ``framework`` builds a ZeRO-3 model partitioned (``deepspeed.zero.Init``): always for the programs
    of :data:`BUILDS_UNDER_ZERO_INIT`; for the others only when the 16-bit model (``model_bytes``) is larger than
    the GPU (``device_bytes``), which leaves no other way; never for a quantized model (transformers loads it
    whole)."""
    if quantized:
        return False
    if framework in BUILDS_UNDER_ZERO_INIT:
        return True
    return device_bytes > 0 and model_bytes > device_bytes


def build_note(framework: str, partitioned: bool, *, quantized: bool = False) -> str:
    """The line a ZeRO-3 plan says its model build with (what the prediction assumed)."""
    if quantized:
        return "model build: whole, quantized as it loads (transformers loads a quantized model without zero.Init)"
    if partitioned:
        how = (
            f"--framework {framework} builds it under deepspeed.zero.Init"
            if framework in BUILDS_UNDER_ZERO_INIT
            else "it is larger than the GPU, so it can only be built under deepspeed.zero.Init"
        )
        return f"model build: partitioned as it is made ({how}); the whole model never sits on one GPU"
    return (
        f"model build: whole on every GPU, then partitioned by deepspeed.initialize (--framework {framework}: the "
        "program builds the model before deepspeed.initialize); a program that builds it under deepspeed.zero.Init "
        "(the HF Trainer, Accelerate, TRL) starts lower"
    )
