"""The search for every workload kind: single-model kinds to the Optuna study of
:mod:`search.choose.single_search`, RLHF kinds to :mod:`search.choose.rlhf_search` (same arguments)."""

from __future__ import annotations

from search.choose.candidates import Candidate, SearchResult
from search.choose.rlhf_search import exhaustive_rlhf, search_rlhf
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
) -> SearchResult:
    """Rank the strategies a search evaluated, fastest fitting first (seeded: same inputs, same plan)."""
    run = search_rlhf if workload.is_rlhf else search_single
    return run(workload, hardware, coef, lora_ranks=lora_ranks, seed=seed, sampler=sampler)


def exhaustive(
    workload: Workload, hardware: Hardware, coef: Coefficients, *, lora_ranks: tuple[int, ...] = (0,)
) -> Candidate | None:
    """The fastest fitting strategy by trying every point of the whole space (for tests and checks)."""
    run = exhaustive_rlhf if workload.is_rlhf else exhaustive_single
    return run(workload, hardware, coef, lora_ranks=lora_ranks)
