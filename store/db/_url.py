"""Which database a URL or path names: the one place that turns a user's text into something to open.

Everything a user can type as ``--db`` or ``$PLANNER_DB`` comes through ``resolve_db`` before any
folder or file is created; what cannot be opened raises InputError with one line
(``cannot open database WHAT: why``), never a traceback, a warning, or a file with an odd name.

Accepted:
- a plain file path (``plans.db``, ``~/plans.db``, ``/abs/plans.db``): a SQLite file, made absolute;
- ``sqlite:///relative.db``, ``sqlite:////abs.db`` and ``sqlite:///file:plans.db?uri=true`` (the
  form SQLAlchemy documents for SQLite URI filenames): a SQLite file; ``~`` is expanded here too;
- ``:memory:``, ``sqlite://``, ``sqlite:///:memory:`` and the common slip ``sqlite://:memory:``: an
  in-memory SQLite database that lives as long as the storage object;
- after ``?``, in a path or a SQLite URL, only ``mode=rwc`` (the default: create when missing),
  ``mode=rw`` (open an existing database, never create one), ``mode=ro`` (open an existing database
  read only) and ``uri=true``; SQLite files are opened through a ``file:`` URI when a mode is given;
- a PostgreSQL URL: ``postgresql+psycopg://user:password@host:5432/db`` (psycopg 3, the driver of
  ``pip install memplan[postgres]``); plain ``postgresql://`` and ``postgres://`` name psycopg 3 too
  unless psycopg2 (SQLAlchemy's default PostgreSQL driver) is installed; the driver checks its own
  parameters (``?sslmode=require``, ``?host=/run/postgresql`` for a unix socket, ...);
- any other SQLAlchemy URL as it is: its driver checks its own parameters.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qsl, quote, unquote

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError

from store.errors import InputError

SQLITE_MODES = ("rwc", "rw", "ro")
# The SQLAlchemy driver name of psycopg 3, the PostgreSQL driver of ``pip install memplan[postgres]``.
POSTGRES_DRIVER = "postgresql+psycopg"
# Longest name one folder entry can have (Linux, macOS and Windows all stop at 255); the database file's
# own name is 8 bytes shorter, for the "-journal" file SQLite writes beside it.
MAX_NAME_BYTES = 255
MAX_FILE_NAME_BYTES = MAX_NAME_BYTES - len("-journal")
# SQLite's unix VFS refuses paths of MAX_PATHNAME (512) bytes or more, counting the "-journal" it
# appends: a database path may have at most 504 bytes (measured on SQLite 3.40 and 3.45).
MAX_SQLITE_PATH_BYTES = 504
# Messages show at most this many characters of the URL or path (its start and its end).
MAX_SHOWN_CHARS = 160
_MEMORY_SLIP = re.compile(r"(?i)^(sqlite(?:\+\w+)?)://:memory:(\?.*)?$")
_TRUE_WORDS = ("true", "1", "yes", "on")
_PASSWORD = re.compile(r"(://[^/:@]*:)[^/@]*@")


class _Fail(Protocol):
    """How the checks below build their error: the reason, and optionally what to name instead of the text."""

    def __call__(self, why: str, shown: str | None = None) -> InputError: ...


@dataclass(frozen=True)
class DbTarget:
    """A checked database location.

    ``url`` is what the engine opens; ``shown`` names it in messages (password hidden, at most
    ``MAX_SHOWN_CHARS`` characters, no control characters); ``path`` is the SQLite file (None for an
    in-memory SQLite database and for other databases); ``mode`` is ``rwc``, ``rw`` or ``ro`` for a
    SQLite file and ``""`` otherwise; ``memory`` says whether it is an in-memory SQLite database.
    """

    url: URL
    shown: str
    path: Path | None
    mode: str
    memory: bool = False


def shorten(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` fit for a one-line message: control characters escaped, the middle cut when it is longer
    than ``limit`` characters.
    """
    safe = "".join(ascii(ch)[1:-1] if _is_control(ch) else ch for ch in text)
    if len(safe) <= limit:
        return safe
    head = limit * 2 // 3
    tail = limit - head - 3
    return f"{safe[:head]}...{safe[-tail:]}"


