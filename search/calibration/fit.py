"""The fit: least squares on log relative errors over every measured quantity, bounded, with a weak pull
towards the defaults; and its errors before, after and held out (leave-one-out).

The residual of a quantity is ``ln(predicted / measured)``: symmetric in over- and under-prediction, and a
relative error (``ln(1.1) ~ 0.095``). Each parameter adds a prior residual ``PRIOR_WEIGHT * ln(value /
default)``: moving a coefficient by a factor of e costs what a 30% error on one quantity does (a default
from the literature is rarely off by more), so a parameter that the probes do not determine stays at its
default, and one they do moves as far as they say. A parameter is *determined* when the measurements move
by more than ``DETERMINED`` (in log units per log unit) as it moves; only determined parameters are
stored, so the rest follow the defaults as they improve.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from search.calibration.observations import QUANTITIES, Observation, predicted_quantities
from search.calibration.parameters import PARAMETERS, Parameter, default_values
from search.calibration.solver import Solution, levenberg_marquardt, newton_step_without
from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients

PRIOR_WEIGHT = 0.3
DETERMINED = 0.05
COARSE_FACTORS = (1e-3, 1e-2, 0.1, 10.0)  # the coarse grid around the defaults (see _coarse_start)
FINE_FACTORS = (0.3, 3.0)
HELD_OUT_ITERATIONS = 4


@dataclass(frozen=True)
class HeldOut:
    """One measured quantity of one observation: measured, predicted by the defaults, and predicted by a
    fit that did not see the observation."""

    label: str
    scope: str
    quantity: str
    measured: float
    before: float
    held_out: float


@dataclass(frozen=True)
class QuantityErrors:
    """Relative errors (predicted / measured - 1) of one kind of quantity over the observations."""

    quantity: str
    count: int
    median_abs: float
    worst: float  # the error of largest magnitude, with its sign
    rms_log: float  # root mean square of ln(predicted / measured): what the fit minimises (with its prior)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "median_abs": self.median_abs, "worst": self.worst, "rms_log": self.rms_log}


@dataclass(frozen=True)
class CalibrationFit:
    """What a calibration found: the values of the parameters the probes determine, and its errors."""

    values: dict[str, float]  # determined parameters only
    defaults: dict[str, float]  # every parameter before the fit
    sensitivity: dict[str, float]
    before: dict[str, QuantityErrors]
    after: dict[str, QuantityErrors]
    held_out: dict[str, QuantityErrors]  # empty with fewer than two observations
    observations: int
    iterations: int
    held_out_detail: tuple[HeldOut, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape kept with a stored calibration (its ``report``)."""
        return {
            "observations": self.observations,
            "iterations": self.iterations,
            "defaults": self.defaults,
            "sensitivity": self.sensitivity,
            "errors": {
                "before": {q: e.to_dict() for q, e in self.before.items()},
                "after": {q: e.to_dict() for q, e in self.after.items()},
                "held_out": {q: e.to_dict() for q, e in self.held_out.items()},
            },
        }


def summarize(pairs: Sequence[tuple[str, float, float]]) -> dict[str, QuantityErrors]:
    """Per quantity, the median absolute and worst relative error of (quantity, predicted, measured) pairs."""
    out: dict[str, QuantityErrors] = {}
    for quantity in QUANTITIES:
        errors = [p / m - 1.0 for q, p, m in pairs if q == quantity]
        if errors:
            worst = max(errors, key=abs)
            rms = math.sqrt(statistics.fmean(math.log(p / m) ** 2 for q, p, m in pairs if q == quantity))
            out[quantity] = QuantityErrors(quantity, len(errors), statistics.median(map(abs, errors)), worst, rms)
    return out


