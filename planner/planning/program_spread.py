"""Your program's own spread of peak reserved memory, from the stored runs of it (``planner probe ... -- CMD``).

The cost model predicts memplan's own training loop; the user's program around the same step (its collator,
loss, optimizer and extra tensors) reserves more or less. A plan keeps the spread its nearest measured records
give (:mod:`search.spread.measured`; their user-style loops included). Where the user's program ran a strategy
(``ok``: as planned) and memplan's own probe of the same strategy, workload and device is stored too, the
difference is measured: per phase, the program's peak reserved over the built-in probe's, less 1; a run's spread
is its worst phase, the program's the worst of its runs. ``recommend --program`` keeps that measured spread free
on top of the records' one (never less than 0: a program that reserves less than memplan's loop still gets the
plan's own headroom), and says so in the plan.

A program is named by the short id of its fingerprint (:func:`store.measurements.program_id`; ``planner probe
... -- CMD`` prints it) or by its script file: the runs of the newest program whose script had the file's
current sha256. Reads the plan database only; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.job.target import target_of
from store.db import database_exists, open_storage
from store.errors import InputError
from store.measurements import script_sha256

if TYPE_CHECKING:
    from store.db import ProbeRecord

MAX_READ_PROBES = 100_000  # stored probes read to find a program's runs and their built-in counterparts
MIN_ID_PREFIX = 4
MAX_SHOWN = 80  # characters of a --program argument an error line repeats


@dataclass(frozen=True)
class PhaseSpread:
    """One phase: the program's peak reserved against memplan's own probe's, same strategy and device."""

    name: str
    program_reserved_bytes: int
    builtin_reserved_bytes: int

    @property
    def spread(self) -> float:
        """program / built-in peak reserved - 1."""
        return self.program_reserved_bytes / self.builtin_reserved_bytes - 1.0


@dataclass(frozen=True)
class RunSpread:
    """One strategy's run of the program paired with the built-in probe of the same strategy."""

    program_probe_id: str
    builtin_probe_id: str
    strategy: dict[str, Any]
    target: str
    phases: tuple[PhaseSpread, ...]

    @property
    def spread(self) -> float:
        """The worst (largest) phase spread."""
        return max(phase.spread for phase in self.phases)

    @property
    def worst_phase(self) -> str:
        """The phase of :attr:`spread`."""
        return max(self.phases, key=lambda phase: phase.spread).name

    def to_dict(self) -> dict[str, Any]:
        """JSON shape (the plan's ``search.program_spread.runs``)."""
        return {
            "program_probe_id": self.program_probe_id,
            "builtin_probe_id": self.builtin_probe_id,
            "strategy": self.strategy,
            "target": self.target,
            "spread": self.spread,
            "worst_phase": self.worst_phase,
            "phases": {p.name: p.spread for p in self.phases},
        }


@dataclass(frozen=True)
class ProgramSpread:
    """What is stored of one program: its id and fingerprint, how many runs, and the spreads measured."""

    program_id: str
    program: dict[str, Any]
    runs_stored: int
    pairs: tuple[RunSpread, ...]

    def on(self, target: str) -> tuple[RunSpread, ...]:
        """The pairs measured on ``target``; all of them where none was (measured elsewhere, applied here)."""
        here = tuple(pair for pair in self.pairs if pair.target == target)
        return here or self.pairs

    def spread(self, target: str) -> float | None:
        """The program's spread for a job on ``target`` (the worst run of :meth:`on`); None: none measured."""
        pairs = self.on(target)
        return max(pair.spread for pair in pairs) if pairs else None


def run_target(record: ProbeRecord) -> str:
    """The device a stored run measured on (:func:`planner.job.target.target_of` of its fingerprint)."""
    fingerprint = record.result.fingerprint
    return target_of(fingerprint.to_dict() if fingerprint is not None else {"device": record.device})[0]


def builtin_counterpart(record: ProbeRecord, stored: list[ProbeRecord]) -> ProbeRecord | None:
    """The newest finished built-in probe (memplan's own loop, full depth) of the same strategy, workload, ranks
    and device as the program run ``record`` (``stored``: newest first), or None."""
    request = record.request
    target = run_target(record)
    for other in stored:
        theirs = other.request
        if (
            theirs.program is None
            and other.result.outcome == "ok"
            and other.result.phases
            and theirs.layers is None
            and theirs.device == request.device
            and theirs.strategy == request.strategy
            and theirs.workload == request.workload
            and theirs.hardware.get("gpus") == request.hardware.get("gpus")
            and run_target(other) == target
        ):
            return other
    return None


def pair_spread(record: ProbeRecord, builtin: ProbeRecord) -> RunSpread | None:
    """The spread of a program run against its built-in counterpart, phase by phase (phases both measured);
    None where they share no phase with a peak."""
    theirs = {phase.name: phase.peak_reserved_bytes for phase in builtin.result.phases}
    phases = tuple(
        PhaseSpread(phase.name, phase.peak_reserved_bytes, theirs[phase.name])
        for phase in record.result.phases
        if theirs.get(phase.name, 0) > 0 and phase.peak_reserved_bytes > 0
    )
    if not phases:
        return None
    return RunSpread(record.probe_id, builtin.probe_id, dict(record.request.strategy), run_target(record), phases)


