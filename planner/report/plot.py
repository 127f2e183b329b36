"""A picture of one step's memory from the allocator replay: allocated and reserved bytes, phase by phase.

``planner explain PLAN_ID --plot FILE`` draws what :func:`search.replay_timeline` gives: the measured step's
allocated and reserved bytes, a band per phase. With the plan's figures (:class:`PlanFigures`) the x-axis is
time: each phase run spans its predicted seconds (generation included, however few allocator events it makes),
the usable memory and the plan's peak reserved plus its spread are lines, and only the ``empty_cache`` calls
the plan's policy makes are marked (not the framework's own, such as the one before a colocated engine wakes).
``.html`` and ``.svg`` need nothing beyond the standard library (an inline SVG); ``.png`` uses matplotlib
where it is installed (``pip install matplotlib``) and says so where it is not.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.files.atomic import write_bytes_atomic
from search.step.replayed import StepTimeline
from store.errors import InputError
from store.phases import END_STEP, empties_after

WIDTH, HEIGHT, PAD = 960, 360, 48
ENGINE_W = 220  # the rollout engine's block, left of the trainer's phases
PHASE_COLOURS = ("#eef3fb", "#fbf3e9", "#eefaf0", "#f7eef9", "#fbfbe9", "#e9f8fb")
PLOT_SUFFIXES = (".html", ".svg", ".png")


@dataclass(frozen=True)
class PlanFigures:
    """What a plan's prediction says beside the replay: each phase's predicted seconds per run (``predicted.
    phases``: ``time_s`` per step over ``count`` runs), usable GPU memory (``gpu_budget_bytes``), the predicted
    peak reserved and its spread kept free (``reserved_uncertainty``), and the plan's ``empty_cache`` policy."""

    run_seconds: dict[str, float]
    usable_bytes: int
    peak_reserved_bytes: int
    spread: float
    empty_cache: str

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
        )

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


def _event_seconds(timeline: StepTimeline, figures: PlanFigures) -> Any:
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


def _series(timeline: StepTimeline) -> tuple[list[int], list[int], list[int]]:
    xs = [i for i, _, _ in timeline.samples]
    outside = _outside_at(timeline)
    allocated = [a + o for (_, a, _), o in zip(timeline.samples, outside, strict=True)]
    reserved = [r + o for (_, _, r), o in zip(timeline.samples, outside, strict=True)]
    return xs, allocated, reserved


def phase_rows(timeline: StepTimeline) -> list[tuple[str, int, int]]:
    """(phase, peak allocated, peak reserved) of each phase run of the drawn step: the picture as a table."""
    bounds = [i for i, _ in timeline.phases] + [timeline.samples[-1][0] + 1]
    xs, allocated, reserved = _series(timeline)
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


def _engine_svg(engine: EngineTurn, left: float, y: Any) -> list[str]:
    """The engine's turn as two stacked bars (awake, asleep) in the block from ``left`` to ``left + ENGINE_W``."""
    parts = [f'<text x="{left:.1f}" y="{PAD - 6}" font-size="11">rollout engine\'s turn ({html.escape(engine.engine)}, '
             f'{html.escape(engine.where)})</text>']  # fmt: skip
    for k, (label, stack) in enumerate(engine.bars()):
        bar_x, base = left + 20 + k * 95, 0
        for part, size, colour in stack:
            top, bottom = y(base + size), y(base)
            tip = html.escape(f"{label}: {part} {size / 2**30:.2f} GiB")
            parts.append(f'<rect x="{bar_x:.1f}" y="{top:.1f}" width="70" height="{bottom - top:.1f}" fill="{colour}" '
                         f'stroke="#555"><title>{tip}</title></rect>')  # fmt: skip
            base += size
        parts.append(f'<text x="{bar_x:.1f}" y="{HEIGHT - PAD + 14}" font-size="10">{html.escape(label)}</text>')
        parts.append(f'<text x="{bar_x:.1f}" y="{y(base) - 4:.1f}" font-size="10">{base / 2**30:.1f} GiB</text>')
    parts.append(f'<line x1="{left + ENGINE_W - 10:.1f}" x2="{left + ENGINE_W - 10:.1f}" y1="{PAD}" '
                 f'y2="{HEIGHT - PAD}" stroke="#999"/>')  # fmt: skip
    return parts


