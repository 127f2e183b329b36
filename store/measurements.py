"""What a probe measured: frozen records shared by probes (which fill them), store (which keeps them)
and planner (which compares them with predictions). Plain data, JSON-shaped, no torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from store.artifacts import ProbeArtifact

OUTCOMES: tuple[str, ...] = ("ok", "oom", "error", "timeout")
# A run of the user's own program (``planner probe ... -- CMD``) may also end as one of these: its own batch
# contradicts the plan (measured, flagged), a setting of the strategy the program cannot take (nothing
# measured), or it never called ``deepspeed.initialize``. The store keeps them as final outcomes too.
PROGRAM_OUTCOMES: tuple[str, ...] = ("contradicts_plan", "not_applied", "no_initialize")
STORED_OUTCOMES: tuple[str, ...] = OUTCOMES + PROGRAM_OUTCOMES
PROGRAM_ID_LENGTH = 12


def program_id(program: dict[str, Any]) -> str:
    """The short id of a user's program: the first 12 hex digits of the sha256 of its fingerprint (command line,
    script path and sha256, library versions) as canonical JSON. ``planner recommend --program`` takes it."""
    text = json.dumps(program, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:PROGRAM_ID_LENGTH]


def script_sha256(path: Path) -> str:
    """The sha256 of a program's script file, read in 1 MiB chunks: the ``script_sha256`` of its fingerprint."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class PhaseMeasurement:
    """One phase of a probe step (SFT: forward, backward, optimizer_step; PPO: generation, scoring,
    actor_training, critic_training), measured over the probe's steps (peaks reset at each phase start).

    On CUDA the bytes are ``torch.cuda.max_memory_allocated/reserved`` within the phase; on the CPU
    backend ``peak_allocated_bytes`` is the peak of live tensor bytes seen by the dispatch-level tracker
    and reserved equals allocated (there is no caching allocator).
    """

    name: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    time_s: float  # median over measured steps (CUDA events on GPU, perf_counter on CPU)
    inactive_split_bytes: int = 0  # fragmentation: cached blocks split and not in use
    alloc_retries: int = 0
    num_ooms: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PhaseMeasurement:
        return cls(**data)


@dataclass(frozen=True)
class DeviceFingerprint:
    """Which device and software produced a measurement."""

    device: str  # "cuda" or "cpu"
    name: str  # GPU name, or the CPU model
    total_memory_bytes: int
    compute_capability: str = ""
    driver: str = ""
    cuda: str = ""
    torch: str = ""
    deepspeed: str = ""
    transformers: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceFingerprint:
        return cls(**data)

    @property
    def versions(self) -> dict[str, str]:
        return {"torch": self.torch, "deepspeed": self.deepspeed, "transformers": self.transformers}


@dataclass(frozen=True)
class ProbeRequest:
    """One probe to run: a workload and a strategy (JSON shapes), on a device, for a few steps.

    ``layers`` cuts the model to that many decoder layers (None: the full model); ``memory_cap_bytes``
    (CPU backend only) raises an out-of-memory error when live tensor bytes exceed it, standing in for
    the device's capacity. ``program`` is None for memplan's own training loop; for a run of the user's own
    program (``planner probe ... -- CMD``) it is the program's fingerprint (``command``, ``script``,
    ``script_sha256``, ``versions``), part of the key: another script file or library version is another probe.
    """

    workload: dict[str, Any]
    strategy: dict[str, Any]
    hardware: dict[str, Any]
    device: str = "cpu"
    steps: int = 3
    layers: int | None = None
    timeout_s: float = 600.0
    memory_cap_bytes: int | None = None
    program: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.program is None:  # memplan's own loop: the JSON stored before programs were probed
            del data["program"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeRequest:
        return cls(**data)

    @property
    def program_id(self) -> str | None:
        """The short id of the user's program this probe ran (:func:`program_id`), None for memplan's loop."""
        return program_id(self.program) if self.program is not None else None

    def key(self, versions: dict[str, str]) -> str:
        """Canonical hash of what decides the measurement: workload, strategy, hardware, device, steps,
        layers, cap and software versions, and the user's program where one ran (its fingerprint). Identical
        probes share it (and are not run twice)."""
        payload = {
            "workload": self.workload,
            "strategy": self.strategy,
            "hardware": self.hardware,
            "device": self.device,
            "steps": self.steps,
            "layers": self.layers,
            "memory_cap_bytes": self.memory_cap_bytes,
            "versions": versions,
        }
        if self.program is not None:  # memplan's own loop keeps the key it always had
            payload["program"] = self.program
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ProbeResult:
    """What happened: the outcome, where it stopped, and what each phase measured.

    A probe of several ranks (``hardware.gpus`` > 1) reports its worst rank: per phase the largest figures
    of any rank; ``extra["world_size"]``, ``extra["worst_rank"]`` and every rank's own result in
    ``extra["ranks"]`` (see ``probes.process.worst_rank``).

    ``artifacts`` are the binary records the probe kept (:mod:`store.artifacts`: its allocation stream or
    CUDA snapshot). They travel with the result from the probe to the store, which keeps them beside it;
    they are not part of its JSON (``to_dict``) nor of its equality, and a result read back from the store
    has none (load them by name from the storage).
    """

    outcome: str  # one of OUTCOMES
    phases: tuple[PhaseMeasurement, ...] = ()
    failed_phase: str | None = None  # the phase running when an oom/error/timeout struck
    message: str = ""
    host_rss_peak_bytes: int = 0
    wall_s: float = 0.0
    fingerprint: DeviceFingerprint | None = None
    layers: int | None = None  # decoder layers of the model that ran
    extra: dict[str, Any] = field(default_factory=dict)
    artifacts: tuple[ProbeArtifact, ...] = field(default=(), compare=False, repr=False)

    @property
    def peak_allocated_bytes(self) -> int:
        return max((p.peak_allocated_bytes for p in self.phases), default=0)

    @property
    def peak_reserved_bytes(self) -> int:
        return max((p.peak_reserved_bytes for p in self.phases), default=0)

    @property
    def step_time_s(self) -> float:
        return sum(p.time_s for p in self.phases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "phases": [p.to_dict() for p in self.phases],
            "failed_phase": self.failed_phase,
            "message": self.message,
            "host_rss_peak_bytes": self.host_rss_peak_bytes,
            "wall_s": self.wall_s,
            "fingerprint": self.fingerprint.to_dict() if self.fingerprint else None,
            "layers": self.layers,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        fingerprint = data.get("fingerprint")
        return cls(
            outcome=data["outcome"],
            phases=tuple(PhaseMeasurement.from_dict(p) for p in data.get("phases", [])),
            failed_phase=data.get("failed_phase"),
            message=data.get("message", ""),
            host_rss_peak_bytes=data.get("host_rss_peak_bytes", 0),
            wall_s=data.get("wall_s", 0.0),
            fingerprint=DeviceFingerprint.from_dict(fingerprint) if fingerprint else None,
            layers=data.get("layers"),
            extra=dict(data.get("extra", {})),
        )