class _Problem:
    """The residual function of one fit: the observations' measured quantities and the free parameters."""

    def __init__(self, observations: Sequence[Observation], coef: Coefficients, free: Sequence[Parameter]) -> None:
        self.observations = observations
        self.coef = coef
        self.free = free
        self.defaults = default_values(observations[0].hardware, coef)
        self.measured = [{(s, q): v for s, q, v in obs.measured} for obs in observations]
        self.data_count = sum(len(m) for m in self.measured)

    def values(self, theta: Sequence[float]) -> dict[str, float]:
        return {p.name: math.exp(t) for p, t in zip(self.free, theta, strict=True)}

    def theta(self, values: dict[str, float]) -> list[float]:
        return [math.log(values.get(p.name, self.defaults[p.name])) for p in self.free]

    def pairs(self, values: dict[str, float]) -> list[tuple[str, float, float]]:
        """(quantity, predicted, measured) of every measured quantity under ``values``."""
        out: list[tuple[str, float, float]] = []
        for obs, measured in zip(self.observations, self.measured, strict=True):
            predicted = predicted_quantities(obs, values, self.coef)
            out.extend((key[1], max(predicted[key], 1e-30), value) for key, value in measured.items())
        return out

    def residuals(self, theta: list[float]) -> list[float]:
        values = self.values(theta)
        data = [math.log(p / m) for _, p, m in self.pairs(values)]
        prior = [PRIOR_WEIGHT * (t - math.log(self.defaults[p.name])) for p, t in zip(self.free, theta, strict=True)]
        return data + prior


def usable(observations: Sequence[Observation], coef: Coefficients) -> list[Observation]:
    """The observations with their quantities the cost model predicts at all (a phase it does not model, or
    a non-positive measurement, is left out)."""
    out: list[Observation] = []
    for obs in observations:
        predicted = predicted_quantities(obs, {}, coef)
        kept = tuple(m for m in obs.measured if m[2] > 0 and predicted.get((m[0], m[1]), 0.0) > 0)
        if kept:
            out.append(Observation(obs.label, obs.workload, obs.strategy, obs.hardware, obs.device, kept))
    return out


def _coarse_start(problem: _Problem) -> tuple[list[Parameter], dict[str, float]]:
    """Screen the parameters and find a start for the solve, one parameter at a time on a coarse grid.

    A step time is the longer of two clocks (the GPU's work, the host's kernel issuing): a rate on the clock
    that does not bind moves nothing, so its gradient is zero at the defaults however wrong it is (the CPU
    backend runs the GPU model with a catalog GPU's rates, a thousand times its own). Each parameter is tried
    at ``COARSE_FACTORS`` times its value (within bounds); the ones whose trials move some measured quantity
    stay free, and each one moves to its best trial (a coordinate descent on the whole cost, prior
    included). A second pass refines the ones that moved. Returns (free parameters, start values)."""
    theta = problem.theta({})
    residuals = problem.residuals(theta)
    cost = sum(r * r for r in residuals)
    moving: list[int] = []
    moved: list[int] = []
    for factors, indices in ((COARSE_FACTORS, range(len(problem.free))), (FINE_FACTORS, moved)):
        for j in list(indices):
            parameter = problem.free[j]
            lower, upper = math.log(parameter.lower), math.log(parameter.upper)
            base_data = residuals[: problem.data_count]
            best = None
            for factor in factors:
                trial = list(theta)
                trial[j] = min(max(theta[j] + math.log(factor), lower), upper)
                if trial[j] == theta[j]:
                    continue
                trial_residuals = problem.residuals(trial)
                if j not in moving and any(
                    abs(a - b) > 1e-12 for a, b in zip(trial_residuals[: problem.data_count], base_data, strict=True)
                ):
                    moving.append(j)
                trial_cost = sum(r * r for r in trial_residuals)
                if trial_cost < cost:
                    best, cost, residuals = trial[j], trial_cost, trial_residuals
            if best is not None:
                theta[j] = best
                if j not in moved:
                    moved.append(j)
    values = problem.values(theta)
    free = [p for j, p in enumerate(problem.free) if j in moving]
    return free, {p.name: values[p.name] for p in free}


def _solve_free(
    observations: Sequence[Observation],
    coef: Coefficients,
    free: Sequence[Parameter],
    start: dict[str, float] | None = None,
    max_iterations: int = 60,
) -> tuple[_Problem, Solution]:
    """The least-squares solution over the ``free`` parameters (the others at their defaults)."""
    problem = _Problem(observations, coef, free)
    solution = levenberg_marquardt(
        problem.residuals,
        problem.theta(start or {}),
        [math.log(p.lower) for p in free],
        [math.log(p.upper) for p in free],
        data_count=problem.data_count,
        max_iterations=max_iterations,
    )
    return problem, solution