def run_spread(record: ProbeRecord, stored: list[ProbeRecord]) -> RunSpread | None:
    """A program run's spread against the stored built-in probe of its strategy (None: not ``ok``, or none)."""
    if record.request.program is None or record.result.outcome != "ok":
        return None
    builtin = builtin_counterpart(record, stored)
    return pair_spread(record, builtin) if builtin is not None else None


def stored_probes(db: str | None) -> list[ProbeRecord]:
    """Every stored probe, newest first; none where the database does not exist (it is not created to be read)."""
    if not database_exists(db):
        return []
    with open_storage(db) as storage:
        return list(storage.list_probes(limit=MAX_READ_PROBES))


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False where the file system cannot even look it up (a name too long for it)."""
    try:
        return path.is_file()
    except OSError:
        return False


def program_runs(ref: str, stored: list[ProbeRecord]) -> tuple[str, list[ProbeRecord]]:
    """(program id, its runs newest first) of the program ``ref`` names: a program id (or a prefix of at least
    4 characters) or the path of its script file; InputError for none or several."""
    runs = [record for record in stored if record.request.program is not None]
    text = ref.strip()
    path = Path(text).expanduser()
    shown = ref if len(ref) <= MAX_SHOWN else ref[: MAX_SHOWN - 3] + "..."  # one line stays one line
    if text and _is_file(path):
        try:
            digest = script_sha256(path)
        except OSError as exc:
            raise InputError(f"--program {shown}: cannot read it ({exc.strerror or exc})") from None
        same = [r for r in runs if (r.request.program or {}).get("script_sha256") == digest]
        if not same:
            earlier = [r for r in runs if (r.request.program or {}).get("script") == str(path.resolve())]
            why = " (runs of an earlier version of it are stored: the file changed since)" if earlier else ""
            raise InputError(
                f"--program {shown}: no stored run of a program with this script as it is now{why}; "
                "run planner probe [job options] -- CMD first"
            )
        newest = same[0].request.program_id
        assert newest is not None
        return newest, [r for r in same if r.request.program_id == newest]
    key = text.lower()
    if len(key) < MIN_ID_PREFIX or any(c not in "0123456789abcdef" for c in key):
        raise InputError(
            f"--program takes a program id (at least {MIN_ID_PREFIX} hex digits, as planner probe -- CMD prints it) "
            f"or your script's file, not {shown!r}"
        )
    ids = list(dict.fromkeys(r.request.program_id for r in runs if (r.request.program_id or "").startswith(key)))
    if not ids:
        raise InputError(f"--program {shown}: no stored run of such a program; run planner probe [job options] -- CMD")
    if len(ids) > 1:
        names = ", ".join(str(i) for i in ids)
        raise InputError(f"--program {shown} names several programs ({names}): give more of it")
    return str(ids[0]), [r for r in runs if r.request.program_id == ids[0]]


def program_spread(ref: str, db: str | None) -> ProgramSpread:
    """What is stored of the program ``ref`` names (:func:`program_runs`) and each of its spreads."""
    stored = stored_probes(db)
    ident, runs = program_runs(ref, stored)
    pairs = []
    seen: set[str] = set()
    for record in runs:  # newest first: the newest run of each strategy and device
        strategy_key = repr(sorted(record.request.strategy.items())) + run_target(record)
        if strategy_key in seen:
            continue
        pair = run_spread(record, stored)
        if pair is not None:
            seen.add(strategy_key)
            pairs.append(pair)
    return ProgramSpread(ident, dict(runs[0].request.program or {}), len(runs), tuple(pairs))


def applied_spread(found: ProgramSpread, target: str) -> tuple[float, str, dict[str, Any]]:
    """(the program's spread a plan on ``target`` keeps free on top of the measured records' spread (as
    ``coef.program_reserved_factor``, 1 + it: :mod:`search.spread.measured`), its reading line, the plan's
    ``program_spread`` block) for the program ``found``; 0 where no pair is stored."""
    script = Path(str(found.program.get("script") or "")).name or " ".join(found.program.get("command") or ())
    spread = found.spread(target)
    pairs = found.on(target)
    block: dict[str, Any] = {
        "program_id": found.program_id,
        "script": found.program.get("script", ""),
        "runs_stored": found.runs_stored,
        "measured_spread": spread,
        "runs": [pair.to_dict() for pair in pairs],
    }
    if spread is None:
        block["reserved_spread"] = 0.0
        line = (
            f"reserved spread: the measured records' only; no run of your program {found.program_id} ({script}) "
            "has memplan's own probe of the same strategy stored beside it (run planner probe with the same job "
            "options to measure the program's own spread)"
        )
        return 0.0, line, block
    applied = max(0.0, spread)
    block["reserved_spread"] = applied
    where = max(pairs, key=lambda pair: pair.spread).target  # the device of the worst run
    elsewhere = "" if where == target else f", measured on {where} and applied to a job on {target}"
    floor = " (kept at 0: it reserves less than memplan's loop)" if spread < 0 else ""
    line = (
        f"reserved spread: {100 * applied:.1f}%{floor} measured for your program {found.program_id} ({script}) "
        f"against memplan's probe of the same strategy (worst phase of {len(pairs)} strateg"
        f"{'y' if len(pairs) == 1 else 'ies'}{elsewhere}), on top of the measured records' spread"
    )
    return applied, line, block
