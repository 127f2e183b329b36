"""Bytes of generation and of a scoring forward, traced from transformers' own ``generate`` on the meta device.

The RLHF probe (:mod:`probes.step.phases_rlhf`) generates with ``model.generate(...)`` (transformers' KV cache class,
``DynamicCache``) and scores with a no-grad forward whose logits go to :func:`probes.model.logprobs.token_logprobs`.
Here the model cut to two decoder layers (:func:`probes.trace.activations.cut_model`, in eval mode as the probe
runs it) does the same under the live-tensor tracker, at a few shapes, and every size is fitted exactly like the
training windows (:func:`probes.trace.activations._fit`: polynomials over ``store.activation_terms.TERM_BASIS``
from ``FIT_SHAPES``, checked at ``CHECK_SHAPE``), with b the sequences and s the prompt (prefill), the tokens
already in the KV cache (a decoding step) or the scored sequence's tokens (scoring).

**Generation.** The library's ``generate`` itself runs, with the probe's arguments (:func:`generate_kwargs`:
sampled, ``min_new_tokens`` = ``max_new_tokens``, an all-ones attention mask). It runs the prefill (one forward
over the prompt with ``logits_to_keep=1``) and the first decoding step (one token over a cache of ``s`` tokens),
each followed by ``_sample``'s own work: the fp32 copy of the last logits, the logits processors, softmax and
multinomial, the new ``input_ids``; it is stopped (an exception from the model's forward pre-hook) as the second
decoding step's forward begins. On the meta device a tensor has no value, and generate reads a few: the answers a
real run of the probe gets are given by :class:`_KnownAnswers` (the prompt has no padding, the mask is all ones,
token ids are not negative, no sequence has finished), and the special-token checks (which only warn) run on
the CPU. Any other value generate asks for stops the trace (the setting is then left to the formulas).

The KV cache is what ``ModelSpec.kv_windows`` already counts (the cache rule of the cost model), so it is taken out
of the windows: a cache tensor alive at the end of the prefill is not counted in it, and in a decoding step a
layer's new K or V (``torch.cat`` of the old one and the new token) counts only as the old tensor's bytes until
the old one is freed: the copy's transient, without the token it adds to the cache. Windows (each an ordered list
of changes of live bytes, as in :mod:`store.activation_terms`):

- ``prefill``: from generate's call until the prefill's LM head; ``prefill_head``: from there until the first
  decoding step's forward (logits, sampling, the new ids);
- ``decode_step``: what generate holds beyond the cache when a decoding step begins (the previous step's fp32
  logits, scores and probabilities, the grown ids), then that step's forward until its LM head; ``decode_head``:
  from there until the next step's forward. A step at a cache of ``s`` tokens runs the forward of token s + 1.
- ``scoring_forward``: a no-grad forward with ``use_cache=False`` until its LM head; ``scoring_head``: from there
  until ``token_logprobs`` has returned and the model's output is dropped (the log-probs stay, as the probe
  keeps them).

The cut model's two decoder layers of a sliding-window family (Gemma 3) are sliding layers; at the traced sizes
(below any window) they run what a full-attention layer runs, which is what a decoding step's peak follows.
"""

from __future__ import annotations

import contextlib
import itertools
import linecache
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from probes.model.generation import generate_kwargs
from probes.trace.activations import CHECK_SHAPE, FIT_POINTS, FIT_SHAPES, FitError, fit_inverse
from store.activation_terms import GENERATION_WINDOWS, compact, evaluate
from store.alloc_stream import ALLOC, FREE, PHASE

# The values generate reads from tensors, as a real run of the probe's generate gets them: (function, a
# fragment of the line that reads it, the answer). Found on the caller's line in transformers' code.
_ANSWERS: tuple[tuple[str, str, bool], ...] = (
    ("generate", "has_right_padding", False),  # the prompts are not padded
    ("generate", '(model_kwargs["attention_mask"] == 1).all()', True),  # the probe's mask is all ones
    ("_get_logits_processor", "(encoder_input_ids < 0).any()", False),  # token ids are not negative
    ("__call__", "unfinished_sequences.max() == 0", False),  # min_new_tokens: no sequence ends early
)


class GenerationStopped(Exception):
    """Raised by the model's forward pre-hook to end ``generate`` after the traced decoding step."""


@dataclass(frozen=True)
class GenerationTrace:
    """The windows of :data:`store.activation_terms.GENERATION_WINDOWS` at one (sequences, tokens) shape, and
    as recorded, the cache in: the most live bytes above generate's start during the decoding step, and the
    KV cache's bytes after it."""

    windows: dict[str, tuple[int, ...]]
    step_peak: int = 0
    cache_after: int = 0


