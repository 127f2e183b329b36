"""Regret of ``recommend``: each plan against the fastest fitting strategy the cost model knows (issue 42).

For every job of :data:`JOBS` (SFT, DPO, reward, GRPO, PPO; 0.5B to 72B, dense and MoE from the catalog; 1 to 16
GPUs of 24 to 141 GB; every ``--framework``) it runs ``planner.recommend`` in-process, then the oracle: every
strategy of the enumerated space (single model: every ZeRO stage, offload, checkpointing, micro-batch, loss,
``empty_cache`` policy and allocator, at the plan's LoRA rank and base weights; RLHF: every outer point of the
search's generations, every engine knob variant, every batch split and cache choice), each predicted with the
same coefficients through the allocator replay (``search.predict``). A step's seconds never fall below those of
its variant without ``empty_cache`` calls (the screen's seconds of it, which the replay keeps), so the oracle
replays exactly the variants of the steps that could beat the plan and screens the rest; it checks that rule on
every replay it makes ("time rule broken" counts the exceptions). Regret = plan seconds / oracle seconds - 1.

    .venv/bin/python benchmarks/search_regret.py [--jobs NAME ...] [--recommend-only] [--write]

``--write`` puts the table in ``benchmarks/results/search_regret.md``; ``--recommend-only`` times ``recommend``
alone (to compare its latency across two checkouts: run the file with ``PYTHONPATH`` at the other one).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.regret_jobs import ISSUE_CASES, JOBS, Job  # noqa: E402
from planner import recommend  # noqa: E402
from planner.job.calibrated import calibrated  # noqa: E402
from planner.planning.predicting import _job, rollout_families  # noqa: E402
from search import DEFAULT_COEFFICIENTS, Coefficients, predict  # noqa: E402
from search.choose.confirm import near_fit  # noqa: E402
from search.choose.rlhf_space import batch_choices, cache_choices, rlhf_outer_points, rlhf_strategy_at  # noqa: E402
from search.choose.rlhf_walk import point_bounds  # noqa: E402
from search.choose.rollout_space import knob_variants, searched_generations  # noqa: E402
from search.choose.single_space import all_strategies  # noqa: E402
from search.rlhf.predict import screen_rlhf  # noqa: E402
from search.single.predict import screen_single_model  # noqa: E402
from store.errors import InputError  # noqa: E402
from store.records import Hardware, RLHFStrategy, Strategy, Workload  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "search_regret.md"
GOAL = 0.02  # no plan more than 2% slower than the best the model knows


@dataclass(frozen=True)
class Row:
    """One job's result."""

    job: str
    plan: str
    plan_s: float
    best: str
    best_s: float
    recommend_s: float
    oracle_s: float
    replays: int
    broken: int  # replays whose seconds fell below their step's floor (the oracle's time rule)
    recommend_cpu_s: float = 0.0  # CPU seconds of recommend (the machine is shared: wall seconds vary with load)
    floor_pruned: bool = False  # the oracle skipped variants whose replay floor overflows (--floor)

    @property
    def regret(self) -> float:
        if math.isinf(self.plan_s) and math.isinf(self.best_s):
            return 0.0
        return self.plan_s / self.best_s - 1.0


def resolved(job: Job, db: str) -> tuple[Workload, Hardware, Coefficients]:
    """The workload, hardware and coefficients ``recommend`` plans ``job`` with (no calibration)."""
    found, coef, _ = calibrated(_job(job.model, job.keywords, db), DEFAULT_COEFFICIENTS, choice="none", db=db)
    return found.workload, found.hardware, coef


