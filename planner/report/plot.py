"""A picture of one step's memory from the allocator replay: allocated and reserved bytes, phase by phase.

``planner explain PLAN_ID --plot FILE`` draws what :func:`search.replay_timeline` gives: the measured step's
allocated and reserved bytes event by event, a band per phase and a mark at every ``empty_cache`` call.
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

WIDTH, HEIGHT, PAD = 960, 360, 48
ENGINE_W = 220  # the rollout engine's block, left of the trainer's phases
PHASE_COLOURS = ("#eef3fb", "#fbf3e9", "#eefaf0", "#f7eef9", "#fbfbe9", "#e9f8fb")
PLOT_SUFFIXES = (".html", ".svg", ".png")


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
    from the ``rollout`` block of a plan's prediction (``search.rollout.engine``)."""

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


def memory_svg(timeline: StepTimeline, title: str, engine: EngineTurn | None = None) -> str:
    """An SVG of allocated (line) and reserved (filled) GiB over the step's events, with phase bands; with
    ``engine``, the rollout engine's turn drawn first as a block of its own on the same GiB scale."""
    xs, allocated, reserved = _series(timeline)
    x0, x1 = xs[0], max(xs[-1], xs[0] + 1)
    top = max(max(reserved), engine.awake if engine is not None else 0) * 1.08 or 1
    plot_left = PAD + (ENGINE_W if engine is not None else 0)

    def x(i: int) -> float:
        return plot_left + (WIDTH - PAD - plot_left) * (i - x0) / (x1 - x0)

    def y(b: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * b / top

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif">']
    if engine is not None:
        parts += _engine_svg(engine, PAD, y)
    bounds = [i for i, _ in timeline.phases] + [x1]
    for k, (start, name) in enumerate(timeline.phases):
        colour = PHASE_COLOURS[k % len(PHASE_COLOURS)]
        left, right = x(start), x(bounds[k + 1])
        parts.append(f'<rect x="{left:.1f}" y="{PAD}" width="{right - left:.1f}" height="{HEIGHT - 2 * PAD}" '
                     f'fill="{colour}"><title>{html.escape(name)}</title></rect>')  # fmt: skip
        if right - left > 40:
            parts.append(f'<text x="{left + 3:.1f}" y="{PAD + 12}" font-size="10">{html.escape(name)}</text>')
    area = " ".join(f"{x(i):.1f},{y(r):.1f}" for i, r in zip(xs, reserved, strict=True))
    parts.append(f'<polygon points="{x(x0):.1f},{y(0):.1f} {area} {x(xs[-1]):.1f},{y(0):.1f}" '
                 'fill="#f4a582" fill-opacity="0.6"><title>reserved</title></polygon>')  # fmt: skip
    line = " ".join(f"{x(i):.1f},{y(a):.1f}" for i, a in zip(xs, allocated, strict=True))
    parts.append(f'<polyline points="{line}" fill="none" stroke="#2166ac" stroke-width="1.2"/>')
    for i in timeline.empty_cache:
        parts.append(f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{PAD}" y2="{HEIGHT - PAD}" stroke="#b2182b" '
                     'stroke-dasharray="4 3"><title>empty_cache()</title></line>')  # fmt: skip
    for k in range(5):
        value = top * k / 4
        parts.append(f'<text x="4" y="{y(value) + 4:.1f}" font-size="10">{value / 2**30:.1f} GiB</text>')
    parts.append(f'<text x="{PAD}" y="20" font-size="13">{html.escape(title)}</text>')
    parts.append(f'<text x="{plot_left}" y="{HEIGHT - 14}" font-size="10">allocator events of one step · blue: '
                 'allocated · orange: reserved · red dashes: empty_cache()</text>')  # fmt: skip
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
    timeline: StepTimeline, path: str | Path, title: str, *, force: bool = False, engine: EngineTurn | None = None
) -> tuple[Path, list[tuple[str, int, int]]]:
    """Write the picture to ``path`` (its suffix picks the format), atomically; an existing file only with
    ``force``. Returns the file and the picture as rows (:func:`phase_rows`; with a rollout ``engine``, its
    turn's rows first: :meth:`EngineTurn.rows`)."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise InputError(f"--plot {target}: name a .html, .svg or .png file")
    if suffix == ".png":
        data = _png(timeline, title, engine)
    else:
        svg = memory_svg(timeline, title, engine)
        text = svg if suffix == ".svg" else (
            f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><body>{svg}</body>"
        )  # fmt: skip
        data = text.encode()
    rows = (engine.rows() if engine is not None else []) + phase_rows(timeline)
    return write_bytes_atomic(target, data, force=force), rows
