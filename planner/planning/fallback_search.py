"""``recommend``'s search and its fallbacks: the job as asked first; LoRA (rank 16) when no full fine-tune fits
and the rank was left to memplan; QLoRA (NF4 base weights) when no 16-bit plan fits, LoRA included; and the
lines that say which fallback the plan took and what would fit otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from planner.job.inputs import ResolvedJob
from planner.planning.suggest import what_would_fit
from search import ROLLOUT_FAMILIES, Coefficients, SearchResult
from search import search as run_search
from store.errors import InputError
from store.quantization import QUANTIZATIONS
from store.records import MAX_COUNT

DEFAULT_LORA_RANK = 16


def rollout_families(rollout: str) -> tuple[str, ...]:
    """``--rollout``: ``auto`` (every family) or a comma-separated list of them; InputError otherwise."""
    if not isinstance(rollout, str):
        raise InputError(f"--rollout must be auto or a comma-separated list of {', '.join(ROLLOUT_FAMILIES)}")
    if rollout.strip() == "auto":
        return ROLLOUT_FAMILIES
    parts = [name.strip() for name in rollout.split(",")]
    if len(parts) > 1 and not all(parts):  # vllm,,sglang or vllm, : an empty item is a typo, not "nothing"
        shown = rollout if len(rollout) <= 40 else rollout[:37] + "..."
        raise InputError(f"--rollout has an empty item in {shown!r}: name each family once, comma-separated")
    names = tuple(dict.fromkeys(name for name in parts if name))
    unknown = [name for name in names if name not in ROLLOUT_FAMILIES]
    if unknown or not names:
        shown = ", ".join(unknown) or repr(rollout)
        raise InputError(f"--rollout takes auto or any of {', '.join(ROLLOUT_FAMILIES)} (comma-separated), not {shown}")
    return names


QUANTIZATION_CHOICES: tuple[str, ...] = ("auto", *QUANTIZATIONS)  # store.choices.Quantization, or auto


def lora_ranks(lora_rank: int | str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ranks to search first, ranks to fall back to when nothing fits)."""
    if lora_rank == "auto":
        return (0,), (DEFAULT_LORA_RANK,)
    try:
        rank = int(lora_rank)
    except (TypeError, ValueError):
        raise InputError(f"--lora-rank must be auto or a whole number >= 0, not {lora_rank!r}") from None
    if not 0 <= rank <= MAX_COUNT:  # checked before the search: an RLHF search would fail one trial per rank
        shown = str(lora_rank) if len(str(lora_rank)) <= 24 else str(lora_rank)[:21] + "..."
        raise InputError(f"--lora-rank must be auto or a whole number from 0 to {MAX_COUNT}, not {shown}")
    return (rank,), ()


@dataclass(frozen=True)
class Searched:
    """What the search found, and which fallback it took: ``result`` is the search the plan comes from,
    ``searched`` every search of the 16-bit weights by the LoRA ranks it tried, ``adapters`` the LoRA ranks a
    quantized search would train."""

    result: SearchResult
    searched: dict[tuple[int, ...], SearchResult]
    lora_fallback: bool
    qlora: bool
    adapters: tuple[int, ...]

    def suggestions(self, job: ResolvedJob, coefficients: Coefficients) -> list[str]:
        """Which fallback the plan took, and (when nothing fits or a fallback was taken) what would fit."""
        lines: list[str] = []
        if self.qlora:
            lines.append(
                "no 16-bit plan fits, LoRA included, so this plan trains QLoRA: NF4 4-bit base weights "
                f"(bitsandbytes) with LoRA rank {self.adapters[0]} adapters, a different recipe from 16-bit LoRA "
                "(pass --lora-rank 0 to see the closest full fine-tune)"
            )
        elif self.lora_fallback:
            lines.append(
                f"no full fine-tune fits, so this plan trains LoRA rank {DEFAULT_LORA_RANK} adapters "
                "(pass --lora-rank 0 to see the closest full fine-tune)"
            )
        if self.result.best is None or self.lora_fallback or self.qlora:
            include_lora = not (self.lora_fallback or self.qlora)
            lines.extend(what_would_fit(job, coefficients, include_lora=include_lora, searched=self.searched))
        return lines


def search_with_fallbacks(
    job: ResolvedJob,
    coefficients: Coefficients,
    *,
    seed: int,
    rollout: str,
    top: int,
    lora_rank: int | str,
    quantization: str,
) -> Searched:
    """Check the search's options (InputError for a bad one), then search the job, falling back to LoRA and then
    to QLoRA as :func:`planner.planning.predicting.recommend` documents."""
    workload, hardware = job.workload, job.hardware
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        shown = str(seed) if len(str(seed)) <= 24 else str(seed)[:21] + "..."
        raise InputError(f"--seed must be a whole number from 0 to {2**32 - 1} (the sampler's range), not {shown}")
    if quantization not in QUANTIZATION_CHOICES:
        raise InputError(f"--quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, not {quantization!r}")
    first, fallback = lora_ranks(lora_rank)
    bases: tuple[str, ...] = ("none",)
    if quantization in ("nf4", "int8"):
        if workload.is_rlhf:
            raise InputError("--quantization: QLoRA is planned for sft, reward and dpo, not for RLHF's trained models")
        if first == (0,) and not fallback:
            raise InputError("--quantization needs LoRA adapters: QLoRA trains adapters over 4-bit weights")
        first, fallback, bases = fallback or first, (), (quantization,)
    rollouts = rollout_families(rollout)
    # with a LoRA fallback, the closest full fine-tune is ranked only if LoRA does not fit either
    # the RLHF bound walk ranks the best and ``top`` alternatives exactly
    searching = partial(run_search, workload, hardware, coefficients, seed=seed, rollouts=rollouts, alternatives=top)
    if bases != ("none",):
        searching = partial(searching, quantizations=bases)
    result = searching(lora_ranks=first, closest=not fallback)
    searched = {first: result}
    used_fallback = False
    if result.best is None and fallback:
        retry = searched[fallback] = searching(lora_ranks=fallback, closest=False)
        if retry.best is not None:
            result, used_fallback = retry, True
        elif not result.ranked:  # its bounds proved that nothing fits: rank the closest now
            result = searched[first] = searching(lora_ranks=first)
    # QLoRA (4-bit base weights, a different recipe) only where no 16-bit plan fits, LoRA included
    adapters = fallback or tuple(r for r in first if r > 0)
    used_qlora = False
    if result.best is None and adapters and not workload.is_rlhf and quantization == "auto":
        quantized = searching(lora_ranks=adapters, closest=False, quantizations=("nf4",))
        if quantized.best is not None:
            result, used_qlora = quantized, True
    return Searched(result, searched, used_fallback, used_qlora, adapters)