def _candidates(
    workload: Workload, hardware: Hardware, coef: Coefficients, plan: Strategy | RLHFStrategy
) -> list[tuple[float, Strategy | RLHFStrategy, list[Strategy | RLHFStrategy]]]:
    """(a lower bound of the step's seconds, the step's variant without empty_cache calls, every variant of that
    step) over the whole space. RLHF: the bound is its outer point's (``search.choose.rlhf_walk.point_bounds``:
    the least seconds of its models' pieces, or the infeasible penalty where its memory floor, a lower bound of
    the replay's peak reserved, overflows the largest usable memory any strategy has); single model: 0."""
    steps: list[tuple[float, Strategy | RLHFStrategy, list[Strategy | RLHFStrategy]]] = []
    if isinstance(plan, Strategy):
        grouped: dict[Strategy, list[Strategy | RLHFStrategy]] = {}
        for s in all_strategies(workload, hardware, (plan.lora_rank,), (plan.quantization,)):
            grouped.setdefault(replace(s, empty_cache="never", allocator="default"), []).append(s)
        return [(0.0, base, variants) for base, variants in grouped.items()]
    generations = searched_generations(workload, hardware, rollout_families("auto"))
    points = list(rlhf_outer_points(workload, hardware, (plan.actor.lora_rank,), generations))
    for bound, point in zip(point_bounds(workload, hardware, coef, points), points, strict=True):
        engines = knob_variants(point.rollout) if point.rollout is not None else (None,)
        for engine in engines:
            here = replace(point, rollout=engine)
            for batches in batch_choices(workload, hardware):
                variants: list[Strategy | RLHFStrategy] = [
                    rlhf_strategy_at(here, batches, cache) for cache in cache_choices(engine)
                ]
                steps.append((bound, rlhf_strategy_at(here, batches), variants))
    return steps


def oracle(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    plan: Strategy | RLHFStrategy,
    limit_s: float,
    floor: bool = False,
) -> tuple[Strategy | RLHFStrategy | None, float, int, int]:
    """(the fastest fitting strategy, its seconds, replays, time-rule exceptions) of the whole space, every step
    that could be faster than ``limit_s`` replayed in all its variants; with ``floor``, not those whose screened
    peak allocated (less 2%: ``search.choose.confirm.near_fit``, a lower bound of the replay's peak reserved held by
    tests/search/test_screen_bound.py) already overflows the GPU's usable memory."""
    screen = screen_single_model if isinstance(plan, Strategy) else screen_rlhf
    best: Strategy | RLHFStrategy | None = None
    best_s, replays, broken = math.inf, 0, 0
    for bound, base, variants in _candidates(workload, hardware, coef, plan):
        if bound >= min(limit_s, best_s):
            continue  # its outer point cannot be faster, or cannot fit (PPO's product of layouts: most points)
        try:
            seconds = screen(workload, base, hardware, coef).step_time_s  # type: ignore[arg-type]
        except InputError:
            continue
        if seconds >= min(limit_s, best_s):
            continue
        for strategy in variants:
            if floor and not near_fit(screen(workload, strategy, hardware, coef)):  # type: ignore[arg-type]
                continue
            try:
                p = predict(workload, strategy, hardware, coef)
            except InputError:
                continue
            replays += 1
            broken += p.step_time_s < seconds * (1 - 1e-9)
            if p.fits and p.step_time_s < best_s:
                best, best_s = strategy, p.step_time_s
    return best, best_s, replays, broken


