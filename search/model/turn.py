"""The records a trained model's moments are built from: the model as placed, and one micro-batch's turn.

:class:`PlacedModel` is what the moments read of a trained model placed on its GPUs
(``search.model.placement.TrainedPlacement`` meets it); :class:`MicroStepTurn` is what every ZeRO stage's moments
share, the forward and the start of the backward of one micro-batch and the bytes around them. Both
:mod:`search.model.moments` (which builds the turn) and :mod:`search.model.deepspeed_tensors` (ZeRO-0's and
ZeRO-2's tensors by name) take them whole, instead of a list of their fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from search.model.moment_parts import Moment
from search.model.states import ModelStates
from search.model.zero_buffers import ZeroWorkspace
from store.records import ModelSpec, TrainedModelStrategy

__all__ = ["MicroStepTurn", "PlacedModel"]


class PlacedModel(Protocol):
    """A trained model placed on the GPUs as its training moments read it (``search.model.placement.TrainedPlacement``
    is one): the model, whether it has an LM head, its layout (ZeRO stage, LoRA rank, checkpointing), its
    accumulation and world size, its states and DeepSpeed's working buffers."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def lm_head(self) -> bool: ...
    @property
    def layout(self) -> TrainedModelStrategy: ...
    @property
    def grad_accum(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def states(self) -> ModelStates: ...
    @property
    def work(self) -> ZeroWorkspace: ...


@dataclass(frozen=True)
class MicroStepTurn:
    """What every ZeRO stage's moments share: the forward and the start of the backward of one micro-batch, and
    the bytes around them (``d`` bytes per 16-bit element). ``backward`` is the list the stage's own end appends
    its moments to."""

    d: int
    base: Moment  # between micro-steps
    kept: int  # ZeRO-3's gradient partition buffer, live from init on
    gathered_params: int
    embedding_grad: int
    tied: int
    head_grad: int
    inflight: int  # the last gradient of the backward (the token embedding's) and a tied weight's extra
    head_weight: int
    forward: list[Moment]
    backward: list[Moment]