def resolve_db(text: str | os.PathLike[str], origin: str = "") -> DbTarget:
    """Check ``text`` (a SQLAlchemy URL or a file path) and say what to open; InputError otherwise.

    ``origin`` (such as ``"$PLANNER_DB"``) is named in messages when the text came from there.
    Nothing is created here: the folder of a SQLite file is made by the storage when it opens it.
    """
    if isinstance(text, os.PathLike):
        text = os.fspath(text)
    if not isinstance(text, str):
        raise InputError(f"cannot open database {shorten(repr(text))}: give a SQLite file path or a database URL")
    stripped = text.strip()
    where = f" (from {origin})" if origin else ""

    def fail(why: str, shown: str | None = None) -> InputError:
        named = _PASSWORD.sub(r"\1***@", stripped) if shown is None else shown
        return InputError(f"cannot open database {shorten(named)}{where}: {why}")

    if not stripped:
        raise fail("the URL or path is empty; give a file path such as plans.db or a URL such as sqlite:///plans.db")
    bad = next((ch for ch in stripped if _is_control(ch)), None)
    if bad is not None:
        raise fail(f"it contains the control character {ascii(bad)}")
    try:
        stripped.encode("utf-8")
    except UnicodeEncodeError:
        raise fail("it is not valid UTF-8 text (a file name in another encoding?)") from None
    if "://" not in stripped:
        path_text, _, query_text = stripped.partition("?")
        if path_text == ":memory:":
            return _sqlite_target(None, _query_pairs(query_text, fail), fail)
        if not path_text:
            raise fail("a file path is missing before the '?'")
        return _sqlite_target(path_text, _query_pairs(query_text, fail), fail)
    slip = _MEMORY_SLIP.match(stripped)  # "sqlite://:memory:" would parse ":memory:" as a host and port
    url = _parse(f"{slip.group(1)}:///:memory:{slip.group(2) or ''}" if slip else stripped, fail)
    if url.get_backend_name() != "sqlite":
        url = _with_driver(url)
        return DbTarget(url=url, shown=shorten(url.render_as_string(hide_password=True)), path=None, mode="")
    if url.username or url.password or url.host or url.port:
        raise fail(
            "a SQLite URL names no host or user: write sqlite:///relative/plans.db or sqlite:////absolute/plans.db",
            url.render_as_string(hide_password=True),
        )
    pairs: list[tuple[str, str]] = []
    for key, value in url.query.items():
        values = (value,) if isinstance(value, str) else value
        pairs.extend((key, one) for one in values)
    database = url.database or ""
    if database.startswith("file:"):  # a SQLite URI filename: the path is what follows, %-escaped
        database = unquote(database.removeprefix("file:"))
        if database.startswith("//"):
            if not database.startswith("///"):
                raise fail("a file: URI names no host: write file:relative.db or file:/absolute.db")
            database = database[2:]
    if database in ("", ":memory:"):
        return _sqlite_target(None, pairs, fail, drivername=url.drivername)
    return _sqlite_target(database, pairs, fail, drivername=url.drivername)


def _sqlite_target(
    path_text: str | None, pairs: list[tuple[str, str]], fail: _Fail, drivername: str = "sqlite"
) -> DbTarget:
    """The target for a SQLite file (``path_text``) or, when None, an in-memory SQLite database."""
    mode = _sqlite_mode(pairs, fail)
    if path_text is None:
        if mode != "rwc":
            raise fail(f"mode={mode} applies to a database file, not to an in-memory database")
        return DbTarget(url=URL.create(drivername), shown="sqlite:///:memory:", path=None, mode="rwc", memory=True)
    path = _file_path(path_text, fail)
    shown = f"sqlite:///{path}" + ("" if mode == "rwc" else f"?mode={mode}")
    if mode == "rwc":
        url = URL.create(drivername, database=str(path))
    else:  # a read-only or must-exist open needs SQLite's URI filenames; quote keeps '?', '#' and '%' in the name
        url = URL.create(drivername, database=f"file:{quote(str(path))}", query={"mode": mode, "uri": "true"})
    return DbTarget(url=url, shown=shorten(shown), path=path, mode=mode)


