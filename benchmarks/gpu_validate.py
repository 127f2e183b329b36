"""Validate the cost model on a GPU: a matrix of probes, predicted against measured, written as it goes.

Matrix: OPT-125m, OPT-350m, OPT-1.3b; sft and ppo; ZeRO 0-3; optimizer offload; gradient checkpointing;
empty_cache never / after-inference (19 probes per model). Each probe runs in its own process through
`planner.probe` (real DeepSpeed engines from the exported configs). Writes `gpu_validate.csv` and
`gpu_validate.md` (with the device fingerprint) to --out (default benchmarks/results/).

Order, most informative first: each next probe is the one that covers the most pairs of knob values not yet
covered by the probes before it (knobs: model, workload, ZeRO stage, gradient checkpointing, optimizer
offload, empty_cache; so model x workload, stage x checkpointing, workload x empty_cache, ...); ties keep the
matrix order (models and workloads as given, ZeRO-2, 3, 1, 0, checkpointing off before on). A run cut short
has measured a spread of the matrix, every model and workload early, not one corner of it.

Written as it goes: after every probe both files are rewritten whole (a temporary file, then a rename), with
the probes not run (yet) listed at the end of the .md; a run stopped at any point leaves every finished row.

Resumable: probes are stored in --db (default OUT/gpu_validate.db). `planner.probe` reuses a stored probe
with the same request (workload, strategy, hardware, steps, layers, software versions), so rerunning the same
command reads the finished probes back and runs only the rest. A stored error or timeout is reused too;
--retry-failed runs those again.

--max-minutes M: no new matrix probe starts after M minutes (the running one finishes, with all its depths
when --layers cuts the model); stored probes are still read back, so the files hold everything measured so
far and list the rest as not run.

--steps counts all steps of a probe: the first is a warm-up, the first two under ZeRO-3 (DeepSpeed records
its parameter-fetch trace in the first step and prefetches by it from the second); the rest are measured
(median per phase; the .md gives the min/median/max step time of the measured steps). Default 5.

DeepSpeed's ops (FusedAdam, CPU Adam, the hybrid engine's inference op) are built once, before the first
probe that loads them, in a process of their own (`probes.ops.prepare.prepare_ops`), so their JIT build counts
against no probe; `TORCH_CUDA_ARCH_LIST=9.0a` is read as 9.0. A build that fails stops the run with one line
(exit 2), leaving the files written so far.

Usage (on a machine with a CUDA GPU):
    DS_ACCELERATOR=cuda .venv/bin/python benchmarks/gpu_validate.py --out "$OUT" [--models opt-1.3b] \\
        [--max-minutes 9] [--db "$OUT/gpu_validate.db"]

Dry run of the script itself on DeepSpeed's CPU accelerator (tiny cut models; CPU figures, not GPU ones):
    .venv/bin/python benchmarks/gpu_validate.py --device cpu --layers 2 --models opt-125m --out /tmp/validate
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

MODELS = ("opt-125m", "opt-350m", "opt-1.3b")
FIELDS = (
    "model", "workload", "strategy", "outcome", "failed_phase",
    "meas_alloc_gib", "pred_alloc_gib", "err_alloc", "meas_reserved_gib", "pred_reserved_gib", "err_reserved",
    "meas_step_s", "pred_step_s", "err_step", "step_spread_s", "reused", "probe_id",
)  # fmt: skip
KNOBS = ("model", "workload", "zero_stage", "checkpointing", "offload", "empty_cache")
STAGE_ORDER = (2, 3, 1, 0)
FAILED = ("error", "timeout")

Runner = Callable[[Any], Any]  # ProbeRequest -> ProbeResult
Prepare = Callable[..., Any]  # probes.ops.prepare.prepare_ops


@dataclass(frozen=True)
class Cell:
    """One probe of the matrix: a model, a workload and one strategy (the JSON shape planner.probe reads)."""

    model: str
    workload: str
    strategy: dict[str, Any]

    def features(self) -> dict[str, str]:
        block = self.strategy.get("actor", self.strategy)
        return {
            "model": self.model,
            "workload": self.workload,
            "zero_stage": str(block.get("zero_stage", 0)),
            "checkpointing": str(bool(block.get("gradient_checkpointing", False))),
            "offload": str(block.get("offload_optimizer", "none")),
            "empty_cache": str(self.strategy.get("empty_cache", "never")),
        }

    def label(self) -> str:
        f = self.features()
        ckpt = " ckpt" if f["checkpointing"] == "True" else ""
        offload = " offload-opt" if f["offload"] != "none" else ""
        cache = f" empty_cache={f['empty_cache']}" if f["empty_cache"] != "never" else ""
        return f"{self.model} {self.workload} ZeRO-{f['zero_stage']}{ckpt}{offload}{cache}"


def sft_strategies() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for stage in STAGE_ORDER:
        for ckpt in (False, True):
            out.append({"zero_stage": stage, "gradient_checkpointing": ckpt, "micro_batch": 4, "grad_accum": 1})
    for stage in (2, 3):
        out.append({"zero_stage": stage, "offload_optimizer": "cpu", "micro_batch": 4, "grad_accum": 1})
    return out


def ppo_strategies() -> list[dict[str, Any]]:
    out = []
    for stage in STAGE_ORDER:
        for empty_cache in ("never", "after-inference"):
            block = {"zero_stage": stage, "gradient_checkpointing": True}
            frozen = {"zero_stage": 3 if stage == 3 else 0, "offload": "none"}
            out.append({
                "actor": block, "critic": block, "reference": frozen, "reward": frozen, "hybrid_engine": True,
                "generation_batch": 4, "micro_batch": 4, "grad_accum": 1, "empty_cache": empty_cache,
            })  # fmt: skip
    offloaded = {"zero_stage": 2, "offload_optimizer": "cpu", "gradient_checkpointing": True}
    out.append({
        "actor": offloaded, "critic": offloaded, "reference": {"zero_stage": 0, "offload": "none"},
        "reward": {"zero_stage": 0, "offload": "none"}, "hybrid_engine": True, "generation_batch": 4,
        "micro_batch": 4, "grad_accum": 1, "empty_cache": "never",
    })  # fmt: skip
    return out


def matrix(models: Iterable[str], workloads: Iterable[str]) -> list[Cell]:
    """Every (model, workload, strategy) in matrix order."""
    from store.workload_kinds import traits

    workloads = list(workloads)
    cells = []
    for model in models:
        for workload in workloads:
            strategies = ppo_strategies() if traits(workload).rlhf else sft_strategies()
            cells += [Cell(model, workload, strategy) for strategy in strategies]
    return cells


def _pairs(cell: Cell) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    f = cell.features()
    return {((a, f[a]), (b, f[b])) for a, b in combinations(KNOBS, 2)}


def order_cells(cells: list[Cell]) -> list[Cell]:
    """Most informative first (see the module docstring): greedy cover of knob-value pairs, ties in order."""
    left, ordered = list(cells), []
    covered: set[tuple[tuple[str, str], tuple[str, str]]] = set()
    while left:
        best = max(range(len(left)), key=lambda i: (len(_pairs(left[i]) - covered), -i))
        cell = left.pop(best)
        covered |= _pairs(cell)
        ordered.append(cell)
    return ordered


class TimeUp(Exception):
    """--max-minutes has passed: no new probe starts."""


class Gate:
    """The runner ``planner.probe`` calls for each probe it does not find stored: refuses when the matrix probe
    started after the deadline (:meth:`open_cell`), builds the ops the probe needs (once per run, see
    probes.ops.prepare), then runs it."""

    def __init__(self, runner: Runner, prepare: Prepare, deadline: float | None, clock: Callable[[], float]) -> None:
        self.runner, self.prepare, self.deadline, self.clock = runner, prepare, deadline, clock
        self.open = True

    def open_cell(self) -> None:
        """A matrix probe begins: its probes (one per depth) may run if the deadline has not passed."""
        self.open = self.deadline is None or self.clock() < self.deadline

    def __call__(self, request: Any) -> Any:
        if not self.open:
            raise TimeUp
        self.prepare([request], on_note=lambda line: print(f"gpu_validate: {line}", flush=True))
        return self.runner(request)


class Results:
    """The rows so far and the cells not run (yet); :meth:`write` rewrites both files atomically."""

    def __init__(self, out: Path, device: str, cells: list[Cell]) -> None:
        self.out, self.device, self.pending = out, device, list(cells)
        self.rows: list[dict[str, Any]] = []
        self.fingerprint: dict[str, Any] | None = None
        self.not_run: list[Cell] = []

    def add(self, cell: Cell, rows: list[dict[str, Any]], fingerprint: dict[str, Any] | None) -> None:
        self.pending.remove(cell)
        self.rows += rows
        self.fingerprint = self.fingerprint or fingerprint
        self.write()

    def skip(self, cell: Cell) -> None:
        self.pending.remove(cell)
        self.not_run.append(cell)
        self.write()

    def write(self) -> None:
        from planner.files.atomic import write_text_atomic

        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        write_text_atomic(self.out / "gpu_validate.csv", buffer.getvalue(), force=True)
        gpu = self.device == "cuda"
        title = "# Cost model against GPU probes" if gpu else "# Dry run on the CPU backend (not GPU figures)"
        lines = [title, "", f"Device: `{json.dumps(self.fingerprint)}`", ""]
        lines.append("| " + " | ".join(FIELDS) + " |")
        lines.append("|" + "---|" * len(FIELDS))
        lines += ["| " + " | ".join(str(r[f]) for f in FIELDS) + " |" for r in self.rows]
        waiting = [(cell, "not run (--max-minutes)") for cell in self.not_run]
        waiting += [(cell, "not run yet") for cell in self.pending]
        if waiting:
            lines += ["", f"{len(waiting)} probe(s) not run:", ""]
            lines += [f"- {cell.label()}: {why}" for cell, why in waiting]
        write_text_atomic(self.out / "gpu_validate.md", "\n".join(lines) + "\n", force=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--db", default=None, help="probe database (default OUT/gpu_validate.db): a rerun resumes")
    parser.add_argument("--steps", type=int, default=5, help="all steps of a probe, warm-up included")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--workloads", nargs="*", default=["sft", "ppo"], choices=["sft", "ppo"])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per probe (op builds not counted)")
    parser.add_argument("--max-minutes", type=float, default=None, help="start no new probe after this")
    parser.add_argument("--retry-failed", action="store_true", help="run stored error/timeout probes again")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of this script")
    parser.add_argument("--layers", default=None, help="cut every model to K layers (default: the whole model)")
    parser.add_argument(
        "--dtype",
        choices=("bf16", "fp16", "fp32"),
        default=None,
        help="compute dtype (default: bf16 on cuda; on cpu the dtype this processor runs fast, said in one line)",
    )
    return parser.parse_args(argv)


def main(
    argv: list[str] | None = None,
    *,
    runner: Runner | None = None,
    prepare: Prepare | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run the matrix; ``runner``, ``prepare`` and ``clock`` replace run_probe, prepare_ops and the clock."""
    args = parse_args(argv)
    _NOTED.clear()  # each run says its notes once
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_validate: no CUDA device here (use --device cpu for a dry run)", file=sys.stderr)
            return 2
    from probes.ops.prepare import OpBuildError

    if runner is None:
        from probes import run_probe

        runner = run_probe
    if prepare is None:
        from probes.ops.prepare import prepare_ops

        prepare = prepare_ops

    args.out.mkdir(parents=True, exist_ok=True)
    db = args.db or str(args.out / "gpu_validate.db")
    cells = order_cells(matrix(args.models, args.workloads))
    deadline = None if args.max_minutes is None else clock() + 60.0 * args.max_minutes
    gate = Gate(runner, prepare, deadline, clock)
    results = Results(args.out, args.device, cells)
    results.write()
    hardware = _local_gpu() if args.device == "cuda" else {"gpu": "H100-80G"}
    with tempfile.TemporaryDirectory() as tmp:
        for index, cell in enumerate(list(cells)):
            print(f"gpu_validate: [{index + 1}/{len(cells)}] {cell.label()}", flush=True)
            gate.open_cell()
            try:
                rows, fingerprint = _probe_cell(cell, args, db, gate, hardware, Path(tmp))
            except TimeUp:
                results.skip(cell)
                continue
            except OpBuildError as exc:
                print(f"gpu_validate: error: {exc}", file=sys.stderr)
                return 2
            results.add(cell, rows, fingerprint)
    skipped = f"; {len(results.not_run)} not run (--max-minutes)" if results.not_run else ""
    files = f"{args.out / 'gpu_validate.csv'} and {args.out / 'gpu_validate.md'}"
    print(f"wrote {files} ({len(results.rows)} rows{skipped})")
    return 0