@contextlib.contextmanager
def _known_answers() -> Iterator[None]:
    """Answer generate's reads of meta tensors (:data:`_ANSWERS`); run the special-token checks on the CPU."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers.generation import utils as generation

    class _KnownAnswers(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
                return _answer()
            return func(*args, **(kwargs or {}))

    original = generation.GenerationMixin._prepare_special_tokens

    def special_tokens(self: Any, generation_config: Any, *args: Any, **kwargs: Any) -> None:
        device = kwargs.pop("device", None)
        original(self, generation_config, *args, device="cpu", **kwargs)
        for name in ("_bos_token_tensor", "_eos_token_tensor", "_pad_token_tensor", "_decoder_start_token_tensor"):
            value = getattr(generation_config, name, None)
            if value is not None:
                setattr(generation_config, name, value.to(device))

    generation.GenerationMixin._prepare_special_tokens = special_tokens  # type: ignore[method-assign]
    try:
        with _KnownAnswers():
            yield
    finally:
        generation.GenerationMixin._prepare_special_tokens = original  # type: ignore[method-assign]


def _answer() -> bool:
    """The answer to a read of a meta tensor's value, from the transformers line that asks (or an error)."""
    frame = sys._getframe(2)
    while frame is not None and "transformers" not in frame.f_code.co_filename:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        raise RuntimeError("a tensor's value was read on the meta device outside transformers")
    code = frame.f_code
    first, last = next(itertools.islice(code.co_positions(), frame.f_lasti // 2, None))[:2]
    first, last = first or frame.f_lineno, last or frame.f_lineno  # the lines of the expression being run
    line = "".join(linecache.getline(code.co_filename, n) for n in range(first, last + 1))
    for function, fragment, answer in _ANSWERS:
        if frame.f_code.co_name == function and fragment in line:
            return answer
    raise RuntimeError(f"generate reads a tensor's value the trace does not know: {line.strip()!r}")


def _cache_keys(tracker: Any, cache: Any) -> dict[tuple[int, str], tuple[int, int]]:
    """(layer, "keys"|"values") -> (stream key, bytes) of a KV cache's tensors that the tracker counts."""
    out = {}
    for index, layer in enumerate(getattr(cache, "layers", ())):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            key = tracker.key_of(tensor) if tensor is not None else None
            if tensor is not None and key is not None:
                out[(index, name)] = (key, tensor.untyped_storage().nbytes())
    return out


def trace_generation(model: Any, sequences: int, tokens: int) -> GenerationTrace:
    """Trace the probe's generate (prefill of ``tokens`` tokens, one decoding step) and its scoring forward of
    ``tokens`` tokens, ``sequences`` sequences, on the device of the two-layer ``model`` (meta, or the CPU to
    check a meta trace against a real run)."""
    import torch

    from probes.measure.meta_results import run_meta_op
    from probes.measure.tracker import LiveTensorTracker
    from probes.model.logprobs import token_logprobs
    from probes.model.sequences import unpacked_sequences

    device = next(model.parameters()).device
    run_op = run_meta_op if device.type == "meta" else None  # a meta op's result is described once per signature
    tracker = LiveTensorTracker(device_types=(device.type,), record_stream=True, run_op=run_op)
    forwards: list[dict[tuple[int, str], tuple[int, int]]] = []
    stage = ["prefill.head"]

    def forward_started(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        forwards.append(_cache_keys(tracker, kwargs.get("past_key_values")))
        tracker.mark_phase(f"forward{len(forwards)}")
        if len(forwards) == 3:
            raise GenerationStopped

    def head_started(*args: Any) -> None:
        tracker.mark_phase(stage[0])
        stage[0] = {"prefill.head": "decode.head", "decode.head": "decode2.head"}.get(stage[0], stage[0])

    was_training = model.training
    model.eval()
    handles = [
        model.register_forward_pre_hook(forward_started, with_kwargs=True),
        model.get_output_embeddings().register_forward_pre_hook(head_started),
    ]
    low = min(3, model.config.vocab_size - 1)
    ids = torch.randint(low, model.config.vocab_size, (sequences, tokens), device=device)
    pad = getattr(model.config, "pad_token_id", None)
    try:
        with tracker, unpacked_sequences(), torch.no_grad():
            tracker.track_existing(model.parameters())
            tracker.mark_phase("generate")
            with contextlib.suppress(GenerationStopped), _known_answers():
                model.generate(input_ids=ids, do_sample=True, **generate_kwargs(ids, 3, 0 if pad is None else pad))
            handles.pop(0).remove()
            stage[0] = "scoring.head"
            tracker.mark_phase("scoring")
            logp = token_logprobs(model(input_ids=ids, use_cache=False).logits, ids)
            tracker.mark_phase("scoring.end")
            del logp
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return _read(tracker.stream(), forwards)


def _read(stream: Any, forwards: list[dict[tuple[int, str], tuple[int, int]]]) -> GenerationTrace:
    """The windows of a recorded stream, with the KV cache taken out (see the module docstring)."""
    at: dict[str, int] = {}
    for i, (op, key, _, _, _) in enumerate(stream.events):
        if op == PHASE:
            at.setdefault(stream.phases[key], i)
    if "forward3" not in at:
        raise RuntimeError("generate did not reach its second decoding step")
    prefill_cache = {key for key, _ in forwards[1].values()}
    # a decoding step's new cache tensor counts as the old one it replaces, until that one is freed
    replaced = {new: forwards[1][slot][1] for slot, (new, _) in forwards[2].items() if slot in forwards[1]}
    replaced = {new: size for new, size in replaced.items() if new not in prefill_cache}
    decode_cache = {key for key, _ in forwards[2].values()}
    sizes: dict[int, int] = {}
    deltas: list[int] = []
    live, recorded = 0, []  # live bytes as recorded, the cache in
    for op, key, size, _, _ in stream.events:
        delta = 0
        if op == ALLOC:
            sizes[key] = delta = size
            live += size
            if key in prefill_cache or (key in decode_cache and key not in replaced):
                delta = 0  # a cache tensor: the cache rule counts it
            elif key in replaced:
                delta = replaced[key]
        elif op == FREE:
            delta = -sizes.get(key, 0)
            live -= sizes.get(key, 0)
        deltas.append(delta)
        recorded.append(live)

    def window(first: str, last: str) -> tuple[int, ...]:
        return tuple(d for d in deltas[at[first] : at[last]] if d)

    before_step = sum(deltas[at["generate"] : at["forward2"]])  # what generate holds beyond the cache
    return GenerationTrace(
        windows={
            "prefill": window("generate", "prefill.head"),
            "prefill_head": window("prefill.head", "forward2"),
            "decode_step": (before_step, *window("forward2", "decode.head")),
            "decode_head": window("decode.head", "forward3"),
            "scoring_forward": window("scoring", "scoring.head"),
            "scoring_head": window("scoring.head", "scoring.end"),
        },
        step_peak=max(recorded[at["forward2"] : at["forward3"]]) - recorded[at["generate"]],
        cache_after=sum(size for _, size in forwards[2].values()),
    )


def fit_generation(traces: list[GenerationTrace], check: GenerationTrace) -> dict[str, Any]:
    """The exact fit of every generation window over FIT_SHAPES, checked on CHECK_SHAPE (FitError otherwise).

    As :func:`probes.trace.activations._fit` (the same basis, shapes, check and output), with each run of
    allocations (or frees) summed first where every shape has the same runs (which keeps every running-sum peak,
    see :func:`store.activation_terms.compact`), and one inverse of the basis matrix for all sizes."""

    inverse, denominator = _integer_inverse()
    out = {}
    for name in GENERATION_WINDOWS:
        windows = [_runs(t.windows[name]) for t in [*traces, check]]
        if len({tuple(len(run) for run in window) for window in windows}) != 1:
            windows = [[(value,) for value in t.windows[name]] for t in [*traces, check]]  # no common runs
        if len({len(window) for window in windows}) != 1:
            raise FitError(f"{name}: generation makes a different number of tensors at different shapes")
        fitted = []
        for i, checked in enumerate(sum(run) for run in windows[-1]):
            values = [sum(window[i]) for window in windows[:-1]]
            numerators = [sum(a * v for a, v in zip(row, values, strict=True)) for row in inverse]
            coefficients = [n // denominator if n % denominator == 0 else n / denominator for n in numerators]
            if evaluate(coefficients, *CHECK_SHAPE) != checked:
                raise FitError(f"{name}[{i}]: {evaluate(coefficients, *CHECK_SHAPE)} fitted, {checked} traced")
            fitted.append(coefficients)
        out[name] = compact(fitted)
    return out


def _runs(window: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The window cut into runs of changes of one sign."""
    runs: list[list[int]] = []
    for value in window:
        if runs and (runs[-1][-1] > 0) == (value > 0):
            runs[-1].append(value)
        else:
            runs.append([value])
    return [tuple(run) for run in runs]


def _integer_inverse() -> tuple[list[list[int]], int]:
    """(integer matrix, denominator) whose quotient is the inverse of the fit shapes' basis matrix
    (:func:`probes.trace.activations.fit_inverse`)."""

    inverse = fit_inverse(FIT_POINTS)
    denominator = math.lcm(*(x.denominator for row in inverse for x in row))
    return [[int(x * denominator) for x in row] for row in inverse], denominator


def trace_generation_terms(model: Any) -> dict[str, Any]:
    """The fitted generation and scoring windows of a two-layer ``model`` (inside the trace's kernel routing)."""

    traces = [trace_generation(model, b, s) for b, s in FIT_SHAPES]
    return fit_generation(traces, trace_generation(model, *CHECK_SHAPE))
