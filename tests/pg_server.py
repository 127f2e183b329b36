"""A real PostgreSQL server for the tests: the one named by ``$MEMPLAN_TEST_POSTGRES_URL``, else a throwaway
one started from the PostgreSQL binaries on this machine, else none (and the tests that need one skip,
saying why).

- ``$MEMPLAN_TEST_POSTGRES_URL``: a SQLAlchemy URL of an existing server's maintenance database, such as
  ``postgresql+psycopg://me:secret@db.example/postgres``, whose role may ``CREATE DATABASE``. Every test
  gets its own database ``memplan_test_<hex>`` there, dropped when the test ends. A server named there
  that cannot be reached fails the tests (it was asked for), rather than skipping them.
- Otherwise ``initdb`` and ``pg_ctl`` are looked up on ``PATH``, then in ``/usr/lib/postgresql/*/bin``
  (Debian, Ubuntu) and ``/usr/pgsql-*/bin`` (RHEL); the newest found is used. The server lives in a
  fresh folder under the temp folder, listens only on a unix socket there (no TCP port to collide
  with), trusts local connections, and runs without fsync (the tests check behaviour, not
  durability). It starts once per test session, on first use, and is stopped (``pg_ctl stop -m
  immediate``) and removed at the end of the session (also at interpreter exit, should pytest not get
  to it, and by a small watchdog process once the test process is gone, should it be killed).
- As root (CI containers often run as root) ``initdb`` refuses to run: the server is then run as the
  user ``postgres`` (or ``nobody``) through ``runuser`` (or ``setpriv``); with neither, the tests skip.

Set ``MEMPLAN_TEST_POSTGRES_REQUIRED=1`` to turn "no PostgreSQL server" skips into failures (for a CI
that must run them).
"""

from __future__ import annotations

import atexit
import glob
import importlib.util
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine, make_url, text
from sqlalchemy.engine import URL

ENV_URL = "MEMPLAN_TEST_POSTGRES_URL"
ENV_REQUIRED = "MEMPLAN_TEST_POSTGRES_REQUIRED"
START_TIMEOUT_S = 120  # only a safety net: pg_ctl returns as soon as the server accepts connections
SUPERUSER = "memplan"
UNPRIVILEGED_USERS = ("postgres", "nobody")
PASSWORD_ROLE = ("memplan_password", "right-horse-battery")
_SEARCH_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin")


class NoPostgres(Exception):
    """No PostgreSQL server can be had here; the message says why (it becomes the skip reason)."""


class PostgresFailed(Exception):
    """The PostgreSQL server the tests were told to use (``$MEMPLAN_TEST_POSTGRES_URL``) does not answer."""


