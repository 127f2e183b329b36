"""The search for every workload kind: single-model kinds to the Optuna study of
:mod:`search.choose.single_search`, RLHF kinds to :mod:`search.choose.rlhf_search` (same arguments)."""

from __future__ import annotations

from search.choose.candidates import Candidate, SearchResult
from search.choose.rlhf_search import ROLLOUT_FAMILIES, exhaustive_rlhf, search_rlhf
from search.choose.rlhf_walk import RLHF_ALTERNATIVES
from search.choose.single_search import exhaustive_single, search_single
from search.coefficients import Coefficients
from store.records import Hardware, Workload


def search(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    lora_ranks: tuple[int, ...] = (0,),
    seed: int = 0,
    sampler: str = "auto",
    rollouts: tuple[str, ...] = ROLLOUT_FAMILIES,
    closest: bool = True,
    alternatives: int = RLHF_ALTERNATIVES - 1,
) -> SearchResult:
    """Rank the strategies a search evaluated, fastest fitting first (seeded: same inputs, same plan).

    ``rollouts``: what may generate an RLHF rollout ("hybrid-engine" for DeepSpeed's own, "vllm", "sglang").
    ``closest`` False (RLHF): when the search's bounds prove that nothing fits, return at once with nothing
    ranked instead of ranking the closest strategies (for a caller that reads only ``best``). ``alternatives``
    (RLHF): how many fitting strategies after the best the bound walk must rank exactly."""
    if workload.is_rlhf:
        return search_rlhf(
            workload,
            hardware,
            coef,
            lora_ranks=lora_ranks,
            seed=seed,
            sampler=sampler,
            rollouts=rollouts,
            closest=closest,
            alternatives=alternatives,
        )
    return search_single(workload, hardware, coef, lora_ranks=lora_ranks, seed=seed, sampler=sampler)


def exhaustive(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    lora_ranks: tuple[int, ...] = (0,),
    rollouts: tuple[str, ...] = ROLLOUT_FAMILIES,
) -> Candidate | None:
    """The fastest fitting strategy by trying every point of the whole space (for tests and checks)."""
    if workload.is_rlhf:
        return exhaustive_rlhf(workload, hardware, coef, lora_ranks=lora_ranks, rollouts=rollouts)
    return exhaustive_single(workload, hardware, coef, lora_ranks=lora_ranks)
