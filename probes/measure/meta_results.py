"""The results of ops on the meta device, computed once per signature: what makes a meta trace fast.

A meta tensor has no data, so an op on meta tensors is a pure function of its arguments' metadata (shape,
strides, storage offset, dtype) and its non-tensor arguments: the same call gives the same shapes, strides
and dtypes every time. A trace repeats its calls many times (every decoder layer, the training, scoring and
policy passes, every fitted shape, every variant), and since PyTorch 2.x most pointwise and reduction ops
reach the meta device through Python reference implementations (``torch/_meta_registrations.py``
``activate_meta`` registers ``torch._refs`` decompositions as the Meta kernels): about a millisecond and a
half of Python per ``mul``, against a few microseconds to describe the result again.

:func:`run_meta_op` calls the op the first time a signature is seen and keeps the description of its
outputs; later calls make fresh meta tensors of the same shapes, strides and dtypes (``empty_strided``),
which is what the kernel would have returned. Only calls that can be described so are kept: every tensor
argument on the meta device, an op that mutates nothing and whose outputs alias no input (its schema's
returns carry no alias annotation), outputs that are fresh tensors (or ``None``) whose storages hold exactly
their strided extent. Anything else (a CPU scalar tensor, an in-place op, a view, a list output) runs the
op itself, every time.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MAX_KEPT", "cached_signatures", "run_meta_op"]

MAX_KEPT = 200_000  # signatures kept per process (a catalog trace sees a few thousand)

_Description = tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype] | None, ...]
_KEPT: dict[tuple[Any, ...], tuple[_Description, bool]] = {}  # signature -> (outputs, returned as a tuple)
_NOT_DESCRIBABLE = object()


def cached_signatures() -> int:
    """How many signatures are kept now (for tests and reports)."""
    return len(_KEPT)


def _describable_op(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    return all(ret.alias_info is None and str(ret.type) in ("Tensor", "Tensor?") for ret in schema.returns)


def _argument_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.device.type != "meta" or value.layout != torch.strided or value.is_quantized:
            return _NOT_DESCRIBABLE
        return ("T", value.dtype, tuple(value.shape), value.stride(), value.storage_offset())
    if value is None or isinstance(value, bool | int | float | str | torch.dtype | torch.device):
        return (type(value), value)
    if isinstance(value, torch.memory_format | torch.layout):
        return (type(value), str(value))
    if isinstance(value, list | tuple):
        items = tuple(_argument_key(item) for item in value)
        return _NOT_DESCRIBABLE if any(item is _NOT_DESCRIBABLE for item in items) else (type(value), items)
    return _NOT_DESCRIBABLE


def _signature(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    names = sorted(kwargs)
    keys = [_argument_key(value) for value in (*args, *(kwargs[name] for name in names))]
    if any(key is _NOT_DESCRIBABLE for key in keys):
        return None
    return (func, tuple(names), *keys)


def _storages(values: Any) -> set[int]:
    found: set[int] = set()
    for value in values:
        if isinstance(value, torch.Tensor):
            found.add(value.untyped_storage()._cdata)
        elif isinstance(value, list | tuple):
            found |= _storages(value)
    return found


def _describe(out: Any, inputs: set[int]) -> tuple[_Description, bool] | None:
    outputs = out if isinstance(out, tuple) else (out,)
    described: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype] | None] = []
    seen = set(inputs)
    for tensor in outputs:
        if tensor is None:
            described.append(None)
            continue
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "meta" or tensor.layout != torch.strided:
            return None
        storage = tensor.untyped_storage()._cdata
        if storage in seen:
            return None  # an input's storage, or another output's: not a fresh tensor
        seen.add(storage)
        last = sum((size - 1) * step for size, step in zip(tensor.shape, tensor.stride(), strict=True))
        nbytes = (last + 1) * tensor.element_size() if tensor.numel() else 0
        if tensor.storage_offset() or tensor.untyped_storage().nbytes() != nbytes:
            return None  # not a fresh tensor of its own extent: let the op make it every time
        described.append((tuple(tensor.shape), tensor.stride(), tensor.dtype))
    return tuple(described), isinstance(out, tuple)


def _make(described: _Description, as_tuple: bool) -> Any:
    outputs = tuple(
        None if item is None else torch.empty_strided(item[0], item[1], dtype=item[2], device="meta")
        for item in described
    )
    return outputs if as_tuple else outputs[0]


def run_meta_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """``func(*args, **kwargs)``, from the kept description of its outputs where this signature was seen
    before and can be described (see the module docstring); otherwise the op itself."""
    kwargs = kwargs or {}
    signature = _signature(func, args, kwargs) if _describable_op(func) else None
    if signature is not None:
        kept = _KEPT.get(signature)
        if kept is not None:
            return _make(*kept)
    out = func(*args, **kwargs)
    if signature is not None and len(_KEPT) < MAX_KEPT:
        described = _describe(out, _storages((*args, *kwargs.values())))
        if described is not None:
            _KEPT[signature] = described
    return out
