"""Bounded Levenberg-Marquardt in pure Python, for a few dozen parameters and a few hundred residuals.

Parameters are searched in log space (every calibrated coefficient is positive and its errors are
relative), clipped to their bounds after each step (a projected step). The Jacobian is taken by forward
differences: the cost model is a program, not a formula, and is cheap to evaluate (about 0.3 ms a
prediction). Normal equations are solved by Gaussian elimination with partial pivoting.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Residuals = Callable[[list[float]], list[float]]
STEP = 1e-4  # forward-difference step in log space (a 0.01% change of a coefficient)


@dataclass(frozen=True)
class Solution:
    """Where the search stopped: the log-parameters, their cost, the Jacobian's column norms there."""

    theta: tuple[float, ...]
    cost: float  # half the sum of squared residuals
    iterations: int
    sensitivity: tuple[float, ...]  # root sum of squares of each parameter's column of data residuals
    residuals: tuple[float, ...] = ()  # at ``theta``
    columns: tuple[tuple[float, ...], ...] = ()  # the Jacobian at ``theta``, one column per parameter


def jacobian(
    residuals: Residuals, theta: Sequence[float], upper: Sequence[float], at: Sequence[float]
) -> list[list[float]]:
    """Forward-difference columns of ``residuals`` at ``theta`` (``at`` = ``residuals(theta)``), stepping
    back where a step forward would cross the upper bound."""
    columns = []
    for j in range(len(theta)):
        shifted = list(theta)
        step = STEP if theta[j] + STEP <= upper[j] else -STEP
        shifted[j] += step
        columns.append([(a - b) / step for a, b in zip(residuals(shifted), at, strict=True)])
    return columns


def newton_step_without(
    solution: Solution, rows: range, lower: Sequence[float], upper: Sequence[float]
) -> tuple[float, ...]:
    """The Gauss-Newton step from ``solution`` for the problem without the residuals ``rows``: the
    approximate leave-one-out minimum (exact for a model linear in its log-parameters near the minimum)."""
    keep = [i for i in range(len(solution.residuals)) if i not in rows]
    cols = [[c[i] for i in keep] for c in solution.columns]
    r = [solution.residuals[i] for i in keep]
    normal = [[sum(x * y for x, y in zip(ci, cj, strict=True)) for cj in cols] for ci in cols]
    for j in range(len(cols)):
        normal[j][j] += 1e-9 * max(normal[j][j], 1.0)
    gradient = [sum(x * y for x, y in zip(c, r, strict=True)) for c in cols]
    delta = _solve(normal, [-g for g in gradient])
    return tuple(min(max(t + d, lo), hi) for t, d, lo, hi in zip(solution.theta, delta, lower, upper, strict=True))


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """``matrix @ x = rhs`` by Gaussian elimination with partial pivoting (a small dense system)."""
    n = len(rhs)
    a = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            continue
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            if factor:
                for c in range(col, n + 1):
                    a[r][c] -= factor * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        if abs(a[r][r]) < 1e-300:
            continue
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


def _cost(residuals: Sequence[float]) -> float:
    return 0.5 * sum(r * r for r in residuals)


def levenberg_marquardt(
    residuals: Residuals,
    theta0: Sequence[float],
    lower: Sequence[float],
    upper: Sequence[float],
    *,
    data_count: int,
    max_iterations: int = 60,
    tolerance: float = 1e-9,
) -> Solution:
    """Minimise half the sum of squares of ``residuals(theta)`` within [lower, upper].

    The first ``data_count`` residuals are the data's (the rest are priors); ``sensitivity`` is measured on
    those alone, so a parameter that no measurement moves shows 0.
    """
    k = len(theta0)
    clip = [(lo, hi) for lo, hi in zip(lower, upper, strict=True)]
    theta = [min(max(t, lo), hi) for t, (lo, hi) in zip(theta0, clip, strict=True)]
    r = residuals(theta)
    cost = _cost(r)
    damping = 1e-3
    iterations = 0
    upper_bounds = [hi for _, hi in clip]
    for iterations in range(1, max_iterations + 1):  # noqa: B007 - the count is returned
        columns = jacobian(residuals, theta, upper_bounds, r)
        normal = [[sum(x * y for x, y in zip(ci, cj, strict=True)) for cj in columns] for ci in columns]
        gradient = [sum(x * y for x, y in zip(c, r, strict=True)) for c in columns]
        # a parameter on a bound that the gradient pushes further out stays there: the step is solved for the
        # others alone (an active set), so they move as if it were fixed instead of chasing a clipped step
        free = [
            j
            for j in range(k)
            if not (theta[j] <= clip[j][0] and gradient[j] > 0) and not (theta[j] >= clip[j][1] and gradient[j] < 0)
        ]
        improved = False
        while damping < 1e10 and free:
            damped = [[normal[i][j] for j in free] for i in free]
            for n, j in enumerate(free):
                damped[n][n] += damping * max(normal[j][j], 1e-12)
            step_free = _solve(damped, [-gradient[j] for j in free])
            delta = [0.0] * k
            for n, j in enumerate(free):
                delta[j] = step_free[n]
            trial = [min(max(t + d, lo), hi) for t, d, (lo, hi) in zip(theta, delta, clip, strict=True)]
            trial_r = residuals(trial)
            trial_cost = _cost(trial_r)
            if trial_cost < cost:
                improved = True
                drop = cost - trial_cost
                theta, r, cost = trial, trial_r, trial_cost
                damping = max(damping / 3, 1e-9)
                break
            damping *= 4
        if not improved or drop <= tolerance * max(cost, 1e-12):
            break
    columns = jacobian(residuals, theta, upper_bounds, r)  # at the minimum, for sensitivities and held-out steps
    sensitivity = tuple(math.sqrt(sum(x * x for x in c[:data_count])) for c in columns)
    return Solution(tuple(theta), cost, iterations, sensitivity, tuple(r), tuple(tuple(c) for c in columns))
