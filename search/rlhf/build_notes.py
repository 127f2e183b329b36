"""How an RLHF plan's program builds each model it holds under ZeRO-3, as a note beside the figures.

The trained models' engine init (:func:`search.streams.init.engine_init`) follows the program
(``Workload.framework``, or the probed program's own build, ``Workload.model_build``): built partitioned under
``deepspeed.zero.Init`` or whole on each GPU first (:func:`store.model_build.builds_partitioned`, with the pinned
sources it reads). A single-model plan says which it assumed (:func:`search.single.host_memory.build_notes`); an
RLHF plan says it for its actor and critic (:func:`trained_build_notes`) and for its frozen reference and reward
models at ZeRO-3 (:func:`frozen_build_notes`), each in the words of :func:`store.model_build.build_note`.

The frozen models follow the same rule as the trained ones, read from the same pinned sources: OpenRLHF 0.11.2's
``Actor.__init__`` and ``get_llm_for_sequence_regression`` make ``HfDeepSpeedConfig(ds_config)`` for a stage-3
eval config before ``from_pretrained``; DeepSpeed-Chat's ``create_hf_model`` does the same for its reference and
reward (``create_critic_model``); TRL 1.16 loads its reference with ``from_pretrained`` while
``is_deepspeed_zero3_enabled()``; veRL's reference is an FSDP worker built off the GPU. Memplan's own loop builds a
frozen model on the device it runs on (the host when its parameters are offloaded) and hands it whole to
``deepspeed.initialize`` (``probes.step.phases_rlhf``): an offloaded one never sits whole on a GPU. A probed
program's own build (``Workload.model_build``) decides for every model of its step.
"""

from __future__ import annotations

from search.model.placement import FrozenPlacement, TrainedPlacement
from search.rlhf.models import Models
from store.model_build import build_note, builds_partitioned
from store.records import DTYPE_BYTES, Workload


def trained_build_notes(
    trained: tuple[tuple[str, TrainedPlacement | None], ...], workload: Workload, device_bytes: int
) -> tuple[str, ...]:
    """``role: model build: ...`` for each trained model at ZeRO-3 (none for the other stages, which hold the
    whole model on every GPU anyway), as the engine init of the step assumes it."""
    notes = []
    for role, placed in trained:
        if placed is None or placed.layout.zero_stage != 3:
            continue
        model_bytes = DTYPE_BYTES[workload.dtype] * placed.resident
        partitioned = builds_partitioned(
            workload.framework, model_bytes=model_bytes, device_bytes=device_bytes, model_build=workload.model_build
        )
        notes.append(f"{role} {build_note(workload.framework, partitioned, model_build=workload.model_build)}")
    return tuple(notes)


def frozen_build_notes(
    frozen: tuple[tuple[str, FrozenPlacement | None], ...], workload: Workload, device_bytes: int
) -> tuple[str, ...]:
    """``reference model build: ...`` or ``reward model build: ...`` for each frozen model at ZeRO-3, by the
    trained models' rule (:func:`store.model_build.builds_partitioned`; the module docstring cites the frozen
    models' sources); none for a frozen model at ZeRO-0, which is whole on every GPU by its block."""
    notes = []
    framework, build = workload.framework, workload.model_build
    for role, placed in frozen:
        if placed is None or placed.block.zero_stage != 3:
            continue
        model_bytes = DTYPE_BYTES[workload.dtype] * placed.params
        if builds_partitioned(framework, model_bytes=model_bytes, device_bytes=device_bytes, model_build=build):
            notes.append(f"{role} {build_note(framework, True, model_build=build)}")
        elif placed.block.offload != "none":
            notes.append(
                f"{role} model build: whole on the host (its parameters are offloaded; --framework {framework} "
                "builds it before deepspeed.initialize), then partitioned by deepspeed.initialize; it never sits "
                "whole on a GPU"
            )
        else:
            notes.append(f"{role} {build_note(framework, False, model_build=build)}")
    return tuple(notes)


def model_build_notes(models: Models, workload: Workload, device_bytes: int) -> tuple[str, ...]:
    """The build notes of every model of a step at ZeRO-3: trained first, then frozen."""
    trained = (("actor", models.actor), ("critic", models.critic))
    frozen = (("reference", models.reference), ("reward", models.reward))
    return trained_build_notes(trained, workload, device_bytes) + frozen_build_notes(frozen, workload, device_bytes)
