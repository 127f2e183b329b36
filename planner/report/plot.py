"""A picture of one step's memory from the allocator replay: allocated and reserved bytes, phase by phase.

``planner explain PLAN_ID --plot FILE`` draws what :func:`search.replay_timeline` gives, laid out once by
:func:`planner.report.plot_layout.picture_layout` (with the plan's figures the x-axis is the step's predicted
seconds, usable memory and peak reserved + spread are lines, and only the plan's own ``empty_cache`` calls are
marked). ``.html`` and ``.svg`` need nothing beyond the standard library (an inline SVG, drawn here); ``.png`` is
drawn from the same layout by matplotlib (:mod:`planner.report.plot_png`; the ``plot`` extra:
``pip install 'memplan[plot]'``) where it is installed, and says so where it is not.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

from planner.files.atomic import write_bytes_atomic
from planner.report.plot_layout import (
    PHASE_COLOURS,
    EngineTurn,
    PlanFigures,
    phase_rows,
    picture_layout,
    plan_calls,
    run_bounds,
    time_axis,
)
from planner.report.plot_png import png_bytes
from search import StepTimeline
from store.errors import InputError

__all__ = [
    "ENGINE_W", "HEIGHT", "PAD", "PLOT_SUFFIXES", "WIDTH", "EngineTurn", "PlanFigures", "memory_svg", "phase_rows",
    "plan_calls", "run_bounds", "time_axis", "write_memory_plot",
]  # fmt: skip

WIDTH, HEIGHT, PAD = 960, 360, 48
ENGINE_W = 220  # the rollout engine's block, left of the trainer's phases
PLOT_SUFFIXES = (".html", ".svg", ".png")


def _engine_svg(engine: EngineTurn, left: float, y: Callable[[float], float]) -> list[str]:
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
    layout = picture_layout(timeline, engine, figures)
    xs, x0, x1, top = layout.xs, layout.x0, layout.x1, layout.top
    plot_left = PAD + (ENGINE_W if engine is not None else 0)

    def x(t: float) -> float:
        return plot_left + (WIDTH - PAD - plot_left) * (t - x0) / ((x1 - x0) or 1)

    def y(b: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * b / top

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif">']
    if engine is not None:
        parts += _engine_svg(engine, PAD, y)
    for k, name in enumerate(layout.phases):
        colour = PHASE_COLOURS[k % len(PHASE_COLOURS)]
        left, right = x(layout.bounds[k]), x(layout.bounds[k + 1])
        parts.append(f'<rect class="phase" x="{left:.1f}" y="{PAD}" width="{right - left:.1f}" '
                     f'height="{HEIGHT - 2 * PAD}" fill="{colour}">'
                     f'<title>{html.escape(name)}</title></rect>')  # fmt: skip
        if right - left > 40:
            parts.append(f'<text x="{left + 3:.1f}" y="{PAD + 12}" font-size="10">{html.escape(name)}</text>')
    area = " ".join(f"{x(t):.1f},{y(r):.1f}" for t, r in zip(xs, layout.reserved, strict=True))
    parts.append(f'<polygon points="{x(xs[0]):.1f},{y(0):.1f} {area} {x(xs[-1]):.1f},{y(0):.1f}" '
                 'fill="#f4a582" fill-opacity="0.6"><title>reserved</title></polygon>')  # fmt: skip
    line = " ".join(f"{x(t):.1f},{y(a):.1f}" for t, a in zip(xs, layout.allocated, strict=True))
    parts.append(f'<polyline points="{line}" fill="none" stroke="#2166ac" stroke-width="1.2"/>')
    for limit in layout.limits:
        tip = html.escape(f"{limit.label}: {limit.size_bytes / 2**30:.2f} GiB")
        level = y(limit.size_bytes)
        parts.append(f'<line class="{limit.kind}" x1="{plot_left}" x2="{WIDTH - PAD}" y1="{level:.1f}" '
                     f'y2="{level:.1f}" stroke="{limit.colour}" stroke-width="1.2">'
                     f'<title>{tip}</title></line>')  # fmt: skip
    for t in layout.calls:
        parts.append(f'<line class="empty_cache" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{PAD}" y2="{HEIGHT - PAD}" '
                     'stroke="#b2182b" stroke-dasharray="4 3"><title>empty_cache()</title></line>')  # fmt: skip
    for k in range(5):
        value = top * k / 4
        parts.append(f'<text x="4" y="{y(value) + 4:.1f}" font-size="10">{value / 2**30:.1f} GiB</text>')
    if layout.timed:
        for k in range(5):
            t = x0 + (x1 - x0) * k / 4
            parts.append(f'<text class="tick" x="{x(t):.1f}" y="{HEIGHT - PAD + 12}" font-size="10">{t:.2f} s</text>')
    parts.append(f'<text x="{PAD}" y="20" font-size="13">{html.escape(title)}</text>')
    parts.append(f'<text class="axis" x="{plot_left}" y="{HEIGHT - 14}" font-size="10">{layout.legend}</text>')
    if engine is not None:
        parts.append(f'<text x="{PAD}" y="{HEIGHT - 2}" font-size="10">{html.escape(engine.caption())}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


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
    turn's rows first: :meth:`EngineTurn.rows`). ``figures``: the plan's (:class:`PlanFigures`), for the time
    axis, the limit lines and the plan's own ``empty_cache`` calls, in every format, and the rows' bytes: the
    plan's predicted figures of each phase (:meth:`PlanFigures.rows`), the ones its JSON prints."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise InputError(f"--plot {target}: name a .html, .svg or .png file")
    if suffix == ".png":
        data = png_bytes(timeline, title, engine, figures)
    else:
        svg = memory_svg(timeline, title, engine, figures)
        text = svg if suffix == ".svg" else (
            f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><body>{svg}</body>"
        )  # fmt: skip
        data = text.encode()
    rows = (engine.rows() if engine is not None else []) + (
        figures.rows(timeline) if figures is not None else phase_rows(timeline)
    )
    return write_bytes_atomic(target, data, force=force), rows
