"""SQLAlchemy ORM rows of the plan database. Private: storages turn rows into frozen records.

The tables here must match what ``store/migrations`` builds; a test compares them with Alembic's
autogenerate and fails on any difference.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Dialect, Float, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """A tz-aware UTC datetime, stored as UTC whether or not the database keeps time zones."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Convert to UTC; naive values are refused (their zone is unknown)."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("created_at must be timezone-aware")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Attach (or convert to) UTC."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class SearchText(TypeDecorator[str]):
    """Text kept for searching only (a probe's message and failed phase; records read the result's JSON):
    on PostgreSQL, whose text cannot hold NUL characters, a NUL is stored as U+FFFD, so that a probe whose
    error message has one is still saved. Other databases store the text as it is."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        """Replace NUL characters on PostgreSQL."""
        if value is None or dialect.name != "postgresql":
            return value
        return value.replace("\x00", "\ufffd")


class Base(DeclarativeBase):
    """Declarative base of the plan database."""


class PlanRow(Base):
    """One row of ``plans``: the searchable columns plus the JSON of every part of the plan."""

    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[str] = mapped_column(String(32), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    model: Mapped[str] = mapped_column(Text)
    fits: Mapped[bool] = mapped_column(Boolean)
    workload: Mapped[dict[str, Any]] = mapped_column(JSON)
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON)
    strategy: Mapped[dict[str, Any]] = mapped_column(JSON)
    predicted: Mapped[dict[str, Any]] = mapped_column(JSON)
    ds_config: Mapped[dict[str, Any]] = mapped_column(JSON)
    document: Mapped[dict[str, Any]] = mapped_column(JSON)


class ProbeRunRow(Base):
    """One row of ``probe_runs``: one probe command, the keys it asked for (in order) and its status."""

    __tablename__ = "probe_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(32), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    total: Mapped[int] = mapped_column(Integer)
    request_keys: Mapped[list[str]] = mapped_column(JSON)
    options: Mapped[dict[str, Any]] = mapped_column(JSON)


class ProbeRow(Base):
    """One row of ``probes``: the searchable columns, the peaks, and the JSON of request and result.

    ``run_id`` names a ``probe_runs`` row by value (no foreign key: a probe may outlive its run).
    """

    __tablename__ = "probes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    probe_id: Mapped[str] = mapped_column(String(32), unique=True, index=True)
    key: Mapped[str] = mapped_column(String(64), index=True)
    run_id: Mapped[str | None] = mapped_column(String(32), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    model: Mapped[str] = mapped_column(Text)
    device: Mapped[str] = mapped_column(String(32))
    outcome: Mapped[str] = mapped_column(String(16))
    failed_phase: Mapped[str | None] = mapped_column(SearchText)
    message: Mapped[str] = mapped_column(SearchText)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    fingerprint: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    peak_allocated_bytes: Mapped[int] = mapped_column(BigInteger)
    peak_reserved_bytes: Mapped[int] = mapped_column(BigInteger)
    step_time_s: Mapped[float] = mapped_column(Float)
    wall_s: Mapped[float] = mapped_column(Float)


class ProbeArtifactRow(Base):
    """One row of ``probe_artifacts``: a named binary record kept with a probe (its allocation stream or
    CUDA snapshot, :mod:`store.artifacts`); at most one per probe and name.

    ``probe_id`` names a ``probes`` row by value, as ``probes.run_id`` names a run; ``size`` is the length
    of ``data``, so listing a probe's artifacts reads no blob.
    """

    __tablename__ = "probe_artifacts"
    __table_args__ = (Index("ix_probe_artifacts_probe_id_name", "probe_id", "name", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    probe_id: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(64))
    format: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class ModelShapeRow(Base):
    """One row of ``model_shapes``: a traced model shape (:mod:`store.model_shape`) under its cache key."""

    __tablename__ = "model_shapes"
    __table_args__ = (Index("ix_model_shapes_key", "key", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64))
    model_type: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)


class CalibrationRow(Base):
    """One row of ``calibrations``: coefficients fitted to the probes of one device (``target``: the catalog
    GPU it is, or ``cpu:<model>`` for DeepSpeed's CPU accelerator), the probes' ids, and the fit's report."""

    __tablename__ = "calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    calibration_id: Mapped[str] = mapped_column(String(32), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    target: Mapped[str] = mapped_column(String(200), index=True)
    device: Mapped[str] = mapped_column(String(32))
    version: Mapped[int] = mapped_column(Integer)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON)
    values: Mapped[dict[str, float]] = mapped_column(JSON)
    probe_ids: Mapped[list[str]] = mapped_column(JSON)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