def _determined(
    free: Sequence[Parameter], values: dict[str, float], columns: Sequence[Sequence[float]]
) -> dict[str, float]:
    """The values whose parameters move the data by at least ``DETERMINED`` (``columns``: data rows only)."""
    return {
        p.name: values[p.name]
        for p, column in zip(free, columns, strict=True)
        if math.sqrt(sum(x * x for x in column)) >= DETERMINED
    }


def _held_out_values(
    index: int, kept: Sequence[Observation], problem: _Problem, solution: Solution, refit: bool, coef: Coefficients
) -> dict[str, float]:
    """The determined values of a fit without observation ``index``: one Gauss-Newton step from the full
    fit on its own Jacobian (``refit`` False), or a refit started there (True)."""
    free = problem.free
    lower = [math.log(p.lower) for p in free]
    upper = [math.log(p.upper) for p in free]
    first = sum(len(o.measured) for o in kept[:index])
    rows = range(first, first + len(kept[index].measured))
    if refit:
        rest = [o for j, o in enumerate(kept) if j != index]
        start = problem.values(list(solution.theta))
        rest_problem, rest_solution = _solve_free(rest, coef, free, start, HELD_OUT_ITERATIONS)
        rest_data = [c[: rest_problem.data_count] for c in rest_solution.columns]
        return _determined(free, rest_problem.values(list(rest_solution.theta)), rest_data)
    theta = newton_step_without(solution, rows, lower, upper)
    data = [[x for i, x in enumerate(c[: problem.data_count]) if i not in rows] for c in solution.columns]
    return _determined(free, problem.values(list(theta)), data)


def calibrate(
    observations: Sequence[Observation],
    coef: Coefficients = DEFAULT_COEFFICIENTS,
    *,
    leave_one_out: bool = True,
    refit: bool = False,
) -> CalibrationFit:
    """Fit the parameters to ``observations`` (all of one device) and report the errors before, after and,
    with ``leave_one_out``, held out: each observation predicted by a fit to all the others. That fit is one
    Gauss-Newton step from the full fit without the observation's residuals (its Jacobian is the full
    fit's: no new predictions), or with ``refit`` a solve of its own started from the full fit (at most
    ``HELD_OUT_ITERATIONS`` iterations; some ten times slower). ``benchmarks/accuracy.py`` compares both."""
    kept = usable(observations, coef)
    if not kept:
        raise ValueError("no observation has a quantity the cost model predicts")
    full = _Problem(kept, coef, PARAMETERS)
    free, start = _coarse_start(full)
    problem, solution = _solve_free(kept, coef, free, start)
    sensitivity = dict.fromkeys((p.name for p in PARAMETERS), 0.0)
    sensitivity.update({p.name: s for p, s in zip(free, solution.sensitivity, strict=True)})
    data_columns = [c[: problem.data_count] for c in solution.columns]
    determined = _determined(free, problem.values(list(solution.theta)), data_columns)
    held: list[tuple[str, float, float]] = []
    detail: list[HeldOut] = []
    if leave_one_out and len(kept) >= 2:
        for i, obs in enumerate(kept):
            values = _held_out_values(i, kept, problem, solution, refit, coef)
            before = predicted_quantities(obs, {}, coef)
            after = predicted_quantities(obs, values, coef)
            for scope, quantity, measured in obs.measured:
                key = (scope, quantity)
                held.append((quantity, max(after[key], 1e-30), measured))
                detail.append(HeldOut(obs.label, scope, quantity, measured, before[key], after[key]))
    return CalibrationFit(
        values=determined,
        defaults=full.defaults,
        sensitivity=sensitivity,
        before=summarize(full.pairs({})),
        after=summarize(full.pairs(determined)),
        held_out=summarize(held),
        observations=len(kept),
        iterations=solution.iterations,
        held_out_detail=tuple(detail),
    )
