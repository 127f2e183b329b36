"""RLHF generation, scoring and the actor's log-prob loss read the traced windows where the model has them.

Pure: the windows are the catalog's package data (``store/catalog_activations.json``, traced from transformers'
generate by ``probes.trace.generation``; checked against real CPU runs in tests/probes/test_generation_trace.py).
Here a window is replaced by one allocation of a known size: the moment that runs it must hold it, byte for byte.
"""

from __future__ import annotations

import dataclasses

import pytest

from search import DEFAULT_COEFFICIENTS, predict
from search.model.activation_sources import source
from search.model.placement import trained_placement
from search.rlhf.memory import forward_live, generation_live
from store.activation_terms import GENERATION_WINDOWS, TERM_BASIS, terms_key, valid_terms
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, ModelSpec, RLHFStrategy, TrainedModelStrategy, Workload

GiB = 2**30
EXTRA = 6 * GiB  # larger than any traced window of these workloads
KEY = terms_key("bf16", "eager")
COEF = DEFAULT_COEFFICIENTS


def _constant(size: int) -> list[float]:
    return [size] + [0] * (len(TERM_BASIS) - 1)


def _with(model: ModelSpec, window: str | None, size: int = EXTRA) -> ModelSpec:
    """``model`` whose traced ``window`` is one allocation of ``size`` bytes (None: unchanged; "": without any
    generation window, as an older trace)."""
    terms = dict(model.activation_terms[KEY])
    windows = dict(terms["windows"])
    if window == "":
        windows = {name: value for name, value in windows.items() if name not in GENERATION_WINDOWS}
    elif window is not None:
        windows[window] = [_constant(size)]
    return dataclasses.replace(model, activation_terms={KEY: {**terms, "windows": windows}})


def _phases(window: str | None) -> dict[str, int]:
    actor = _with(get_model("opt-1.3b"), window)
    critic = get_model("opt-350m")
    workload = Workload(kind="ppo", model=actor, seq_len=512, global_batch=8, prompt_len=256, gen_len=256,
                        critic_model=critic, reward_model=critic, dtype="bf16", attn_impl="eager")  # fmt: skip
    layout = TrainedModelStrategy(zero_stage=2)
    strategy = RLHFStrategy(actor=layout, critic=layout, hybrid_engine=False, generation_batch=8, micro_batch=4,
                            grad_accum=2, empty_cache="never")  # fmt: skip
    hw = Hardware(gpu=get_gpu("A100-80G"), gpu_memory_bytes=80 * GiB, cpu_memory_bytes=512 * GiB)
    return {phase.name: phase.peak_allocated_bytes for phase in predict(workload, strategy, hw).phases}


def test_the_catalog_ships_generation_windows() -> None:
    for name in ("opt-1.3b", "llama-3.2-1b", "qwen3-30b-a3b", "gemma-3-4b"):
        terms = get_model(name).activation_terms[KEY]
        assert valid_terms(terms) and set(GENERATION_WINDOWS) <= set(terms["windows"]), name


def _moments(model: ModelSpec) -> tuple[int, int, int]:
    """Bytes of the (prefill, last decoding step) of a generate call and of a scoring forward, KV cache in."""
    actor = trained_placement(model, True, TrainedModelStrategy(zero_stage=0), "bf16", 1, 1, COEF)
    prefill, step = generation_live(actor, False, 8, 256, 256, "bf16", "eager", COEF)
    scoring = forward_live(model, True, 0, 8, 512, "bf16", "eager", COEF)
    return prefill.total, step.total, scoring.total


@pytest.mark.parametrize(("window", "moment"), [
    ("prefill", 0), ("prefill_head", 0), ("decode_step", 1), ("decode_head", 1),
    ("scoring_forward", 2), ("scoring_head", 2),
])  # fmt: skip
def test_a_moment_holds_what_its_traced_window_holds(window: str, moment: int) -> None:
    model = get_model("opt-1.3b")
    plain, more = _moments(_with(model, window)), _moments(_with(model, window, EXTRA + GiB))
    assert [m - p for m, p in zip(more, plain, strict=True)] == [GiB if i == moment else 0 for i in range(3)]


@pytest.mark.parametrize(("window", "phase"), [("decode_head", "generation"), ("scoring_head", "scoring")])
def test_a_phase_moves_with_its_traced_window(window: str, phase: str) -> None:
    plain, more = _phases(None), _phases(window)
    assert more[phase] > plain[phase] + EXTRA // 2  # the window was far below EXTRA
    assert all(more[name] == plain[name] for name in plain if name != phase)


def test_without_generation_windows_the_formulas_run_and_the_report_says_so() -> None:
    traced, untraced = get_model("opt-1.3b"), _with(get_model("opt-1.3b"), "")
    assert source(traced, "bf16", "eager", GENERATION_WINDOWS) == "traced"
    assert source(untraced, "bf16", "eager") == "traced"  # training is still traced
    assert source(untraced, "bf16", "eager", GENERATION_WINDOWS) == "formula"
    assert _phases("") != _phases(None)


@pytest.mark.parametrize("window", ["policy_head_forward", "policy_head_backward"])
def test_the_actors_training_holds_its_traced_log_prob_loss(window: str) -> None:
    """The actor's loss is built on token log-probs (probes' token_logprobs), traced apart from HF's loss."""
    plain, more = _phases(None), _phases(window)
    assert more["actor_training"] > plain["actor_training"] + EXTRA // 2
    assert all(more[name] == plain[name] for name in plain if name != "actor_training")
    assert _phases("head_backward") == plain  # transformers' own loss is not what the actor runs