def _sqlite_mode(pairs: list[tuple[str, str]], fail: _Fail) -> str:
    """The ``mode`` among the query parameters (``rwc`` when none); InputError for any other parameter."""
    modes: list[str] = []
    for key, value in pairs:
        if key == "mode":
            if value not in SQLITE_MODES:
                raise fail(f"mode={value} is not one of {', '.join(SQLITE_MODES)} (ro opens a database read only)")
            modes.append(value)
        elif key == "uri":
            if value.lower() not in _TRUE_WORDS:
                raise fail(f"uri={value}: leave uri out, or write uri=true")
        else:
            raise fail(
                f"unknown parameter {key!r} after '?'; a SQLite database takes only mode=rwc|rw|ro (and uri=true)"
            )
    if len(set(modes)) > 1:
        raise fail(f"mode is given more than once ({', '.join(modes)})")
    return modes[0] if modes else "rwc"


def _file_path(path_text: str, fail: _Fail) -> Path:
    """The absolute path of a SQLite file, checked against what the file system and SQLite accept."""
    if path_text.endswith(("/", os.sep)):
        raise fail("it names a folder (it ends with a slash); give the database file's name")
    try:
        path = Path(path_text).expanduser()
    except RuntimeError:  # "~name" of no known user, or "~" with no home folder
        user = path_text[1:].split("/", 1)[0].split(os.sep, 1)[0]
        why = f"there is no user named {user!r} to expand '~{user}'" if user else "no home folder to expand '~'"
        raise fail(why) from None
    try:
        path = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a folder that cannot be read
        raise fail(f"cannot resolve the path ({' '.join(str(exc).split())})") from None
    if "?" in path.name or "?" in str(path.parent):
        raise fail("a database file name cannot contain '?' (it starts the parameters)")
    for part in path.parent.parts:
        size = len(part.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise fail(f"the folder name {shorten(part, 40)!r} is {size} bytes long; at most {MAX_NAME_BYTES} fit")
    size = len(path.name.encode("utf-8"))
    if size > MAX_FILE_NAME_BYTES:
        raise fail(
            f"the file name {shorten(path.name, 40)!r} is {size} bytes long; a database file name has at most"
            f" {MAX_FILE_NAME_BYTES} (SQLite adds '-journal' to it)"
        )
    size = len(str(path).encode("utf-8"))
    if sys.platform != "win32" and size > MAX_SQLITE_PATH_BYTES:
        raise fail(f"the path is {size} bytes long; SQLite opens paths of at most {MAX_SQLITE_PATH_BYTES} bytes")
    return path


def _query_pairs(query_text: str, fail: _Fail) -> list[tuple[str, str]]:
    """The ``key=value`` pairs after the '?' of a plain path."""
    try:
        return parse_qsl(query_text, keep_blank_values=True, strict_parsing=bool(query_text))
    except ValueError:
        why = f"cannot read the parameters after '?' ({query_text!r}); write them as key=value&key=value"
        raise fail(why) from None


def _with_driver(url: URL) -> URL:
    """``url`` with the PostgreSQL driver spelled out: plain ``postgresql://`` (and ``postgres://``, the
    spelling of libpq and many hosting services, which SQLAlchemy does not know) becomes
    ``postgresql+psycopg://`` (psycopg 3, what the ``postgres`` extra installs) unless psycopg2, SQLAlchemy's
    default for it, is installed. Other URLs come back as they are.
    """
    if url.drivername not in ("postgresql", "postgres"):
        return url
    if importlib.util.find_spec("psycopg2") is not None:
        return url.set(drivername="postgresql")
    return url.set(drivername=POSTGRES_DRIVER)


def _parse(text: str, fail: _Fail) -> URL:
    """Parse a SQLAlchemy URL; InputError for what is not one."""
    try:
        return make_url(text)
    except (ArgumentError, ValueError) as exc:  # a port that is not a number is a ValueError
        reason = " ".join(str(exc).split())
        raise fail(f"not a database URL ({reason}); a SQLite file is sqlite:///plans.db or just plans.db") from None


def _is_control(ch: str) -> bool:
    """Whether ``ch`` is a control character (newline, tab, NUL, ...)."""
    return unicodedata.category(ch) == "Cc"
