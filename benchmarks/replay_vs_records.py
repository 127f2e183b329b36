"""Peak reserved on the GPU records: the fragment coefficients against the allocator replay of the built stream.

For every record of tests/data/gpu/ (as `benchmarks/shared_gpu_records.py` compares them), predicts peak
reserved twice: as the planner does today (`search.step.fragments.apply_policy`, six named fragment
coefficients), and from the replay of the step's allocation stream, built from the cost model's bytes
(`search.streams.build`), through the port of torch's caching allocator (`search.allocator`, via
`search.step.replayed.replay_step`). Prints both relative errors (predicted / measured - 1) per record and
phase, and the replay's wall time per step.

    .venv/bin/python benchmarks/replay_vs_records.py [--records tests/data/gpu/h100-2026-11-23.json ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import search.step.assemble as assemble  # noqa: E402
from planner.records_check import compare_records  # noqa: E402
from search.step.replayed import replay_step  # noqa: E402

DEFAULT_RECORDS = sorted((Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu").glob("*.json"))
CLOSED_FORM = assemble.apply_policy
REPLAY_SECONDS: list[float] = []


def _replayed_policy(
    phases: Any, structure: Any, resident: int, empty_cache: str, allocator: str, coef: Any, init_cached: int = 0
) -> Any:
    """apply_policy's answer with each phase's reserved bytes taken from the replay of the step's stream."""
    reserved, chosen, _, own = CLOSED_FORM(phases, structure, resident, empty_cache, allocator, coef, init_cached)
    step = _STEP[0]
    start = time.perf_counter()
    replayed = replay_step(step, empty_cache, allocator, coef)
    REPLAY_SECONDS.append(time.perf_counter() - start)
    reserved = [max(r.reserved, resident + ph.live) for r, ph in zip(replayed.phases, phases, strict=True)]
    return reserved, chosen, replayed.cache_seconds, reserved


_STEP: list[Any] = [None]
_FINISH = assemble.finish_step


def _finish_with_step(step: Any, *args: Any, **kwargs: Any) -> Any:
    _STEP[0] = step
    return _FINISH(step, *args, **kwargs)


def _errors(paths: list[Path]) -> dict[tuple[str, str], float]:
    return {
        (c.record_id, scope): q["peak_reserved"].error
        for path in paths
        for c in compare_records(path)
        for scope, q in c.quantities.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, nargs="*", default=DEFAULT_RECORDS)
    args = parser.parse_args()
    if not args.records or any(not p.is_file() for p in args.records):
        print("no records at tests/data/gpu/", file=sys.stderr)
        return 2
    closed = _errors(args.records)
    import search.rlhf.step as rlhf_step
    import search.single.predict as single_predict

    assemble.apply_policy = _replayed_policy  # type: ignore[assignment]
    single_predict.finish_step = _finish_with_step  # type: ignore[assignment]
    rlhf_step.finish_step = _finish_with_step  # type: ignore[assignment]
    replayed = _errors(args.records)
    print("| record | scope | reserved, fragment coefficients | reserved, allocator replay |")
    print("|---|---|---|---|")
    for key, error in closed.items():
        print(f"| {key[0]} | {key[1]} | {error:+.1%} | {replayed[key]:+.1%} |")
    worst = max(REPLAY_SECONDS)
    median = sorted(REPLAY_SECONDS)[len(REPLAY_SECONDS) // 2]
    print(f"\nreplays: {len(REPLAY_SECONDS)}, median {median * 1e3:.0f} ms, worst {worst * 1e3:.0f} ms per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