def _probe_cell(
    cell: Cell, args: argparse.Namespace, db: str, gate: Gate, hardware: dict[str, Any], tmp: Path
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The csv rows of one cell (its depths), run through planner.probe (stored probes are reused)."""
    from planner import probe
    from store.workload_kinds import traits

    file = tmp / "strategy.json"
    file.write_text(json.dumps([cell.strategy]))
    job: dict[str, Any] = {"workload": cell.workload, "batch": 4, "cpu_mem": "64G", **hardware}
    if traits(cell.workload).rlhf:
        job.update(prompt_len=256, gen_len=256)
    else:
        job["seq_len"] = 512
    if args.dtype is not None:
        job["dtype"] = args.dtype
    options = dict(steps=args.steps, layers=args.layers, timeout_s=args.timeout, device=args.device, db=db, **job)
    report = probe(cell.model, strategies=str(file), runner=gate, on_note=_note_once, **options)
    if args.retry_failed and any(row.reused and row.outcome in FAILED for row in report.rows):
        report = probe(cell.model, strategies=str(file), runner=gate, force=True, **options)
    spreads = _spreads(db, [row.probe_id for row in report.rows])
    return [_csv_row(cell, row, spreads.get(row.probe_id)) for row in report.rows], report.fingerprint


_NOTED: set[str] = set()


def _note_once(line: str) -> None:
    """Print a note of planner.probe (the dtype it chose on the CPU, say) the first time it is said."""
    if line not in _NOTED:
        _NOTED.add(line)
        print(f"gpu_validate: {line}", flush=True)  # beside the progress lines; stderr is for errors


def _spreads(db: str, probe_ids: list[str]) -> dict[str, Any]:
    """The measured steps' time spread each stored probe's result carries (``extra["step_time_s"]``)."""
    from store.db import open_storage

    with open_storage(db) as storage:
        return {pid: storage.get_probe(pid).result.extra.get("step_time_s") for pid in probe_ids}


def _local_gpu() -> dict[str, Any]:
    """The catalog GPU matching this device (for its rates) with the device's own total memory."""
    import torch

    props = torch.cuda.get_device_properties(0)
    name = props.name.upper()
    job: dict[str, Any] = {"gpu_mem": int(props.total_memory)}
    for candidate, marker in (("H200", "H200"), ("H100-80G", "H100"), ("A100-80G", "A100"), ("L40S", "L40S")):
        if marker in name:
            job["gpu"] = candidate
            break
    return job


def _csv_row(cell: Cell, row: Any, spread: dict[str, Any] | None) -> dict[str, Any]:
    m, p, e = row.measured or {}, row.predicted, row.errors
    gib = 2**30
    steps = f"{spread['min']:.4g}/{spread['median']:.4g}/{spread['max']:.4g}" if spread else ""
    return {
        "model": cell.model, "workload": cell.workload, "strategy": row.label, "outcome": row.outcome,
        "failed_phase": row.failed_phase or "",
        "meas_alloc_gib": round(m["peak_allocated_bytes"] / gib, 3) if m else "",
        "pred_alloc_gib": round(p["peak_allocated_bytes"] / gib, 3),
        "err_alloc": _fmt(e.get("peak_allocated")),
        "meas_reserved_gib": round(m["peak_reserved_bytes"] / gib, 3) if m else "",
        "pred_reserved_gib": round(p["peak_reserved_bytes"] / gib, 3),
        "err_reserved": _fmt(e.get("peak_reserved")),
        "meas_step_s": round(m["step_time_s"], 4) if m else "", "pred_step_s": round(p["step_time_s"], 4),
        "err_step": _fmt(e.get("step_time")), "step_spread_s": steps, "reused": "yes" if row.reused else "",
        "probe_id": row.probe_id,
    }  # fmt: skip


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{100 * value:+.1f}%"


if __name__ == "__main__":
    sys.exit(main())
