"""Where each profiled probe's time went, phase by phase: ``python benchmarks/probe_profiles.py RECORDS.json``.

Reads a records file of ``tests/data/gpu/`` (or ``planner probes --json`` output) whose probes ran with
``MEMPLAN_PROFILE=1`` (``probes/step/profile.py``) and prints, per probe and phase: the measured time (CUDA
events, without profiler), memplan's prediction for the GPU it ran on, the profiled step's host wall time, the
time the device was active, kernels launched, and the device time by kernel kind. A phase whose device time is
far under its wall time waits on the host (Python, dispatch, launches, host copies), not on the GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from planner.calibration.records import compare_records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path)
    args = parser.parse_args()
    data = json.loads(args.records.read_text(encoding="utf-8"))
    probes: list[dict[str, Any]] = data["probes"] if isinstance(data, dict) else data
    predicted = {}
    if isinstance(data, dict):
        for comparison in compare_records(args.records):
            for scope, quantities in comparison.quantities.items():
                if "time" in quantities:
                    predicted[(comparison.record_id, scope)] = quantities["time"].predicted
    print(
        "| probe | phase | measured s | predicted s | profiled wall s | device active s | kernels | device s by kind |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for probe in probes:
        result = probe["result"]
        profile = result.get("extra", {}).get("profile")
        if not profile:
            continue
        request = probe["request"]
        name = f"{probe['probe_id']} {request['workload']['model']} {request['workload']['kind']}"
        measured = {phase["name"]: phase["time_s"] for phase in result["phases"]}
        for phase, summary in profile.items():
            kinds = ", ".join(f"{kind} {seconds:.3f}" for kind, seconds in summary.get("device_s_by_kind", {}).items())
            guess = predicted.get((probe["probe_id"], phase))
            print(
                f"| {name} | {phase} | {measured.get(phase, float('nan')):.4f} | "
                f"{'' if guess is None else f'{guess:.4f}'} | {summary['wall_s']:.4f} | "
                f"{summary.get('device_active_s', 0.0):.4f} | {summary.get('kernels', '')} | {kinds} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
