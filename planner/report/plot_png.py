"""The memory picture as a PNG, drawn by matplotlib from the same layout as the SVG (:func:`picture_layout`).

matplotlib is the optional ``plot`` extra (``pip install 'memplan[plot]'``); it is imported only here, only when a
``.png`` is asked for, and its absence is one line naming what to install. The figure is built without pyplot (no
global state, no GUI backend): :func:`memory_figure` returns it, :func:`png_bytes` renders it. Each drawn element
carries a ``gid`` (``phase:NAME``, ``usable``, ``spread``, ``empty_cache``) so that a reader of the figure, a
test, can tell them apart.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from planner.report.plot_layout import PHASE_COLOURS, EngineTurn, PlanFigures, picture_layout
from search import StepTimeline
from store.errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure  # type: ignore[import-not-found, unused-ignore]

GIB = 2**30
LABEL_SHARE = 0.04  # a phase band narrower than this share of the step goes unnamed


def _new_figure(width_in: float, height_in: float) -> Figure:
    """An empty figure of this size in inches (built here, not returned as a class: without matplotlib installed the
    class is ``Any`` to a type checker, and ``type[Any]`` returned from a typed function is an error under strict)."""
    try:
        from matplotlib.figure import Figure  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise InputError("a .png needs matplotlib (pip install 'memplan[plot]'); .html or .svg need nothing") from None
    return Figure(figsize=(width_in, height_in))


def memory_figure(
    timeline: StepTimeline, title: str, engine: EngineTurn | None = None, figures: PlanFigures | None = None
) -> Figure:
    """The picture as a matplotlib figure: allocated (line) and reserved (filled) GiB over the step, a band per
    phase run, the usable-memory and peak reserved + spread lines and the marked ``empty_cache`` calls (with the
    plan's ``figures``, x in predicted seconds); with ``engine``, the rollout engine's turn as two stacked bars
    on a panel of its own sharing the GiB axis."""
    layout = picture_layout(timeline, engine, figures)
    fig = _new_figure(12 if engine is not None else 10, 4)
    if engine is None:
        ax = fig.subplots()
        ax.set_ylabel("GiB")
    else:
        side, ax = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [1, 4]})
        for k, (_, stack) in enumerate(engine.bars()):
            base = 0.0
            for part, size, colour in stack:
                side.bar(k, size / GIB, bottom=base, color=colour, edgecolor="#555", label=part if k == 0 else None)
                base += size / GIB
        side.set_xticks([0, 1], [label for label, _ in engine.bars()], fontsize=7)
        side.set_title(f"{engine.engine} {engine.where}", fontsize=9)
        side.set_ylabel("GiB")
    span = (layout.x1 - layout.x0) or 1.0
    for k, name in enumerate(layout.phases):
        left, right = layout.bounds[k], layout.bounds[k + 1]
        ax.axvspan(left, right, color=PHASE_COLOURS[k % len(PHASE_COLOURS)], gid=f"phase:{name}")
        if (right - left) / span > LABEL_SHARE:
            ax.text(left, layout.top / GIB * 0.97, f" {name}", fontsize=7, va="top")
    ax.fill_between(layout.xs, [r / GIB for r in layout.reserved], color="#f4a582", alpha=0.6, label="reserved")
    ax.plot(layout.xs, [a / GIB for a in layout.allocated], color="#2166ac", linewidth=1, label="allocated")
    for limit in layout.limits:
        label = f"{limit.label}: {limit.size_bytes / GIB:.2f} GiB"
        ax.axhline(limit.size_bytes / GIB, color=limit.colour, linewidth=1.2, label=label, gid=limit.kind)
    for k, t in enumerate(layout.calls):
        mark = ax.axvline(t, color="#b2182b", linestyle="--", linewidth=0.8, gid="empty_cache")
        if k == 0:
            mark.set_label("empty_cache()")
    ax.set_xlim(layout.x0, layout.x1)
    ax.set_ylim(0, layout.top / GIB)
    ax.set_xlabel(layout.axis)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=7)
    return fig


def png_bytes(
    timeline: StepTimeline, title: str, engine: EngineTurn | None = None, figures: PlanFigures | None = None
) -> bytes:
    """:func:`memory_figure` rendered as PNG bytes; InputError (one line) where matplotlib is not installed."""
    fig = memory_figure(timeline, title, engine, figures)
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=120, bbox_inches="tight")
    return out.getvalue()
