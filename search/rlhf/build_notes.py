"""How an RLHF plan's program builds each model it trains under ZeRO-3, as a note beside the figures.

The trained models' engine init (:func:`search.streams.init.engine_init`) follows the program
(``Workload.framework``): built partitioned under ``deepspeed.zero.Init`` or whole on each GPU first
(:func:`store.model_build.builds_partitioned`, with the pinned sources it reads). A single-model plan says which
it assumed (:func:`search.single.host_memory.build_notes`); an RLHF plan says it for its actor and critic, each in
the words of :func:`store.model_build.build_note`.
"""

from __future__ import annotations

from search.model.placement import TrainedPlacement
from store.model_build import build_note, builds_partitioned
from store.records import DTYPE_BYTES


def trained_build_notes(
    trained: tuple[tuple[str, TrainedPlacement | None], ...], framework: str, dtype: str, device_bytes: int
) -> tuple[str, ...]:
    """``role: model build: ...`` for each trained model at ZeRO-3 (none for the other stages, which hold the
    whole model on every GPU anyway), as the engine init of the step assumes it."""
    notes = []
    for role, placed in trained:
        if placed is None or placed.layout.zero_stage != 3:
            continue
        model_bytes = DTYPE_BYTES[dtype] * placed.resident
        partitioned = builds_partitioned(framework, model_bytes=model_bytes, device_bytes=device_bytes)
        notes.append(f"{role} {build_note(framework, partitioned)}")
    return tuple(notes)
