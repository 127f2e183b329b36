"""What the memory picture shows, computed once for every format: the x-axis, the phase bands, the lines, the marks.

:func:`picture_layout` turns the allocator replay (:func:`search.replay_timeline`) and the plan's figures into a
:class:`PictureLayout` in data units (seconds or event indices across, bytes up); the SVG
(:mod:`planner.report.plot`) and the PNG (:mod:`planner.report.plot_png`) only draw it. With the plan's figures
(:class:`PlanFigures`) the x-axis is time: each phase run spans its predicted seconds (generation included, however
few allocator events it makes), the usable memory and the plan's peak reserved plus its spread are lines, and only
the ``empty_cache`` calls the plan's policy makes are marked (not the framework's own, such as the one before a
colocated engine wakes). Without them the x-axis counts allocator events and every call is marked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from search import StepTimeline
from store.errors import InputError
from store.phases import END_STEP, empties_after

PHASE_COLOURS = ("#eef3fb", "#fbf3e9", "#eefaf0", "#f7eef9", "#fbfbe9", "#e9f8fb")
HEADROOM = 1.08  # the y-axis reaches this much above the highest byte count drawn
TIME_AXIS = "predicted seconds of one step"
EVENT_AXIS = "allocator events of one step"


@dataclass(frozen=True)
class PlanFigures:
    """What a plan's prediction says beside the replay: each phase's predicted seconds per run (``predicted.
    phases``: ``time_s`` per step over ``count`` runs), usable GPU memory (``gpu_budget_bytes``), the predicted
    peak reserved and its spread kept free (``reserved_uncertainty``), the plan's ``empty_cache`` policy, and each
    phase's predicted (peak allocated, peak reserved) bytes, the figures the plan prints (``predicted.phases``)."""

    run_seconds: dict[str, float]
    usable_bytes: int
    peak_reserved_bytes: int
    spread: float
    empty_cache: str
    phase_peaks: dict[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> PlanFigures:
        """The figures of a plan's (or prediction's) JSON document."""
        predicted = document["predicted"]
        runs = {p["name"]: float(p["time_s"]) / max(1, int(p.get("count", 1))) for p in predicted["phases"]}
        return cls(
            run_seconds=runs,
            usable_bytes=int(predicted["gpu_budget_bytes"]),
            peak_reserved_bytes=int(predicted["peak_reserved_bytes"]),
            spread=float(predicted.get("reserved_uncertainty", 0.0)),
            empty_cache=str(document["strategy"].get("empty_cache", "never")),
            phase_peaks={
                str(p["name"]): (int(p["peak_allocated_bytes"]), int(p["peak_reserved_bytes"]))
                for p in predicted["phases"]
            },
        )

    def rows(self, timeline: StepTimeline) -> list[tuple[str, int, int]]:
        """The picture as a table, as :func:`phase_rows`, with each phase run's bytes the plan's own prediction
        of its phase (one source: what ``recommend`` and ``explain`` print); a phase it does not name, the
        replay's."""
        return [
            (name, *self.phase_peaks[name]) if name in self.phase_peaks else (name, allocated, reserved)
            for name, allocated, reserved in phase_rows(timeline)
        ]

    @property
    def spread_line_bytes(self) -> int:
        """Peak reserved with the spread on top: what the plan keeps below usable memory."""
        return round(self.peak_reserved_bytes * (1 + self.spread))


def run_bounds(timeline: StepTimeline) -> list[int]:
    """The event index where each phase run starts, and one past the last event."""
    return [i for i, _ in timeline.phases] + [timeline.samples[-1][0] + 1]


def time_axis(timeline: StepTimeline, figures: PlanFigures) -> tuple[list[float], float]:
    """Each phase run's start in seconds of the step (its predicted seconds per run laid end to end), and the
    step's end. A phase the prediction does not time gets a sliver (0.2% of the step), so it stays visible."""
    durations = [figures.run_seconds.get(name, 0.0) for _, name in timeline.phases]
    floor = 0.002 * (sum(durations) or 1.0)
    starts, now = [], 0.0
    for seconds in durations:
        starts.append(now)
        now += max(seconds, floor)
    return starts, now


def _event_seconds(timeline: StepTimeline, figures: PlanFigures) -> Callable[[float], float]:
    """A function from an event index to its second in the step (linear inside each phase run)."""
    bounds = run_bounds(timeline)
    starts, end = time_axis(timeline, figures)
    ends = starts[1:] + [end]

    def at(i: float) -> float:
        if i < bounds[0]:
            return 0.0
        for k in range(len(starts)):
            if i < bounds[k + 1] or k == len(starts) - 1:
                share = min(1.0, (i - bounds[k]) / max(1, bounds[k + 1] - bounds[k]))
                return starts[k] + (ends[k] - starts[k]) * share
        return end

    return at


def plan_calls(timeline: StepTimeline, policy: str) -> list[int]:
    """The ``empty_cache`` calls of the drawn step that ``policy`` makes: after a phase it empties after, or at
    the step's end; the others are the framework's (before a colocated rollout engine's turn)."""
    bounds = run_bounds(timeline)
    last = len(timeline.phases) - 1
    calls = []
    for i in timeline.empty_cache:
        runs = [k for k in range(len(timeline.phases)) if bounds[k] <= i]
        if not runs:
            continue
        k = runs[-1]
        if empties_after(policy, timeline.phases[k][1]) or (k == last and empties_after(policy, END_STEP)):
            calls.append(i)
    return calls


def _outside_at(timeline: StepTimeline) -> list[int]:
    """The bytes outside torch's allocator at each sample: its phase run's (a rollout engine awake in its turn,
    asleep beside the trainer), else the step's most, as a constant band."""
    if not timeline.phase_outside:
        return [timeline.outside] * len(timeline.samples)
    starts = [i for i, _ in timeline.phases]
    out, k = [], -1
    for i, _, _ in timeline.samples:
        while k + 1 < len(starts) and starts[k + 1] <= i:
            k += 1
        out.append(timeline.phase_outside[k] if k >= 0 else timeline.phase_outside[0])
    return out


def series(timeline: StepTimeline) -> tuple[list[int], list[int], list[int]]:
    """Each sample's event index, and its allocated and reserved bytes with what is held outside the allocator."""
    xs = [i for i, _, _ in timeline.samples]
    outside = _outside_at(timeline)
    allocated = [a + o for (_, a, _), o in zip(timeline.samples, outside, strict=True)]
    reserved = [r + o for (_, _, r), o in zip(timeline.samples, outside, strict=True)]
    return xs, allocated, reserved


def phase_rows(timeline: StepTimeline) -> list[tuple[str, int, int]]:
    """(phase, peak allocated, peak reserved) of each phase run of the drawn step: the picture as a table."""
    bounds = [i for i, _ in timeline.phases] + [timeline.samples[-1][0] + 1]
    xs, allocated, reserved = series(timeline)
    rows = []
    for k, (start, name) in enumerate(timeline.phases):
        inside = [(a, r) for i, a, r in zip(xs, allocated, reserved, strict=True) if start <= i < bounds[k + 1]]
        if not inside:  # a phase run with no allocator event: what is held outside the allocator only
            held = timeline.phase_outside[k] if timeline.phase_outside else timeline.outside
            inside = [(held, held)]
        rows.append((name, max(a for a, _ in inside), max(r for _, r in inside)))
    return rows


@dataclass(frozen=True)
class EngineTurn:
    """A vLLM or SGLang rollout engine's bytes on each of its GPUs, drawn as a block of its own beside the
    trainer's phases: awake while it generates (its weights, KV cache and the rest of its budget), asleep while
    the trainer works (what sleep at ``sleep_level`` leaves on the GPU), and waking for the weight sync. Read
    from the ``rollout`` block of a plan's prediction (``search.rlhf.engine``)."""

    engine: str
    placement: str  # "colocate": the trainer's GPUs; "separate": GPUs of its own
    sleep_level: int
    weights: int
    kv_cache: int
    awake: int
    asleep: int
    host_backup: int

    @classmethod
    def from_report(cls, rollout: dict[str, Any]) -> EngineTurn:
        """The engine's turn of a plan's ``predicted.rollout`` block; InputError where it lacks a size."""
        try:
            return cls(
                engine=str(rollout["engine"]),
                placement=str(rollout.get("placement", "colocate")),
                sleep_level=int(rollout.get("sleep_level", 0)),
                weights=int(rollout["weights_bytes"]),
                kv_cache=int(rollout["kv_cache_bytes"]),
                awake=int(rollout["awake_bytes"]),
                asleep=int(rollout["asleep_bytes"]),
                host_backup=int(rollout.get("host_backup_bytes", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"the plan's rollout block cannot be drawn: it lacks {exc}") from None

    @property
    def where(self) -> str:
        return "on the trainer's GPUs" if self.placement == "colocate" else "on GPUs of its own"

    def bars(self) -> list[tuple[str, list[tuple[str, int, str]]]]:
        """(label, [(part, bytes, colour), ...]) of the two bars: awake (generation) and asleep (training)."""
        rest = max(0, self.awake - self.weights - self.kv_cache)
        awake = [("weights", self.weights, "#4d9221"), ("KV cache", self.kv_cache, "#b8e186"),
                 ("activations, graphs, context", rest, "#e6f5d0")]  # fmt: skip
        asleep = [("kept", self.asleep, "#c2a5cf")]
        return [("awake: generation", awake), (f"asleep (level {self.sleep_level})", asleep)]

    def rows(self) -> list[tuple[str, int, int]]:
        """The engine's turn as table rows: (name, bytes, bytes), awake and asleep."""
        return [(f"{self.engine} awake", self.awake, self.awake), (f"{self.engine} asleep", self.asleep, self.asleep)]

    def caption(self) -> str:
        wake = {0: "it does not sleep: its budget stays held", 1: "sleep copies its weights to host memory "
                f"({self.host_backup / 2**30:.1f} GiB pinned) and wakes them back",
                2: "sleep discards its weights; the weight sync refills them"}.get(self.sleep_level, "")  # fmt: skip
        return f"{self.engine} rollout engine {self.where}, per GPU; {wake}"


@dataclass(frozen=True)
class LimitLine:
    """A horizontal line across the step: usable memory, or the plan's peak reserved plus its spread."""

    kind: str  # "usable" or "spread"
    size_bytes: int
    colour: str
    label: str


@dataclass(frozen=True)
class PictureLayout:
    """The picture in data units, for any renderer: x in seconds of the step (with the plan's figures) or in
    allocator events, y in bytes (the memory outside torch's allocator included)."""

    xs: list[float]  # each sample's x
    allocated: list[int]
    reserved: list[int]
    x0: float
    x1: float
    phases: list[str]  # each phase run's name, in order
    bounds: list[float]  # each phase run's start on the x-axis, and the step's end
    calls: list[float]  # the marked empty_cache() calls' x
    limits: list[LimitLine]
    top: float  # bytes at the top of the y-axis
    axis: str  # the x-axis' label
    timed: bool  # True: x is predicted seconds

    @property
    def legend(self) -> str:
        """What each colour means, one line."""
        lines = " · green: usable · purple: peak reserved + spread" if self.timed else ""
        return f"{self.axis} · blue: allocated · orange: reserved{lines} · red dashes: empty_cache()"


def picture_layout(
    timeline: StepTimeline, engine: EngineTurn | None = None, figures: PlanFigures | None = None
) -> PictureLayout:
    """The layout of one step's picture; ``engine``'s awake bytes count toward the y-axis' height."""
    events, allocated, reserved = series(timeline)
    limits: list[LimitLine] = []
    if figures is not None:
        seconds = _event_seconds(timeline, figures)
        xs = [seconds(i) for i in events]
        starts, x1 = time_axis(timeline, figures)
        x0, bounds = 0.0, [*starts, x1]
        calls = [seconds(i) for i in plan_calls(timeline, figures.empty_cache)]
        limits = [
            LimitLine("usable", figures.usable_bytes, "#1a9850", "usable memory"),
            LimitLine("spread", figures.spread_line_bytes, "#762a83", f"peak reserved + spread ({figures.spread:.1%})"),
        ]
    else:
        xs = [float(i) for i in events]
        x0, x1 = xs[0], max(xs[-1], xs[0] + 1)
        bounds = [float(i) for i, _ in timeline.phases] + [x1]
        calls = [float(i) for i in timeline.empty_cache]
    highest = max(max(reserved), engine.awake if engine is not None else 0, *(line.size_bytes for line in limits))
    return PictureLayout(
        xs=xs,
        allocated=allocated,
        reserved=reserved,
        x0=x0,
        x1=x1,
        phases=[name for _, name in timeline.phases],
        bounds=bounds,
        calls=calls,
        limits=limits,
        top=highest * HEADROOM or 1,
        axis=TIME_AXIS if figures is not None else EVENT_AXIS,
        timed=figures is not None,
    )
