"""Whether a change moved any plan: ``recommend`` of a fixed set of jobs, written field by field, and compared.

A speed change to the search (issue 42) must leave every chosen plan, alternative and suggestion as it was. This
runs ``planner.recommend`` on twelve jobs of the regret matrix (``benchmarks/regret_jobs.py``: SFT, DPO, GRPO and
PPO, one to eight GPUs, each framework) and the README's demo, in one process, and writes each plan's JSON document
with the call's CPU seconds. ``--compare BEFORE AFTER`` prints, job by job, the fields that differ, leaving out what a
speed change may move: ``plan_id``, the ``search`` counters (replays, trials) and the CPU seconds.

Usage: DS_ACCELERATOR=cpu .venv/bin/python benchmarks/plans_unchanged.py OUT.json
       .venv/bin/python benchmarks/plans_unchanged.py --compare BEFORE.json AFTER.json
Take BEFORE and AFTER on one tree (a ``git worktree`` of each commit, ``PYTHONPATH`` at it). Exit 0 when no job
differs, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.regret_jobs import ISSUE_CASES, JOBS  # noqa: E402

JOB_NAMES = (
    "sft-q0.5b-4090x1-ds",
    "sft-q14b-a100-40x8-hf",
    "dpo-q7b-a100x8-trl",
    "dpo-q1.5b-a10x2-ds",
    "grpo-q1.5b-a100x4-orlhf",
    "grpo-q3-1.7b-l40sx2-ds",
    "ppo-opt350m-4090x1-dschat",
    "ppo-q7b-h100x8-orlhf",
    "case-sft-q30ba3b",
    "case-grpo-q7b-orlhf",
    "case-grpo-q7b-trl",
)
DEMO = ("opt-1.3b", {"gpu_mem": "24G"})  # the README's first command: PPO of four opt-1.3b on one 24 GB GPU
SPEED_FIELDS = ("_cpu_s", "plan_id")  # what a speed change may move, besides the search's counters


def jobs() -> dict[str, tuple[str, dict[str, Any]]]:
    """The jobs by name: model and ``recommend`` keywords."""
    chosen = {job.name: (job.model, dict(job.keywords)) for job in (*JOBS, *ISSUE_CASES) if job.name in JOB_NAMES}
    return {**chosen, "demo": (DEMO[0], dict(DEMO[1]))}


def plan_documents() -> dict[str, dict[str, Any]]:
    """Each job's plan document (``recommend``'s JSON) with the call's CPU seconds as ``_cpu_s``."""
    from planner import recommend

    documents: dict[str, dict[str, Any]] = {}
    db = str(Path(tempfile.mkdtemp()) / "plans.sqlite3")
    for name, (model, keywords) in jobs().items():
        start = time.process_time()
        plan = recommend(model, db=db, save=False, calibration="none", **keywords)
        document: dict[str, Any] = json.loads(plan.model_dump_json())
        document["_cpu_s"] = round(time.process_time() - start, 2)
        documents[name] = document
        print(f"{name}: {document['_cpu_s']} CPU s", flush=True)
    return documents


def fields(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a JSON value as (dotted path, value)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from fields(item, f"{prefix}.{key}" if prefix else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from fields(item, f"{prefix}[{index}]")
    else:
        yield prefix, value


def speed_only(path: str) -> bool:
    """Whether a field is one a speed change may move."""
    return path in SPEED_FIELDS or path.startswith("search.")


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The fields of one job's document that differ, speed fields left out."""
    left, right = dict(fields(before)), dict(fields(after))
    paths = sorted(set(left) | set(right))
    return [path for path in paths if left.get(path) != right.get(path) and not speed_only(path)]


def compare(before_path: Path, after_path: Path) -> int:
    """Print each job's differing fields (at most 12 a job); 1 when any job differs."""
    before, after = json.loads(before_path.read_text()), json.loads(after_path.read_text())
    moved = 0
    for name in sorted(set(before) | set(after)):
        differ = differences(before.get(name, {}), after.get(name, {}))
        cpu = f"{before.get(name, {}).get('_cpu_s')} -> {after.get(name, {}).get('_cpu_s')} CPU s"
        print(f"{name}: {'same' if not differ else f'{len(differ)} fields differ'} ({cpu})")
        left, right = dict(fields(before.get(name, {}))), dict(fields(after.get(name, {})))
        for path in differ[:12]:
            print(f"    {path}: {left.get(path)!r} -> {right.get(path)!r}")
        moved += bool(differ)
    return 1 if moved else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", nargs="?", type=Path, help="write the plan documents here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="compare two outputs")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("give OUT.json or --compare BEFORE AFTER")
    args.out.write_text(json.dumps(plan_documents(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
