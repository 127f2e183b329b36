"""A picture of one step's memory from the allocator replay: allocated and reserved bytes, phase by phase.

``planner explain PLAN_ID --plot FILE`` draws what :func:`search.replay_timeline` gives: the measured step's
allocated and reserved bytes event by event, a band per phase and a mark at every ``empty_cache`` call.
``.html`` and ``.svg`` need nothing beyond the standard library (an inline SVG); ``.png`` uses matplotlib
where it is installed (``pip install matplotlib``) and says so where it is not.
"""

from __future__ import annotations

import html
from pathlib import Path

from planner.files.atomic import write_bytes_atomic
from search.step.replayed import StepTimeline
from store.errors import InputError

WIDTH, HEIGHT, PAD = 960, 360, 48
PHASE_COLOURS = ("#eef3fb", "#fbf3e9", "#eefaf0", "#f7eef9", "#fbfbe9", "#e9f8fb")
PLOT_SUFFIXES = (".html", ".svg", ".png")


def _series(timeline: StepTimeline) -> tuple[list[int], list[int], list[int]]:
    xs = [i for i, _, _ in timeline.samples]
    allocated = [a + timeline.outside for _, a, _ in timeline.samples]
    reserved = [r + timeline.outside for _, _, r in timeline.samples]
    return xs, allocated, reserved


def phase_rows(timeline: StepTimeline) -> list[tuple[str, int, int]]:
    """(phase, peak allocated, peak reserved) of each phase run of the drawn step: the picture as a table."""
    bounds = [i for i, _ in timeline.phases] + [timeline.samples[-1][0] + 1]
    rows = []
    for k, (start, name) in enumerate(timeline.phases):
        inside = [(a, r) for i, a, r in timeline.samples if start <= i < bounds[k + 1]] or [(0, 0)]
        rows.append((name, max(a for a, _ in inside) + timeline.outside, max(r for _, r in inside) + timeline.outside))
    return rows


def memory_svg(timeline: StepTimeline, title: str) -> str:
    """An SVG of allocated (line) and reserved (filled) GiB over the step's events, with phase bands."""
    xs, allocated, reserved = _series(timeline)
    x0, x1 = xs[0], max(xs[-1], xs[0] + 1)
    top = max(reserved) * 1.08 or 1

    def x(i: int) -> float:
        return PAD + (WIDTH - 2 * PAD) * (i - x0) / (x1 - x0)

    def y(b: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * b / top

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif">']
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
    parts.append(f'<text x="{PAD}" y="{HEIGHT - 14}" font-size="10">allocator events of one step · blue: '
                 'allocated · orange: reserved · red dashes: empty_cache()</text>')  # fmt: skip
    parts.append("</svg>")
    return "\n".join(parts)


def _png(timeline: StepTimeline, title: str) -> bytes:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("a .png needs matplotlib (pip install matplotlib); .html or .svg need nothing") from None
    import io

    xs, allocated, reserved = _series(timeline)
    fig, ax = plt.subplots(figsize=(10, 4))
    bounds = [i for i, _ in timeline.phases] + [xs[-1]]
    for k, (start, name) in enumerate(timeline.phases):
        ax.axvspan(start, bounds[k + 1], color=PHASE_COLOURS[k % len(PHASE_COLOURS)])
        ax.text(start, max(reserved) / 2**30 * 1.02, name, fontsize=7)
    ax.fill_between(xs, [r / 2**30 for r in reserved], color="#f4a582", alpha=0.6, label="reserved")
    ax.plot(xs, [a / 2**30 for a in allocated], color="#2166ac", linewidth=1, label="allocated")
    for i in timeline.empty_cache:
        ax.axvline(i, color="#b2182b", linestyle="--", linewidth=0.8)
    ax.set_xlabel("allocator events of one step")
    ax.set_ylabel("GiB")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right")
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out.getvalue()


def write_memory_plot(
    timeline: StepTimeline, path: str | Path, title: str, *, force: bool = False
) -> tuple[Path, list[tuple[str, int, int]]]:
    """Write the picture to ``path`` (its suffix picks the format), atomically; an existing file only with
    ``force``. Returns the file and the picture as rows (:func:`phase_rows`)."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise InputError(f"--plot {target}: name a .html, .svg or .png file")
    if suffix == ".png":
        data = _png(timeline, title)
    else:
        svg = memory_svg(timeline, title)
        text = svg if suffix == ".svg" else (
            f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><body>{svg}</body>"
        )  # fmt: skip
        data = text.encode()
    return write_bytes_atomic(target, data, force=force), phase_rows(timeline)
