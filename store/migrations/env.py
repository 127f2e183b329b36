"""Alembic environment of the plan database.

``store.db`` runs this programmatically (no alembic.ini): it sets ``script_location`` to this folder
and passes an open connection, inside a transaction, in ``config.attributes["connection"]``. With no
connection it falls back to ``sqlalchemy.url`` (online) or emits SQL (offline, ``--sql``).

Adding a schema change: copy ``versions/0001_plans.py`` to ``versions/NNNN_<what>.py``, set
``revision = "NNNN"`` and ``down_revision`` to the previous one, write upgrade/downgrade, change the
ORM rows in ``store/db/_orm.py`` to match, and set ``HEAD_REVISION`` in ``store/db/_schema.py`` to the
new id. Tests fail until the constant, the scripts and the ORM agree.

The revision is kept in ``memplan_alembic_version`` (``store.db._schema.VERSION_TABLE``), not Alembic's
default ``alembic_version``, which Optuna's RDB storage uses for its own revision in the same database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from store.db._schema import VERSION_TABLE

config = context.config


def _run(connection: Connection) -> None:
    """Run the pending migrations on ``connection``."""
    context.configure(connection=connection, target_metadata=None, render_as_batch=True, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit the migration SQL for ``sqlalchemy.url`` instead of running it."""
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the given connection, or on a new one to ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("store migrations: pass a connection in config.attributes or set sqlalchemy.url")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
