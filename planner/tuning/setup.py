"""What a tune's rounds run on, fixed before the first round: one record instead of a list of keywords.

:func:`planner.tuning.run.tune` reads the user's options, opens the study and its claims, and hands
:func:`planner.tuning.rounds.run_rounds` a :class:`TuneSetup`; the rounds and their report read it whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.job.inputs import ResolvedJob
from planner.probing.settings import ProbeSettings
from planner.tuning.claims import Claims
from planner.tuning.study import ProgramCommand
from search import Coefficients

__all__ = ["TuneSetup"]


@dataclass(frozen=True)
class TuneSetup:
    """A tune's job, study and candidates, the coefficients it plans with, and how it probes.

    ``coef``: the coefficients the job is planned with (its calibration's); ``base``: the user's, which each refit
    starts from; ``target``: the device fingerprint the probes calibrate; ``calibration_block``: the plan's
    calibration block as planned. ``claims`` gives each candidate to one tune of the study
    (:mod:`planner.tuning.claims`); with ``program`` each candidate runs in the user's own program
    (``planner tune ... -- CMD``).
    """

    job: ResolvedJob
    study: Any  # the Optuna study (optuna is imported only when a tune runs)
    space: list[str]  # the candidates' keys, in the study's order
    coef: Coefficients
    base: Coefficients
    target: str
    settings: ProbeSettings
    db: str | None
    max_probes: int
    calibration_block: dict[str, Any]
    claims: Claims
    program: ProgramCommand | None = None