def run_job(job: Job, db: str, *, with_oracle: bool = True, floor: bool = False) -> Row:
    """``recommend`` for ``job`` (timed) and, with ``with_oracle``, the oracle's best."""
    start, cpu = time.perf_counter(), time.process_time()
    plan = recommend(job.model, db=db, save=False, calibration="none", **job.keywords)
    recommend_s, recommend_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    document = plan.model_dump()
    fits = bool(document["fits"])
    plan_s = float(document["predicted"]["step_time_s"]) if fits else math.inf
    workload, hardware, coef = resolved(job, db)
    chosen: Strategy | RLHFStrategy = (
        RLHFStrategy.from_dict(document["strategy"]) if workload.is_rlhf else Strategy.from_dict(document["strategy"])
    )
    described = chosen.describe() if fits else "nothing fits"
    if not with_oracle:
        return Row(job.name, described, plan_s, "-", math.nan, recommend_s, 0.0, 0, 0, recommend_cpu_s)
    start = time.perf_counter()
    # the document rounds seconds to 1e-6: the plan's own step must stay below the limit
    best, best_s, replays, broken = oracle(workload, hardware, coef, chosen, plan_s * (1 + 1e-6), floor)
    oracle_s = time.perf_counter() - start
    if best is None and fits:  # nothing faster fits: the plan is the oracle's best
        best, best_s = chosen, plan_s
    shown = "-" if best is None else best.describe()
    return Row(
        job.name, described, plan_s, shown, best_s, recommend_s, oracle_s, replays, broken, recommend_cpu_s, floor
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| job | plan | plan s | best the model knows | best s | regret | recommend s (CPU s) | oracle s | replays |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        regret = "-" if math.isnan(r.best_s) else f"{100 * r.regret:+.2f}%"
        broken = (f" ({r.broken} time rule broken)" if r.broken else "") + (" (floor)" if r.floor_pruned else "")
        lines.append(
            f"| {r.job} | {r.plan} | {r.plan_s:.3f} | {r.best} | {r.best_s:.3f} | {regret} | {r.recommend_s:.1f} "
            f"({r.recommend_cpu_s:.1f}) "
            f"| {r.oracle_s:.1f} | {r.replays}{broken} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="*", help="job names (default: all; issue 42's case-... jobs by name only)")
    parser.add_argument("--recommend-only", action="store_true", help="time recommend alone, no oracle")
    parser.add_argument("--write", action="store_true", help=f"write the table to {RESULTS}")
    parser.add_argument("--floor", action="store_true", help="oracle: skip variants whose replay floor overflows")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON lines to this file")
    parser.add_argument("--merge", nargs="*", type=Path, help="rows of earlier runs (--out files) instead of running")
    args = parser.parse_args()
    jobs = [j for j in JOBS if not args.jobs or j.name in args.jobs]
    jobs += [j for j in ISSUE_CASES if args.jobs and j.name in args.jobs]  # issue 42's cases: by name only
    rows: list[Row] = []
    if args.merge:
        found = {r["job"]: Row(**r) for path in args.merge for r in map(json.loads, path.read_text().splitlines())}
        rows, jobs = [found[j.name] for j in (*JOBS, *ISSUE_CASES) if j.name in found], []
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "regret.sqlite3")
        for job in jobs:
            row = run_job(job, db, with_oracle=not args.recommend_only, floor=args.floor)
            rows.append(row)
            if args.out:
                with args.out.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(asdict(row)) + "\n")
            regret = "-" if math.isnan(row.best_s) else f"{100 * row.regret:+.2f}%"
            print(
                f"{row.job:30s} plan {row.plan_s:9.3f} s  best {row.best_s:9.3f} s  regret {regret:>8s}  "
                f"recommend {row.recommend_s:6.1f} s ({row.recommend_cpu_s:.1f} CPU s)  "
                f"oracle {row.oracle_s:7.1f} s  replays {row.replays}",
                flush=True,
            )
    text = table(rows)
    print(text)
    worst = max((r.regret for r in rows if not math.isnan(r.best_s)), default=0.0)
    print(f"worst regret {100 * worst:+.2f}% (goal <= {100 * GOAL:.0f}%) over {len(rows)} jobs")
    if args.write:
        command = "DS_ACCELERATOR=cpu .venv/bin/python benchmarks/search_regret.py --write"
        RESULTS.write_text(
            f"# Search regret (issue 42)\n\n`{command}`\n\n{__doc__.split(chr(10) + chr(10))[1]}\n\n{text}\n\n"
            f"Worst regret {100 * worst:+.2f}% (goal <= {100 * GOAL:.0f}%) over {len(rows)} jobs.\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
