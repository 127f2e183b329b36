"""The plan the screen picks, the plan the replay confirms, and the fastest the replay lets fit.

``search`` ranks strategies with the screen (peak reserved from the fragment coefficients), then resolves
the points it returns with the allocator replay of their steps (search.choose.confirm). For small catalog
models on small GPUs (SFT, every strategy of the space tried with the replay: 768 replays per job) this
prints, per job: the screen's plan, the confirmed plan, the exhaustive replay's plan, their step times
(the replayed score of each) and the replays the confirmation made. A confirmed time above the exhaustive
one is a plan the confirmation missed.

    .venv/bin/python benchmarks/screen_vs_replay.py [--models opt-125m gpt2] [--gpus 3G 6G 8G]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.planning.predicting import _job  # noqa: E402
from search import DEFAULT_COEFFICIENTS, predict, screen_search, search  # noqa: E402
from search.choose.candidates import Candidate  # noqa: E402
from search.choose.single_space import all_strategies  # noqa: E402
from store.records import Hardware, Workload  # noqa: E402


def _replayed(workload: Workload, hardware: Hardware, candidate: Candidate | None) -> str:
    if candidate is None:
        return "-"
    replayed = Candidate(candidate.strategy, predict(workload, candidate.strategy, hardware, DEFAULT_COEFFICIENTS))
    fits = "fits" if replayed.prediction.fits else "does not fit"
    return f"{candidate.strategy.describe()} ({replayed.prediction.step_time_s:.3f} s, {fits})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["opt-125m", "opt-350m", "gpt2"])
    parser.add_argument("--gpus", nargs="*", default=["2G", "3G", "4G", "6G", "8G"])
    args = parser.parse_args()
    print("| job | screen's plan, replayed | confirmed | fastest the replay lets fit | replays |")
    print("|---|---|---|---|---|")
    for model in args.models:
        for gpu in args.gpus:
            job = _job(model, {"gpu_mem": gpu, "workload": "sft", "cpu_mem": "64G"})
            w, h = job.workload, job.hardware
            screened = screen_search(w, h, DEFAULT_COEFFICIENTS)
            confirmed = search(w, h, DEFAULT_COEFFICIENTS)
            best: Candidate | None = None
            for strategy in all_strategies(w, h, (0,)):
                candidate = Candidate(strategy, predict(w, strategy, h, DEFAULT_COEFFICIENTS))
                if candidate.prediction.fits and (best is None or candidate.score < best.score):
                    best = candidate
            cells = [_replayed(w, h, c) for c in (screened.best, confirmed.best, best)]
            print(f"| {model} sft {gpu} | {' | '.join(cells)} | {confirmed.replays} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
