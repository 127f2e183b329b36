"""What a ZeRO-3 engine's counted steps (:mod:`probes.trace.zero3_host`) say per module, per parameter tensor and
per layer: each region's calls and host seconds fitted over depth (:func:`region_costs`, :func:`rates`), the
figures ``store/zero3_host_counts.json`` keeps and ``search.model.zero3_time`` prices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REGIONS = (
    *("pre_forward", "post_forward", "pre_backward", "post_backward", "grad_hook", "fetch", "release"),
    *("all_gather", "grad_reduce", "partition_grads", "step"),
)


def recompute_calls(counted: dict[str, Any], checkpointing: bool) -> int:
    """Module forward calls inside the backward (the checkpointed layers' recompute): the forward hooks beyond the
    backward's pre-hooks' own count (without checkpointing, forward and backward pre-hooks run equally often)."""
    return counted["calls"]["pre_forward"] - counted["calls"]["pre_backward"] if checkpointing else 0


def _slope(cases: list[dict[str, Any]], read: Callable[[dict[str, Any]], float]) -> tuple[float, float]:
    """(per layer, outside the layers) of a count read from the same configuration at two depths."""
    a, b = sorted(cases, key=lambda c: c["layers"])[:2]
    slope = (read(b) - read(a)) / (b["layers"] - a["layers"])
    return slope, read(a) - slope * a["layers"]


def _region_calls(case: dict[str, Any], name: str) -> int:
    if name in ("forward_wrapper", "backward_wrapper"):
        return int(case["module_calls"][name.split("_")[0]])
    return int(case["calls"][name])


GRADIENT_REGIONS = ("grad_hook", "grad_reduce", "partition_grads", "step")  # their code differs with offload


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``spent = per_call x calls + fixed`` with ``fixed >= 0`` (else through the origin)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:  # once a step whatever the configuration (the optimizer step): all of it is fixed
        return 0.0, mean_y
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var
    fixed = mean_y - slope * mean_x
    if fixed < 0:
        return sum(x * y for x, y in points) / sum(x * x for x, _ in points), 0.0
    return slope, fixed


def region_costs(cases: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Each region's op-equivalents per call and fixed per step over ``cases`` (a region's first call in a step
    does more: the trace's start, the step's releases): a least-squares line through every case's (calls, seconds
    in op-equivalents), so the timing noise of one case weighs little."""
    out: dict[str, tuple[float, float]] = {}
    for name in (*REGIONS, "forward_wrapper", "backward_wrapper"):
        points = [
            (calls, c["op_equivalents_per_call"][name] * calls) for c in cases for calls in [_region_calls(c, name)]
        ]
        out[name] = _fit(points)
    return out


def rates(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """What the cost model reads (``search.model.zero3_time``): hook calls per module, per parameter tensor and
    per layer (each from the two depths' difference, so they hold at any depth), and each region's host cost in
    op-equivalents per call and fixed per step (:func:`region_costs`: the module hooks over every case, the
    gradient hooks and the step by the optimizer's place)."""

    def kind(ckpt: bool, offload: bool) -> list[dict[str, Any]]:
        place = "cpu" if offload else "none"
        return [c for c in cases if c["gradient_checkpointing"] == ckpt and c["offload_optimizer"] == place]

    plain, ckpt = kind(False, False), kind(True, False)
    modules, modules_outside = _slope(plain, lambda c: c["structure"]["modules"])
    tensors = _slope(plain, lambda c: c["structure"]["param_tensors"])[0]

    def calls(group: list[dict[str, Any]], region: str) -> float:
        return _slope(group, lambda c: c["calls"][region])[0]

    out: dict[str, Any] = {
        "modules_per_layer": modules,
        "modules_outside_layers": modules_outside,
        "param_tensors_per_layer": tensors,
        "forward_calls_per_module": calls(plain, "pre_forward") / modules,
        "recompute_calls_per_module": (calls(ckpt, "pre_forward") - calls(plain, "pre_forward")) / modules,
        "backward_pre_calls_per_module": calls(plain, "pre_backward") / modules,
        "backward_post_calls_per_module": calls(plain, "post_backward") / modules,
        "grad_hooks_per_tensor": calls(plain, "grad_hook") / tensors,
        "grad_reduces_per_tensor": calls(plain, "grad_reduce") / tensors,
        "gathers_per_layer": _slope(plain, lambda c: c["gathered_params"])[0],
        "recompute_gathers_per_layer": _slope(ckpt, lambda c: c["gathered_params"])[0]
        - _slope(plain, lambda c: c["gathered_params"])[0],
    }
    pooled = region_costs(cases)  # the module hooks run the same code whatever the optimizer's place
    for offload in (False, True):
        own = region_costs(kind(False, offload) + kind(True, offload))
        costs = {name: own[name] if name in GRADIENT_REGIONS else pooled[name] for name in pooled}
        suffix = "_offload" if offload else ""
        out[f"op_equivalents{suffix}"] = {name: per for name, (per, _) in costs.items()}
        out[f"fixed_op_equivalents{suffix}"] = {name: fixed for name, (_, fixed) in costs.items()}
    return out