@dataclass
class PostgresServer:
    """A running server: ``admin_url`` is the SQLAlchemy URL of a database from which tests create theirs."""

    admin_url: URL
    folder: Path | None = None  # the throwaway server's folder (None for a server named by the env var)
    # A role that must give its password (the throwaway server trusts every other local connection):
    # (name, password), or None on a server named by the env var.
    password_role: tuple[str, str] | None = None
    run_as: list[str] = field(default_factory=list)
    pg_ctl: str = ""

    def create_database(self) -> str:
        """Create an empty database and return its SQLAlchemy URL (password included). Costs a checkpoint
        (tenths of a second): ``create_schema`` is the cheap way to an empty place for a test."""
        name = f"memplan_test_{uuid.uuid4().hex[:12]}"
        try:  # PostgreSQL 15+ copies the template through the WAL by default, which is slower here
            self._admin(f'CREATE DATABASE "{name}" STRATEGY FILE_COPY')
        except Exception:  # before PostgreSQL 15 there is no STRATEGY (and FILE_COPY is what it does)
            self._admin(f'CREATE DATABASE "{name}"')
        return self.admin_url.set(database=name).render_as_string(hide_password=False)

    def drop_database(self, url: str) -> None:
        """Drop a database made by ``create_database``, closing connections left open to it."""
        name = make_url(url).database
        try:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception:  # a server before PostgreSQL 13 has no FORCE
            self._admin(f'DROP DATABASE IF EXISTS "{name}"')

    def create_schema(self) -> str:
        """Create an empty schema in the admin database and return a SQLAlchemy URL (password included)
        whose connections see only it: libpq's ``options=-csearch_path=<schema>`` makes it the default
        schema, where the store and Optuna create and look for their tables. For the store that is an
        empty database, made in milliseconds."""
        name = f"memplan_test_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE SCHEMA "{name}"')
        query = dict(self.admin_url.query)
        options = " ".join(filter(None, [str(query.get("options", "")), f"-csearch_path={name}"]))
        return self.admin_url.update_query_dict({"options": options}).render_as_string(hide_password=False)

    def drop_schema(self, url: str) -> None:
        """Drop a schema made by ``create_schema`` with everything in it."""
        name = str(make_url(url).query["options"]).rsplit("-csearch_path=", 1)[1]
        self._admin(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    def _admin(self, statement: str) -> None:
        """Run one statement outside a transaction (CREATE and DROP DATABASE need that) on ``admin_url``."""
        engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(statement))
        finally:
            engine.dispose()

    def stop(self) -> None:
        """Stop the throwaway server and remove its folder (a server named by the env var is left alone)."""
        if self.folder is None or not self.folder.exists():
            return
        data = self.folder / "data"
        subprocess.run(
            [*self.run_as, self.pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        shutil.rmtree(self.folder, ignore_errors=True)


def required() -> bool:
    """Whether a missing server should fail the tests instead of skipping them."""
    return os.environ.get(ENV_REQUIRED, "").strip().lower() in ("1", "true", "yes", "on")


def get_server() -> PostgresServer:
    """The server to test against (see the module docstring). NoPostgres when there is none to be had;
    PostgresFailed when the one named by ``$MEMPLAN_TEST_POSTGRES_URL`` does not answer."""
    if importlib.util.find_spec("psycopg") is None:
        raise NoPostgres("psycopg is not installed (pip install 'memplan[postgres]')")
    given = os.environ.get(ENV_URL, "").strip()
    if given:
        return _named_server(given)
    return _start_local_server()


def _named_server(given: str) -> PostgresServer:
    """The server at ``$MEMPLAN_TEST_POSTGRES_URL``, checked by connecting to it."""
    from store.db._url import resolve_db  # maps plain postgresql:// to psycopg 3 as the store does

    url = resolve_db(given, origin=f"${ENV_URL}").url
    server = PostgresServer(admin_url=url)
    try:
        server._admin("SELECT 1")
    except Exception as exc:
        shown = url.render_as_string(hide_password=True)
        raise PostgresFailed(f"${ENV_URL} names {shown}, which does not answer: {' '.join(str(exc).split())}") from exc
    return server


def find_binaries() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``; NoPostgres when none does."""
    on_path = shutil.which("initdb")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    for pattern in _SEARCH_GLOBS:  # the newest version first
        candidates += [Path(folder) for folder in sorted(glob.glob(pattern), key=_version_key, reverse=True)]
    for folder in candidates:
        if all(os.access(folder / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return folder
    raise NoPostgres(
        "no PostgreSQL server: initdb and pg_ctl are neither on PATH nor in /usr/lib/postgresql/*/bin,"
        f" and ${ENV_URL} is not set"
    )


def _version_key(folder: str) -> tuple[int, ...]:
    """Sort key of a binaries folder by the version number in its path (``.../15/bin``, ``pgsql-16``)."""
    digits = "".join(ch if ch.isdigit() else " " for ch in folder).split()
    return tuple(int(d) for d in digits)


def _run_as_prefix() -> tuple[list[str], int | None]:
    """The command prefix that runs the server's programs as an unprivileged user when this process is
    root (initdb refuses root), and that user's uid; ``([], None)`` otherwise."""
    if os.geteuid() != 0:
        return [], None
    for name in UNPRIVILEGED_USERS:
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            continue
        runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
        if runuser:
            return [runuser, "-u", name, "--"], user.pw_uid
        setpriv = shutil.which("setpriv") or shutil.which("setpriv", path="/usr/bin:/bin")
        if setpriv:
            return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"], user.pw_uid
        raise NoPostgres(
            "no PostgreSQL server: running as root, which initdb refuses, and neither runuser nor setpriv"
            f" is here to run it as {name!r}"
        )
    raise NoPostgres(
        "no PostgreSQL server: running as root, which initdb refuses, and there is no unprivileged user"
        f" ({' or '.join(UNPRIVILEGED_USERS)}) to run it as"
    )


def _watch(server: PostgresServer) -> None:
    """Start a watchdog, in a session of its own, that stops the server and removes its folder once this
    process is gone, however it ended (a SIGKILL or a CI timeout runs neither pytest's teardown nor atexit)."""
    assert server.folder is not None
    stop = " ".join(shlex.quote(part) for part in [*server.run_as, server.pg_ctl])
    data = shlex.quote(str(server.folder / "data"))
    script = (
        f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 2; done;"
        f" if [ -d {data} ]; then {stop} -D {data} -m immediate -w stop >/dev/null 2>&1;"
        f" rm -rf {shlex.quote(str(server.folder))}; fi"
    )
    subprocess.Popen(
        ["/bin/sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _start_local_server() -> PostgresServer:
    """initdb a fresh cluster in a temp folder and start it on a unix socket there."""
    binaries = find_binaries()
    run_as, uid = _run_as_prefix()
    # A short folder: a unix socket path has at most about 100 bytes.
    base = "/tmp" if os.path.isdir("/tmp") else None
    folder = Path(tempfile.mkdtemp(prefix="memplan-pg-", dir=base))
    if uid is not None:
        os.chown(folder, uid, -1)
    data = folder / "data"
    admin_url = URL.create("postgresql+psycopg", username=SUPERUSER, database="postgres", query={"host": str(folder)})
    server = PostgresServer(
        admin_url=admin_url,
        folder=folder,
        run_as=run_as,
        pg_ctl=str(binaries / "pg_ctl"),
    )
    initdb = [
        *run_as,
        str(binaries / "initdb"),
        "-D",
        str(data),
        "-U",
        SUPERUSER,
        "-A",
        "trust",
        "-E",
        "UTF8",
        "--locale=C",
        "--no-sync",
    ]
    # pg_ctl hands -o to a shell: the folder has no spaces or quotes (mkdtemp's letters and digits).
    options = f"-F -k {folder} -c listen_addresses='' -c synchronous_commit=off -c full_page_writes=off"
    start = [*run_as, server.pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-o", options, "-w"]
    start += ["-t", str(START_TIMEOUT_S), "start"]
    for command in (initdb, start):
        if command is start:  # the password role first, every other local connection trusted
            hba = data / "pg_hba.conf"
            hba.write_text(f"local all {PASSWORD_ROLE[0]} scram-sha-256\nlocal all all trust\n" + hba.read_text())
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S + 30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            server.stop()
            raise NoPostgres(f"no PostgreSQL server: {Path(command[len(run_as)]).name} failed: {exc}") from exc
        if done.returncode != 0:
            log = folder / "log"
            tail = (done.stderr + done.stdout + (log.read_text(errors="replace") if log.exists() else ""))[-600:]
            server.stop()
            raise NoPostgres(
                f"no PostgreSQL server: {Path(command[len(run_as)]).name} exited {done.returncode}: "
                + " ".join(tail.split())
            )
    atexit.register(server.stop)  # should pytest not get to its own teardown
    _watch(server)  # should pytest be killed (no atexit then)
    name, password = PASSWORD_ROLE
    server._admin(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    server._admin(f"GRANT CREATE ON DATABASE postgres TO {name}")
    server.password_role = PASSWORD_ROLE
    return server
