"""Predicted against measured over every stored probe and GPU record, before calibration, after it, and held
out (leave-one-out), beside what DeepSpeed's own estimators say for the same rows.

Usage:
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/accuracy.py [--db DB] [--records FILE ...] \
        [--cpu-probes] [-o benchmarks/results/accuracy.md]

Sources: the probes stored in ``--db`` (every device found there) and the records files (default: every
``tests/data/gpu/*.json``). ``--cpu-probes`` first probes a small Llama on DeepSpeed's CPU accelerator over a
grid of strategies into ``--db`` (a temporary database when none is given), so the CPU device has data.
Per device and quantity the table gives the median |error| and the worst error (predicted / measured - 1).
DeepSpeed's estimators (``estimate_zero2_model_states_mem_needs``, ``estimate_zero3_...``) cover model
states of ZeRO-2/3 only: they are compared with measured peak allocated on those rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibration.gather import (  # noqa: E402
    gather,
    loop_row_observation,
    records_file_entries,
    stored_entries,
    target_of,
)
from search.calibration import Observation, calibrate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CPU_MODEL = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}  # fmt: skip
CPU_STRATEGIES = [
    {"zero_stage": stage, "gradient_checkpointing": ckpt, "micro_batch": mb, "grad_accum": 8 // mb}
    for stage in (0, 2, 3)
    for ckpt in (False, True)
    for mb in (2, 8)
] + [{"zero_stage": 2, "offload_optimizer": "cpu", "micro_batch": 8, "grad_accum": 1}]


def probe_cpu(db: str) -> None:
    """Probe the small Llama's strategies on the CPU backend into ``db`` (stored probes are reused)."""
    from planner import probe

    folder = Path(db).parent / "llama-small"  # beside the database: a second run reuses the stored probes
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CPU_MODEL))
    strategies = folder / "strategies.json"
    strategies.write_text(json.dumps(CPU_STRATEGIES))
    probe(
        str(folder),
        device="cpu",
        strategies=str(strategies),
        steps=4,
        layers="4",
        timeout_s=3600,
        db=db,
        workload="sft",
        gpu_mem="24G",
        cpu_mem="64G",
        batch=8,
        seq_len=256,
        on_progress=lambda label, i, n: print(f"  probe {i + 1}/{n}: {label}", file=sys.stderr),
    )


def deepspeed_estimate(obs: Observation) -> float | None:
    """DeepSpeed's estimate of GPU model-state bytes for the row (ZeRO-2/3 sft rows only), or None."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from search.model.shapes import largest_module_params

    strategy = obs.strategy.to_dict()
    stage, model = strategy.get("zero_stage"), obs.workload.model
    if obs.workload.is_rlhf or stage not in (2, 3) or strategy.get("lora_rank"):
        return None
    offload = strategy.get("offload_optimizer", "none") != "none"
    gpus = obs.hardware.world_size
    if stage == 2:
        return float(estimate_zero2_model_states_mem_needs(model.total_params, gpus, 1, cpu_offload=offload)[1])
    return float(
        estimate_zero3_model_states_mem_needs(
            model.total_params,
            largest_module_params(model),
            gpus,
            1,
            cpu_offload=offload,
            cpu_offload_params=strategy.get("offload_param", "none") != "none",
        )[1]
    )


def _cell(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "-"
    return f"{100 * stats['median_abs']:.1f}% ({100 * stats['worst']:+.0f}%)"


def observations_by_target(db: str, records: list[str]) -> dict[str, list[Observation]]:
    """Every stored probe and record, as observations, grouped by the device they ran on."""
    entries: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    rows: list[dict[str, Any]] = []
    for path in records:
        probes, loop_rows = records_file_entries(path)
        entries += probes
        rows += loop_rows
    entries += stored_entries(db)
    targets = {target_of(r.get("fingerprint"))[0] for _, _, r in entries if r.get("outcome") == "ok"}
    out: dict[str, list[Observation]] = {}
    for target in sorted(targets):
        gathered = gather(entries, target)
        loops = [loop_row_observation(row, target) for row in rows if target_of(row.get("device"))[0] == target]
        out[target] = list(gathered.observations) + loops
        if loops:  # the training-loop rows are another program around the step: also the probes alone
            out[f"{target} (memplan probes only)"] = list(gathered.observations)
    return out


def table(target: str, observations: list[Observation]) -> list[str]:
    """The markdown lines of one device: per quantity before / after / held out, and DeepSpeed's estimators."""
    fit = calibrate(observations)
    errors = fit.to_dict()["errors"]
    lines = [
        f"### {target}: {fit.observations} probes and records, {len(fit.values)} coefficients determined",
        "",
        "| quantity | n | before (defaults) | after (fit) | held out (leave-one-out) | DeepSpeed estimator |",
        "|---|---|---|---|---|---|",
    ]
    estimator: list[float] = []
    for obs in observations:
        estimate = deepspeed_estimate(obs)
        peaks = [v for s, q, v in obs.measured if q == "peak_allocated"]
        if estimate is not None and peaks:
            estimator.append(estimate / max(peaks) - 1)
    for quantity in ("time", "peak_allocated", "peak_reserved"):
        if quantity not in errors["before"]:
            continue
        ds = "-"
        if quantity == "peak_allocated" and estimator:
            worst = max(estimator, key=abs)
            ds = f"{100 * statistics.median(map(abs, estimator)):.1f}% ({100 * worst:+.0f}%), {len(estimator)} rows"
        row = [quantity, str(errors["before"][quantity]["count"])]
        row += [_cell(errors[k].get(quantity)) for k in ("before", "after", "held_out")] + [ds]
        lines.append("| " + " | ".join(row) + " |")
    moved = ", ".join(f"{n} {fit.defaults[n]:.3g} -> {v:.3g}" for n, v in fit.values.items())
    lines += ["", f"Fitted: {moved or 'nothing'}.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="plan database with stored probes (default: a temporary one)")
    parser.add_argument("--records", nargs="*", help="records files (default: tests/data/gpu/*.json)")
    parser.add_argument("--cpu-probes", action="store_true", help="probe the CPU backend first")
    parser.add_argument("-o", "--output", help="write the markdown here too")
    args = parser.parse_args()
    db = args.db or str(Path(tempfile.mkdtemp()) / "accuracy.db")
    records = (
        args.records if args.records is not None else sorted(str(p) for p in (REPO / "tests/data/gpu").glob("*.json"))
    )
    if args.cpu_probes:
        probe_cpu(db)
    flags = "--cpu-probes " if args.cpu_probes else ""
    lines = [
        "# Prediction accuracy: before and after calibration, held out",
        "",
        "Relative error predicted / measured - 1: median |error| (worst). `time` is per phase (per step for a",
        "training loop's row); held out: each probe predicted by a fit to all the others.",
        "",
        f"Command: `DS_ACCELERATOR=cpu .venv/bin/python benchmarks/accuracy.py {flags}"
        "-o benchmarks/results/accuracy.md`",
        "",
    ]
    for target, observations in observations_by_target(db, records).items():
        lines += table(target, observations)
    text = "\n".join(lines)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
