"""Finding rows of the plan database by what a user typed: an id or its prefix, and a number of rows to list."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import InstrumentedAttribute, Session

from store.db._orm import Base
from store.db._record import (
    MIN_PREFIX_LENGTH,
)
from store.errors import InputError

_Row = TypeVar("_Row", bound=Base)


def check_limit(limit: object, what: str) -> None:
    """InputError unless ``limit`` is a whole number >= 1."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InputError(f"the number of {what} to list must be a whole number >= 1, got {limit!r}")


def by_prefix(
    session: Session, row_type: type[_Row], column: InstrumentedAttribute[str], given: str, words: tuple[str, str, str]
) -> _Row:
    """The one row whose id ``column`` is, or starts with, ``given`` (case-insensitive, at least
    ``MIN_PREFIX_LENGTH`` characters); else InputError with one line. ``words`` name the id, say that
    none matched, and say where ids are listed: ("plan id", "no saved plan", "; `planner plans` lists them").
    """
    id_words, none_words, hint = words
    wanted = given.strip().lower() if isinstance(given, str) else ""
    if len(wanted) < MIN_PREFIX_LENGTH:
        raise InputError(f"{id_words} {given!r} is too short: give at least {MIN_PREFIX_LENGTH} characters")
    stmt = select(row_type).where(column.startswith(wanted, autoescape=True)).order_by(column).limit(3)
    rows = list(session.scalars(stmt))
    exact = [row for row in rows if getattr(row, column.key) == wanted]
    if exact or len(rows) == 1:
        return (exact or rows)[0]
    if not rows:
        raise InputError(f"{none_words} has an id starting with {wanted!r}{hint}")
    shown = ", ".join(getattr(row, column.key) for row in rows[:2]) + (" and more" if len(rows) > 2 else "")
    raise InputError(f"{id_words} {wanted!r} is ambiguous: it matches {shown}; give more characters")
