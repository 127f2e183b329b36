"""The storage contract: what every plan database backend promises (plans, probes, probe runs, calibrations)."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Any

from store.artifacts import ProbeArtifact
from store.db._record import CalibrationRecord, PlanRecord, ProbeRecord, ProbeRunRecord
from store.measurements import ProbeRequest, ProbeResult


class BaseStorage(abc.ABC):
    """A database of saved plans and measured probes. Every backend keeps this contract; one test suite
    checks them all.

    Records:
        Methods return frozen ``PlanRecord``, ``ProbeRecord`` and ``ProbeRunRecord`` values, never ORM
        rows or live views. The dicts in a record are fresh JSON-decoded copies: mutating them changes
        nothing stored, and the next read returns what was saved.

    Plans
    -----

    ``save_plan(*, kind, model, fits, workload, hardware, strategy, predicted, ds_config, document)``:
        Assigns a new ``plan_id`` (12 lowercase hex characters) and ``created_at`` (tz-aware UTC),
        writes ``plan_id`` into the stored document under ``"plan_id"`` (the first key), and stores the
        plan in one transaction: on any failure nothing is written. Every dict must be
        JSON-serialisable (no NaN or infinity); otherwise TypeError, naming the field, and nothing is
        written. Returns the record exactly as a later ``get_plan`` returns it.

    ``get_plan(plan_id_or_prefix)``:
        The plan whose id is, or starts with, the given text (case-insensitive, at least 4
        characters). InputError with one line when the text is too short, matches no plan, or matches
        more than one.

    ``latest_plan()``:
        The newest plan, or None when there is none.

    ``list_plans(limit=20, kind=None)``:
        Up to ``limit`` (>= 1, else InputError) plans, newest first; ``kind`` keeps only plans of that
        workload kind. Plans saved in the same instant come out in reverse order of saving.

    Probes
    ------
    A probe is one measured ``ProbeRequest`` and its ``ProbeResult``, stored under a ``key``: the
    canonical hash ``ProbeRequest.key(versions)`` (at most 64 characters), so that an identical probe
    is found instead of run again. Every save adds a row: history is kept, and the newest wins.

    ``save_probe(request, result, *, key, run_id=None)``:
        Assigns a new ``probe_id`` (12 lowercase hex characters) and ``created_at`` (tz-aware UTC) and
        stores the probe in one transaction, with ``kind`` and ``model`` from ``request.workload``,
        ``device`` from the request, and the outcome, failed phase, message, fingerprint, peaks, step
        time and wall time from the result. An earlier probe with the same key is kept, not replaced.
        ``run_id`` ties the probe to a probe run (see below); a run_id that names no run is InputError.
        Programming errors write nothing: TypeError for a request or result of the wrong type, an empty
        or over-long key, a workload without a non-empty str ``kind`` and ``model``, or anything JSON
        cannot encode (naming the field); ValueError for an outcome not in
        ``store.measurements.STORED_OUTCOMES`` (``OUTCOMES`` and a program run's ``PROGRAM_OUTCOMES``).
        Returns the record exactly as a later ``get_probe`` returns it: its ``request`` and ``result``
        equal the ones given (for JSON-shaped values).

    ``find_probe(key)``:
        The newest probe stored under ``key`` whose outcome is final (every outcome in ``STORED_OUTCOMES``
        is: ok, oom, error, timeout, and a program run's contradicts_plan, not_applied and no_initialize),
        or None. Probes saved in the same instant: the last saved wins. A run of the user's own program is a
        probe like any other: its request's ``program`` (the program's fingerprint) is part of its key and
        of its JSON, so no table or column is added for it.

    ``list_probes(limit=50, kind=None, model=None, device=None)``:
        Up to ``limit`` (>= 1, else InputError) probes, newest first (same instant: reverse order of
        saving); each given filter keeps only probes whose workload kind, model or device equals it.

    ``get_probe(probe_id_or_prefix)``:
        As ``get_plan``, for probe ids: at least 4 characters, case-insensitive, unique; InputError
        with one line otherwise.

    Probe artifacts
    ---------------
    A probe keeps named binary records beside its result (``store.artifacts.ProbeArtifact``: its
    allocation stream, its CUDA snapshot), at most one per name. ``save_probe`` stores
    ``result.artifacts`` in its own transaction (TypeError for anything but ProbeArtifacts with a plain
    name, a format and bytes; ValueError for two of one name; nothing is written then). Records read
    back carry no artifacts in ``result.artifacts``: they are read by name.

    ``save_probe_artifact(probe_id_or_prefix, artifact)``:
        Stores ``artifact`` with the probe (ids as ``get_probe``: InputError for no such probe), replacing
        the probe's artifact of the same name; one transaction. Returns the artifact as stored.

    ``load_probe_artifact(probe_id_or_prefix, name)``:
        The probe's artifact of this name (a fresh value equal to what was saved), or None when it has
        none. InputError as ``get_probe`` for the id.

    ``list_probe_artifacts(probe_id_or_prefix)``:
        ``{name: size in bytes}`` of the probe's artifacts, by name (reads no blob). InputError as
        ``get_probe`` for the id.

    Probe runs
    ----------
    A probe run records one command that asked for several probes, so that an interrupted command,
    issued again, resumes where it stopped.

    ``start_run(request_keys, options)``:
        Stores a new run with status ``"running"``, a new ``run_id`` (12 lowercase hex characters),
        ``created_at``, the keys in the order given (``total`` is their number, duplicates count) and
        the JSON ``options``; returns its record (``done_keys`` empty). TypeError for keys that are not
        a list of non-empty strings or options that are not a JSON dict; nothing is written then.

    ``finish_run(run_id, status="done")``:
        Sets the run's status to ``"done"`` or ``"interrupted"`` (anything else: ValueError) and returns
        its record. A run_id naming no run is InputError.

    ``unfinished_run(request_keys)``:
        The newest run whose status is ``"running"`` or ``"interrupted"`` and whose request keys equal
        ``request_keys`` (same keys, same order), or None. Runs marked done are never returned.

    ``get_run(run_id_or_prefix)``:
        The run with this id or unique id prefix (rules as ``get_plan``); InputError otherwise.

    Every run record carries ``done_keys``: the keys of the probes stored with its ``run_id``, each once,
    in the order they were first stored (``pending_keys`` is what remains).

    Model shapes
    ------------
    ``save_model_shape(key, shape)``:
        Stores a traced model shape (a JSON dict with a str ``model_type``) under ``key`` (1 to 64
        characters), replacing one stored under the same key. TypeError for a bad key or shape; nothing
        is written then.

    ``load_model_shape(key)``:
        The shape stored under ``key`` (a fresh copy), or None.

    Calibrations
    ------------
    A calibration is a set of cost-model coefficients fitted to the probes of one device. Every save adds
    a row (history is kept); the newest of a target is the one used.

    ``save_calibration(*, target, device, version, fingerprint, values, probe_ids, report)``:
        Assigns a new ``calibration_id`` (12 lowercase hex characters) and ``created_at`` (tz-aware UTC)
        and stores it in one transaction. TypeError for a target that is not a str of 1 to 200
        characters, a device other than cuda/cpu, a version below 1, values that are not finite
        numbers by name, probe ids that are not strings, or dicts JSON cannot encode; nothing is
        written then. Returns the record as a later ``get_calibration`` returns it.

    ``latest_calibration(target, version=None)``:
        The newest calibration of ``target`` (of ``version`` when given), or None.

    ``list_calibrations(limit=20, target=None)``:
        Up to ``limit`` (>= 1, else InputError) calibrations, newest first, optionally of one target.

    ``get_calibration(calibration_id_or_prefix)``:
        As ``get_plan``, for calibration ids.

    Both
    ----
    ``close()``:
        Releases connections. The storage must not be used afterwards. Storages are also context
        managers that close on exit.

    Errors from the environment (a locked, read-only or vanished database; a server out of reach, a
    wrong password, a missing database) surface as InputError with one line naming the database
    (password hidden), so the CLI can print it and exit 2. A server database (PostgreSQL) may refuse a
    value that SQLite keeps (text with a NUL character in a stored column such as ``model``, a ``kind``
    or ``device`` longer than 32 characters): InputError with one line, and nothing is written.

    Several processes may write to one database at once (several probe or tune runs on a team
    database): every save either lands whole or raises, and none is lost to another writer.
    """

    @abc.abstractmethod
    def save_plan(
        self,
        *,
        kind: str,
        model: str,
        fits: bool,
        workload: dict[str, Any],
        hardware: dict[str, Any],
        strategy: dict[str, Any],
        predicted: dict[str, Any],
        ds_config: dict[str, Any],
        document: dict[str, Any],
    ) -> PlanRecord:
        """Store a new plan in one transaction and return its record (see the class docstring)."""

    @abc.abstractmethod
    def get_plan(self, plan_id_or_prefix: str) -> PlanRecord:
        """The plan with this id or unique id prefix of at least 4 characters; else InputError."""

    @abc.abstractmethod
    def latest_plan(self) -> PlanRecord | None:
        """The newest plan, or None when none is saved."""

    @abc.abstractmethod
    def list_plans(self, limit: int = 20, kind: str | None = None) -> list[PlanRecord]:
        """Up to ``limit`` plans, newest first, optionally only those of workload ``kind``."""

    @abc.abstractmethod
    def save_probe(
        self, request: ProbeRequest, result: ProbeResult, *, key: str, run_id: str | None = None
    ) -> ProbeRecord:
        """Store a new probe under ``key`` in one transaction, keeping older ones (see the class docstring)."""

    @abc.abstractmethod
    def find_probe(self, key: str) -> ProbeRecord | None:
        """The newest probe stored under ``key`` with a final outcome, or None."""

    @abc.abstractmethod
    def list_probes(
        self, limit: int = 50, kind: str | None = None, model: str | None = None, device: str | None = None
    ) -> list[ProbeRecord]:
        """Up to ``limit`` probes, newest first, optionally only those of this kind, model and device."""

    @abc.abstractmethod
    def get_probe(self, probe_id_or_prefix: str) -> ProbeRecord:
        """The probe with this id or unique id prefix of at least 4 characters; else InputError."""

    @abc.abstractmethod
    def save_probe_artifact(self, probe_id_or_prefix: str, artifact: ProbeArtifact) -> ProbeArtifact:
        """Store ``artifact`` with the probe, replacing one of the same name (see the class docstring)."""

    @abc.abstractmethod
    def load_probe_artifact(self, probe_id_or_prefix: str, name: str) -> ProbeArtifact | None:
        """The probe's artifact named ``name``, or None; InputError for no such probe."""

    @abc.abstractmethod
    def list_probe_artifacts(self, probe_id_or_prefix: str) -> dict[str, int]:
        """``{name: size in bytes}`` of the probe's artifacts, by name; InputError for no such probe."""

    @abc.abstractmethod
    def save_model_shape(self, key: str, shape: dict[str, Any]) -> None:
        """Store a traced model shape under ``key``, replacing an older one (see the class docstring)."""

    @abc.abstractmethod
    def load_model_shape(self, key: str) -> dict[str, Any] | None:
        """The model shape stored under ``key``, or None (see the class docstring)."""

    @abc.abstractmethod
    def save_calibration(
        self,
        *,
        target: str,
        device: str,
        version: int,
        fingerprint: dict[str, Any],
        values: dict[str, float],
        probe_ids: list[str],
        report: dict[str, Any],
    ) -> CalibrationRecord:
        """Store a new calibration in one transaction and return its record (see the class docstring)."""

    @abc.abstractmethod
    def latest_calibration(self, target: str, version: int | None = None) -> CalibrationRecord | None:
        """The newest calibration of ``target`` (and ``version`` when given), or None."""

    @abc.abstractmethod
    def list_calibrations(self, limit: int = 20, target: str | None = None) -> list[CalibrationRecord]:
        """Up to ``limit`` calibrations, newest first, optionally only those of ``target``."""

    @abc.abstractmethod
    def get_calibration(self, calibration_id_or_prefix: str) -> CalibrationRecord:
        """The calibration with this id or unique id prefix of at least 4 characters; else InputError."""

    @abc.abstractmethod
    def start_run(self, request_keys: list[str], options: dict[str, Any]) -> ProbeRunRecord:
        """Store a new probe run, status ``"running"``, for these keys (in order) and options."""

    @abc.abstractmethod
    def finish_run(self, run_id: str, status: str = "done") -> ProbeRunRecord:
        """Mark the run ``"done"`` or ``"interrupted"`` and return its record; InputError for no such run."""

    @abc.abstractmethod
    def unfinished_run(self, request_keys: list[str]) -> ProbeRunRecord | None:
        """The newest running or interrupted run asked for exactly these keys (in order), or None."""

    @abc.abstractmethod
    def get_run(self, run_id_or_prefix: str) -> ProbeRunRecord:
        """The run with this id or unique id prefix of at least 4 characters; else InputError."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connections; the storage must not be used afterwards."""

    def __enter__(self) -> BaseStorage:
        """Use the storage in a ``with`` block that closes it."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the storage."""
        self.close()
