"""The storage contract: what every plan database backend promises."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Any

from store.db._record import PlanRecord


class BaseStorage(abc.ABC):
    """A database of saved plans. Every backend keeps this contract; one test suite checks them all.

    Records:
        Methods return frozen ``PlanRecord`` values, never ORM rows or live views. The dicts in a
        record are fresh JSON-decoded copies: mutating them changes nothing stored, and the next read
        returns what was saved.

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

    ``close()``:
        Releases connections. The storage must not be used afterwards. Storages are also context
        managers that close on exit.

    Errors from the environment (a locked, read-only or vanished database) surface as InputError
    with one line naming the database, so the CLI can print it and exit 2.
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
