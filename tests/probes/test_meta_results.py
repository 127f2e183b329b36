"""Meta-op results described once per signature (probes.measure.meta_results): the same tensors, fresh storages,
and a meta trace that says exactly what calling every op says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from tiny_models import tiny_llama_hf_config

import probes.measure.meta_results as meta_results
from probes.measure.meta_results import run_meta_op
from probes.trace.activations import cut_model, trace_step

aten = torch.ops.aten


@pytest.fixture
def empty_cache() -> Iterator[None]:
    kept = dict(meta_results._KEPT)
    meta_results._KEPT.clear()
    yield
    meta_results._KEPT.clear()
    meta_results._KEPT.update(kept)


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (aten.mul.Tensor, (_meta(2, 8, 16), _meta(16))),  # broadcast
        (aten.add.Tensor, (_meta(4, 16).t(), _meta(4, 16).t())),  # strides follow the inputs (transposed)
        (aten.mul.Tensor, (_meta(3, 5, dtype=torch.int64), 0.5)),  # type promotion by a Python scalar
        (aten.sum.dim_IntList, (_meta(2, 8, 16), [-1])),
        (aten._to_copy.default, (_meta(4, 4),)),
    ],
)
def test_a_kept_result_has_the_shape_strides_and_dtype_the_op_gives_in_a_fresh_storage(
    op: object, args: tuple[object, ...], empty_cache: None
) -> None:
    kwargs = {"dtype": torch.float32} if op is aten._to_copy.default else {}
    first = run_meta_op(op, args, kwargs)
    assert meta_results.cached_signatures() == 1
    again = run_meta_op(op, args, kwargs)
    assert meta_results.cached_signatures() == 1  # the second call was answered from the description
    for got in (first, again):
        assert (got.shape, got.stride(), got.dtype) == (first.shape, first.stride(), first.dtype)
    expected = op(*args, **kwargs)  # type: ignore[operator]
    assert (again.shape, again.stride(), again.dtype) == (expected.shape, expected.stride(), expected.dtype)
    assert again.untyped_storage()._cdata != first.untyped_storage()._cdata
    inputs = {arg.untyped_storage()._cdata for arg in args if isinstance(arg, torch.Tensor)}
    assert again.untyped_storage()._cdata not in inputs


def test_views_in_place_ops_and_non_meta_tensors_run_the_op_every_time(empty_cache: None) -> None:
    base = _meta(4, 8)
    view = run_meta_op(aten.t.default, (base,), None)  # a view: its storage is the input's
    assert view.untyped_storage()._cdata == base.untyped_storage()._cdata
    out = run_meta_op(aten.mul_.Tensor, (base, 2), None)
    assert out is base
    cpu = torch.ones(3)
    assert run_meta_op(aten.mul.Tensor, (cpu, cpu), None).tolist() == [1.0, 1.0, 1.0]
    assert meta_results.cached_signatures() == 0


def test_an_op_that_returns_an_input_storage_is_not_kept(empty_cache: None) -> None:
    base = _meta(4, 8)

    class ReturnsInput:  # an op whose schema promises a fresh output but whose kernel hands back its input
        _schema = aten.clone.default._schema

        def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor

    assert run_meta_op(ReturnsInput(), (base,), None) is base
    assert meta_results.cached_signatures() == 0


def test_a_meta_trace_with_kept_results_says_what_calling_every_op_says(empty_cache: None) -> None:
    model = cut_model({"model_type": "llama", **tiny_llama_hf_config()}, "bf16", "sdpa")
    fast = trace_step(model, 2, 16)
    assert meta_results.cached_signatures() > 0
    kept = dict(meta_results._KEPT)
    meta_results._KEPT.clear()
    limit = meta_results.MAX_KEPT
    meta_results.MAX_KEPT = 0  # nothing kept: every op runs
    try:
        slow = trace_step(model, 2, 16)
    finally:
        meta_results.MAX_KEPT = limit
        meta_results._KEPT.update(kept)
    assert fast == slow