def memory_svg(
    timeline: StepTimeline, title: str, engine: EngineTurn | None = None, figures: PlanFigures | None = None
) -> str:
    """An SVG of allocated (line) and reserved (filled) GiB over the step, with phase bands; with ``engine``, the
    rollout engine's turn drawn first as a block of its own on the same GiB scale. With the plan's ``figures``
    the x-axis is the step's predicted seconds, usable memory and peak reserved + spread are lines, and only the
    plan's ``empty_cache`` calls are marked; without them, the x-axis counts allocator events."""
    events, allocated, reserved = _series(timeline)
    if figures is not None:
        seconds = _event_seconds(timeline, figures)
        xs = [seconds(i) for i in events]
        starts, x1 = time_axis(timeline, figures)
        x0 = 0.0
        bounds = [*starts, x1]
        calls = [seconds(i) for i in plan_calls(timeline, figures.empty_cache)]
        limits = [figures.usable_bytes, figures.spread_line_bytes]
    else:
        xs = [float(i) for i in events]
        x0, x1 = xs[0], max(xs[-1], xs[0] + 1)
        bounds = [float(i) for i, _ in timeline.phases] + [x1]
        calls = [float(i) for i in timeline.empty_cache]
        limits = []
    top = max(max(reserved), engine.awake if engine is not None else 0, *limits) * 1.08 or 1
    plot_left = PAD + (ENGINE_W if engine is not None else 0)

    def x(t: float) -> float:
        return plot_left + (WIDTH - PAD - plot_left) * (t - x0) / ((x1 - x0) or 1)

    def y(b: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * b / top

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif">']
    if engine is not None:
        parts += _engine_svg(engine, PAD, y)
    for k, (_, name) in enumerate(timeline.phases):
        colour = PHASE_COLOURS[k % len(PHASE_COLOURS)]
        left, right = x(bounds[k]), x(bounds[k + 1])
        parts.append(f'<rect class="phase" x="{left:.1f}" y="{PAD}" width="{right - left:.1f}" '
                     f'height="{HEIGHT - 2 * PAD}" fill="{colour}">'
                     f'<title>{html.escape(name)}</title></rect>')  # fmt: skip
        if right - left > 40:
            parts.append(f'<text x="{left + 3:.1f}" y="{PAD + 12}" font-size="10">{html.escape(name)}</text>')
    area = " ".join(f"{x(t):.1f},{y(r):.1f}" for t, r in zip(xs, reserved, strict=True))
    parts.append(f'<polygon points="{x(xs[0]):.1f},{y(0):.1f} {area} {x(xs[-1]):.1f},{y(0):.1f}" '
                 'fill="#f4a582" fill-opacity="0.6"><title>reserved</title></polygon>')  # fmt: skip
    line = " ".join(f"{x(t):.1f},{y(a):.1f}" for t, a in zip(xs, allocated, strict=True))
    parts.append(f'<polyline points="{line}" fill="none" stroke="#2166ac" stroke-width="1.2"/>')
    if figures is not None:
        for kind, size, colour, label in (
            ("usable", figures.usable_bytes, "#1a9850", "usable memory"),
            ("spread", figures.spread_line_bytes, "#762a83", f"peak reserved + spread ({figures.spread:.1%})"),
        ):
            tip = html.escape(f"{label}: {size / 2**30:.2f} GiB")
            parts.append(f'<line class="{kind}" x1="{plot_left}" x2="{WIDTH - PAD}" y1="{y(size):.1f}" '
                         f'y2="{y(size):.1f}" stroke="{colour}" stroke-width="1.2">'
                         f'<title>{tip}</title></line>')  # fmt: skip
    for t in calls:
        parts.append(f'<line class="empty_cache" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{PAD}" y2="{HEIGHT - PAD}" '
                     'stroke="#b2182b" stroke-dasharray="4 3"><title>empty_cache()</title></line>')  # fmt: skip
    for k in range(5):
        value = top * k / 4
        parts.append(f'<text x="4" y="{y(value) + 4:.1f}" font-size="10">{value / 2**30:.1f} GiB</text>')
    if figures is not None:
        for k in range(5):
            t = x0 + (x1 - x0) * k / 4
            parts.append(f'<text class="tick" x="{x(t):.1f}" y="{HEIGHT - PAD + 12}" font-size="10">{t:.2f} s</text>')
    parts.append(f'<text x="{PAD}" y="20" font-size="13">{html.escape(title)}</text>')
    axis = "predicted seconds of one step" if figures is not None else "allocator events of one step"
    lines = " · green: usable · purple: peak reserved + spread" if figures is not None else ""
    parts.append(f'<text class="axis" x="{plot_left}" y="{HEIGHT - 14}" font-size="10">{axis} · blue: allocated · '
                 f'orange: reserved{lines} · red dashes: empty_cache()</text>')  # fmt: skip
    if engine is not None:
        parts.append(f'<text x="{PAD}" y="{HEIGHT - 2}" font-size="10">{html.escape(engine.caption())}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _png(timeline: StepTimeline, title: str, engine: EngineTurn | None = None) -> bytes:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("a .png needs matplotlib (pip install matplotlib); .html or .svg need nothing") from None
    import io

    xs, allocated, reserved = _series(timeline)
    if engine is None:
        fig, ax = plt.subplots(figsize=(10, 4))
    else:
        fig, (side, ax) = plt.subplots(1, 2, figsize=(12, 4), sharey=True, gridspec_kw={"width_ratios": [1, 4]})
        for k, (_, stack) in enumerate(engine.bars()):
            base = 0.0
            for part, size, colour in stack:
                side.bar(k, size / 2**30, bottom=base, color=colour, edgecolor="#555", label=part if k == 0 else None)
                base += size / 2**30
        side.set_xticks([0, 1], [label for label, _ in engine.bars()], fontsize=7)
        side.set_title(f"{engine.engine} {engine.where}", fontsize=9)
        side.set_ylabel("GiB")
    bounds = [i for i, _ in timeline.phases] + [xs[-1]]
    for k, (start, name) in enumerate(timeline.phases):
        ax.axvspan(start, bounds[k + 1], color=PHASE_COLOURS[k % len(PHASE_COLOURS)])
        ax.text(start, max(reserved) / 2**30 * 1.02, name, fontsize=7)
    ax.fill_between(xs, [r / 2**30 for r in reserved], color="#f4a582", alpha=0.6, label="reserved")
    ax.plot(xs, [a / 2**30 for a in allocated], color="#2166ac", linewidth=1, label="allocated")
    for i in timeline.empty_cache:
        ax.axvline(i, color="#b2182b", linestyle="--", linewidth=0.8)
    ax.set_xlabel("allocator events of one step")
    if engine is None:
        ax.set_ylabel("GiB")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right")
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out.getvalue()


def write_memory_plot(
    timeline: StepTimeline,
    path: str | Path,
    title: str,
    *,
    force: bool = False,
    engine: EngineTurn | None = None,
    figures: PlanFigures | None = None,
) -> tuple[Path, list[tuple[str, int, int]]]:
    """Write the picture to ``path`` (its suffix picks the format), atomically; an existing file only with
    ``force``. Returns the file and the picture as rows (:func:`phase_rows`; with a rollout ``engine``, its
    turn's rows first: :meth:`EngineTurn.rows`). ``figures``: the plan's (:class:`PlanFigures`), for the SVG's
    time axis, limit lines and the plan's own ``empty_cache`` calls."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise InputError(f"--plot {target}: name a .html, .svg or .png file")
    if suffix == ".png":
        data = _png(timeline, title, engine)
    else:
        svg = memory_svg(timeline, title, engine, figures)
        text = svg if suffix == ".svg" else (
            f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><body>{svg}</body>"
        )  # fmt: skip
        data = text.encode()
    rows = (engine.rows() if engine is not None else []) + phase_rows(timeline)
    return write_bytes_atomic(target, data, force=force), rows
