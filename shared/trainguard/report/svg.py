"""Small inline-SVG plots for the report: line plots, histograms, a phase bar.

No plotting library and no JavaScript: each function returns an ``<svg>`` element as text,
with axes, "nice" ticks and a legend, that renders the same in any browser or HTML viewer.
Long series are reduced to at most :data:`MAX_POINTS` points per line, keeping each bucket's
minimum and maximum so that spikes survive.

A line plot can clip its y axis to the bulk of the data (``clip=True``): one diverged loss of
2.6e7 would otherwise flatten every other value into a line at zero. What is clipped is never
hidden: each clipped point is a red triangle on the plot's edge, and a note in the plot says
how many values lie beyond the axis and the most extreme one. ``markers`` draw labelled
vertical lines (e.g. the step where a loss first became non-finite).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

import numpy as np

MAX_POINTS = 1600
Values = Sequence[float] | np.ndarray[Any, Any]
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
    "#d62728",
)
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


@dataclass(frozen=True)
class Series:
    label: str
    xs: Values
    ys: Values
    color: str | None = None


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks: list[float] = []
    value = start
    while value <= hi + step * 1e-9 and len(ticks) < 50:
        ticks.append(round(value, 12))
        value += step
    return ticks


def fmt_tick(value: float) -> str:
    if value == 0:
        return "0"
    a = abs(value)
    if a >= 1e12:
        return f"{value:.3g}".replace("e+", "e")
    if a >= 1e9:
        return f"{value / 1e9:g}G"
    if a >= 1e6:
        return f"{value / 1e6:g}M"
    if a >= 1e4:
        return f"{value / 1e3:g}k"
    if a >= 1:
        return f"{value:.4g}"
    return f"{value:.3g}"


def reduce_points(xs: Values, ys: Values, limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``limit`` points: per bucket, the min and the max in x order."""
    points = [
        (float(x), float(y)) for x, y in zip(xs, ys, strict=False) if math.isfinite(x) and math.isfinite(y)
    ]
    if len(points) <= limit:
        return points
    buckets = limit // 2
    size = len(points) / buckets
    out: list[tuple[float, float]] = []
    for b in range(buckets):
        chunk = points[int(b * size) : int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out


#: a value is clipped when it lies more than this many times the extent of the values kept
#: beyond the nearest kept value: drawn to scale, it would squash them into a sliver
CLIP_GAP = 4.0
#: at least this share of the values is kept on the axis
CLIP_KEEP = 0.25


@dataclass(frozen=True)
class Clip:
    """The y range kept for the bulk of the values, and what fell outside it."""

    lo: float | None
    hi: float | None
    below: int
    above: int
    min_value: float
    max_value: float


def robust_range(values: Sequence[float]) -> Clip | None:
    """A y range without the far outliers, or None when nothing is far out.

    From the most extreme value inwards, a value is far out when its distance to the next
    one is more than :data:`CLIP_GAP` times the extent of the values left (floored at 1 % of
    the median's size, so flat data with one spike clips too); the scan stops at the first
    value that is not. A gap, not a quantile fence: a loss that starts at 2.9 and settles
    at 1.4 for most of the job has a narrow interquartile range, yet its first values are
    data and are drawn to scale; a divergence to 1e5 .. 6e33 is clipped however many steps
    it lasted (down to :data:`CLIP_KEEP` of the values kept).
    """
    ys = np.sort(np.asarray([v for v in values if math.isfinite(v)], dtype=float))
    if ys.size < 4:
        return None
    keep = max(2, math.ceil(CLIP_KEEP * ys.size))
    start, end = 0, ys.size  # the kept values are ys[start:end]
    while end - start > keep:
        rest = _extent(ys[start], ys[end - 2])
        if ys[end - 1] - ys[end - 2] <= CLIP_GAP * rest:
            break
        end -= 1
    while end - start > keep:
        rest = _extent(ys[start + 1], ys[end - 1])
        if ys[start + 1] - ys[start] <= CLIP_GAP * rest:
            break
        start += 1
    above, below = int(ys.size - end), int(start)
    if not below and not above:
        return None
    return Clip(
        lo=float(ys[start]) if below else None,
        hi=float(ys[end - 1]) if above else None,
        below=below,
        above=above,
        min_value=float(ys[0]),
        max_value=float(ys[-1]),
    )


def _extent(lo: float, hi: float) -> float:
    """The extent of kept values, floored at 1 % of their size (flat values have one too)."""
    return max(float(hi - lo), 0.01 * max(abs(float(lo)), abs(float(hi))), 1e-12)


def _frame(width: int, height: int, title: str, body: list[str]) -> str:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" style="{FONT}">'
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>'
    )
    return head + "".join(body) + "</svg>"


def line_plot(
    series: Sequence[Series],
    *,
    title: str = "",
    width: int = 900,
    height: int = 260,
    x_label: str = "",
    y_label: str = "",
    y_min: float | None = None,
    y_max: float | None = None,
    x_min: float | None = None,
    step_lines: bool = False,
    clip: bool = False,
    markers: Sequence[tuple[float, str]] = (),
    x_max: float | None = None,
    shade_from: float | None = None,
) -> str:
    """Lines on shared axes. ``y_min``/``y_max`` fix the range (e.g. 0..100 for percentages).

    ``clip``: fit the y axis to the bulk of the values and mark the rest (see the module
    docstring). ``markers``: ``(x, label)`` vertical dashed lines. ``x_max``: extend the x axis
    (e.g. to steps whose values cannot be drawn); ``shade_from``: tint the plot right of x.
    """
    widths = [26 + 6.5 * len(s.label[:40]) for s in series]
    # the legend goes beside the title when both fit, else on a line of its own
    title_w = 7.5 * len(title) + 24
    legend_row = title_w + sum(widths) > width - 64 - 16
    reduced = [(s, reduce_points(s.xs, s.ys)) for s in series]
    all_x = [x for _, pts in reduced for x, _ in pts]
    all_y = [y for _, pts in reduced for _, y in pts]
    clipped = robust_range(all_y) if clip else None
    # a clip note gets a line of its own under the x axis
    left, right, top, bottom = 64, 16, 44 if legend_row else 28, 58 if clipped is not None else 44
    plot_w, plot_h = width - left - right, height - top - bottom
    body: list[str] = []
    if title:
        body.append(f'<text x="{left}" y="18" font-size="13" font-weight="600">{escape(title)}</text>')
    if not all_x:
        body.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" font-size="13" fill="#666">'
            "no data</text>"
        )
        return _frame(width, height, title, body)
    x0 = min(all_x) if x_min is None else x_min
    x1 = max([*all_x, *(m for m, _ in markers), *([x_max] if x_max is not None else [])])
    if x1 <= x0:
        x1 = x0 + 1
    lo = min(all_y) if y_min is None else y_min
    hi = max(all_y) if y_max is None else y_max
    if clipped is not None:
        if clipped.lo is not None and y_min is None:
            lo = clipped.lo
        if clipped.hi is not None and y_max is None:
            hi = clipped.hi
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    y_ticks = nice_ticks(lo, hi)
    if y_min is None:
        lo = min(lo, y_ticks[0])
    if y_max is None:
        hi = max(hi, y_ticks[-1])

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (min(max(y, lo), hi) - lo) / (hi - lo) * plot_h

    for t in y_ticks:
        if lo <= t <= hi:
            y = sy(t)
            body.append(
                f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#e5e5e5"/>'
            )
            body.append(
                f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{fmt_tick(t)}</text>'
            )
    for t in nice_ticks(x0, x1, 6):
        if x0 <= t <= x1:
            x = sx(t)
            body.append(
                f'<line x1="{x:.1f}" y1="{top + plot_h}" x2="{x:.1f}" y2="{top + plot_h + 4}" stroke="#333"/>'
            )
            body.append(
                f'<text x="{x:.1f}" y="{top + plot_h + 16}" font-size="11" text-anchor="middle">'
                f"{fmt_tick(t)}</text>"
            )
    body.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#333" stroke-width="1"/>'
    )
    if x_label:
        body.append(
            f'<text x="{left + plot_w / 2}" y="{top + plot_h + 30}" font-size="11" text-anchor="middle">'
            f"{escape(x_label)}</text>"
        )
    if y_label:
        body.append(
            f'<text x="14" y="{top + plot_h / 2}" font-size="11" text-anchor="middle" '
            f'transform="rotate(-90 14 {top + plot_h / 2})">{escape(y_label)}</text>'
        )
    legend_x = max(left + (0.0 if legend_row else title_w), left + plot_w - sum(widths))
    legend_y = 26 if legend_row else 8
    if shade_from is not None and x0 <= shade_from <= x1:
        sx0 = sx(shade_from)
        body.append(
            f'<rect x="{sx0:.1f}" y="{top}" width="{max(0.0, left + plot_w - sx0):.1f}" height="{plot_h}" '
            'fill="#d62728" fill-opacity="0.08"/>'
        )
    for x, label in markers:
        if x0 <= x <= x1:
            mx = sx(x)
            body.append(
                f'<line x1="{mx:.1f}" y1="{top}" x2="{mx:.1f}" y2="{top + plot_h}" stroke="#d62728" '
                'stroke-width="1.5" stroke-dasharray="5 3"/>'
            )
            room = left + plot_w - mx > 6.5 * len(label) + 8  # right of the line, if it fits
            anchor, dx = ("start", 4) if room else ("end", -4)
            body.append(
                f'<text x="{mx + dx:.1f}" y="{top + 24}" font-size="11" fill="#d62728" '
                f'text-anchor="{anchor}">{escape(label)}</text>'
            )
    for i, (s, pts) in enumerate(reduced):
        color = s.color or PALETTE[i % len(PALETTE)]
        if pts:
            if step_lines or len(pts) == 1:
                marks = "".join(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{color}"/>' for x, y in pts[:400]
                )
                body.append(marks)
            if len(pts) > 1:
                path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
                body.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.4" points="{path}"/>')
        label = escape(s.label[:40])
        body.append(f'<rect x="{legend_x:.0f}" y="{legend_y}" width="10" height="10" fill="{color}"/>')
        body.append(f'<text x="{legend_x + 14:.0f}" y="{legend_y + 9}" font-size="11">{label}</text>')
        legend_x += widths[i]
        if clipped is not None and pts:
            body += _clip_marks(pts, sx, lo, hi, top, plot_h)
    if clipped is not None:
        # what the note counts is what lies beyond the axis as drawn (its ticks may reach past
        # the clipped range): every value counted has its triangle
        above, below = sum(1 for y in all_y if y > hi), sum(1 for y in all_y if y < lo)
        notes = []
        if above:
            notes.append(
                f"▲ {above} value{'s' if above > 1 else ''} above {fmt_tick(hi)} "
                f"not to scale (max {fmt_tick(clipped.max_value)})"
            )
        if below:
            notes.append(
                f"▼ {below} value{'s' if below > 1 else ''} below {fmt_tick(lo)} "
                f"not to scale (min {fmt_tick(clipped.min_value)})"
            )
        note = escape("; ".join(notes))
        body.append(f'<text x="{left}" y="{height - 6}" font-size="11" fill="#d62728">{note}</text>')
    return _frame(width, height, title, body)


def _clip_marks(
    points: list[tuple[float, float]], sx: Any, lo: float, hi: float, top: float, plot_h: float
) -> list[str]:
    """Red triangles on the edge where a point lies beyond the clipped axis."""
    marks = []
    for x, y in points:
        if y > hi:
            px, py = sx(x), top + 1
            marks.append(f"{px - 4:.1f},{py + 7:.1f} {px + 4:.1f},{py + 7:.1f} {px:.1f},{py:.1f}")
        elif y < lo:
            px, py = sx(x), top + plot_h - 1
            marks.append(f"{px - 4:.1f},{py - 7:.1f} {px + 4:.1f},{py - 7:.1f} {px:.1f},{py:.1f}")
        if len(marks) >= 400:
            break
    return [f'<polygon points="{m}" fill="#d62728"><title>not to scale</title></polygon>' for m in marks]


def histogram_plot(
    edges: Sequence[float],
    counts: Sequence[int],
    *,
    title: str = "",
    width: int = 900,
    height: int = 240,
    x_label: str = "",
    highlight_from: float | None = None,
    overflow: int = 0,
) -> str:
    """Bars for a histogram (``len(edges) == len(counts) + 1``); bars right of ``highlight_from`` in red.

    ``overflow`` values above the last edge are drawn as one extra red bar labelled "> last edge".
    """
    left, right, top, bottom = 64, 16, 28, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    body: list[str] = []
    if title:
        body.append(f'<text x="{left}" y="18" font-size="13" font-weight="600">{escape(title)}</text>')
    if not counts or len(edges) != len(counts) + 1:
        body.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" font-size="13" fill="#666">'
            "no data</text>"
        )
        return _frame(width, height, title, body)
    if overflow > 0:
        width_bin = (float(edges[-1]) - float(edges[0])) / max(1, len(counts))
        edges = [*edges, float(edges[-1]) + 2 * width_bin]
        counts = [*counts, overflow]
    x0, x1 = float(edges[0]), float(edges[-1])
    if x1 <= x0:
        x1 = x0 + 1
    top_count = max(max(counts), 1)
    y_ticks = nice_ticks(0, top_count * 1.08, 4)
    y_hi = max(y_ticks[-1], top_count * 1.08)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(c: float) -> float:
        return top + plot_h - c / y_hi * plot_h

    for t in y_ticks:
        body.append(
            f'<line x1="{left}" y1="{sy(t):.1f}" x2="{left + plot_w}" y2="{sy(t):.1f}" stroke="#e5e5e5"/>'
        )
        body.append(
            f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" font-size="11" text-anchor="end">{fmt_tick(t)}</text>'
        )
    for i, c in enumerate(counts):
        if c <= 0:
            continue
        a, b = sx(float(edges[i])), sx(float(edges[i + 1]))
        color = "#d62728" if highlight_from is not None and float(edges[i]) >= highlight_from else "#1f77b4"
        body.append(
            f'<rect x="{a + 0.5:.1f}" y="{sy(c):.1f}" width="{max(1.0, b - a - 1):.1f}" '
            f'height="{top + plot_h - sy(c):.1f}" fill="{color}"><title>{c}</title></rect>'
        )
    tick_hi = float(edges[-2]) if overflow > 0 else x1
    for t in nice_ticks(x0, tick_hi, 6):
        if x0 <= t <= tick_hi:
            body.append(
                f'<text x="{sx(t):.1f}" y="{top + plot_h + 16}" font-size="11" text-anchor="middle">'
                f"{fmt_tick(t)}</text>"
            )
    if highlight_from is not None and x0 <= highlight_from <= x1:
        x = sx(highlight_from)
        body.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#d62728" '
            'stroke-dasharray="4 3"/>'
        )
    if overflow > 0:
        body.append(
            f'<text x="{left + plot_w - 4}" y="{top + 14}" font-size="11" fill="#d62728" text-anchor="end">'
            f"&gt; {fmt_tick(float(edges[-3]))}: {overflow}</text>"
        )
    body.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>')
    if x_label:
        body.append(
            f'<text x="{left + plot_w / 2}" y="{height - 8}" font-size="11" text-anchor="middle">'
            f"{escape(x_label)}</text>"
        )
    return _frame(width, height, title, body)


def phase_bar(phases: Sequence[tuple[str, float, str]], *, width: int = 900, height: int = 56) -> str:
    """One horizontal bar split into labelled phases: ``(label, seconds, color)``."""
    total = sum(max(0.0, s) for _, s, _ in phases)
    body: list[str] = []
    if total <= 0:
        body.append(f'<text x="8" y="{height / 2}" font-size="12" fill="#666">no timing data</text>')
        return _frame(width, height, "phases", body)
    x = 0.0
    for label, seconds, color in phases:
        w = max(0.0, seconds) / total * width
        if w <= 0:
            continue
        body.append(
            f'<rect x="{x:.1f}" y="4" width="{w:.1f}" height="26" fill="{color}">'
            f"<title>{escape(label)}</title></rect>"
        )
        if w > 60:
            body.append(
                f'<text x="{x + w / 2:.1f}" y="22" font-size="11" fill="#fff" text-anchor="middle">'
                f"{escape(label)}</text>"
            )
        x += w
    legend = "   ".join(
        f"{label}: {seconds:.1f} s ({100 * max(0.0, seconds) / total:.0f}%)" for label, seconds, _ in phases
    )
    body.append(f'<text x="0" y="48" font-size="11">{escape(legend)}</text>')
    return _frame(width, height, "phases", body)


def bar_plot(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str = "",
    width: int = 900,
    value_label: str = "",
    color: str = "#1f77b4",
) -> str:
    """Horizontal bars, one per label, top to bottom in the given order (e.g. feature importances)."""
    left, right, top, bottom = 180, 56, 28, 36
    row = 18
    height = top + bottom + row * max(1, len(labels))
    plot_w = width - left - right
    body: list[str] = []
    if title:
        body.append(f'<text x="8" y="18" font-size="13" font-weight="600">{escape(title)}</text>')
    finite = [float(v) for v in values if math.isfinite(v)]
    if not labels or not finite:
        body.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" font-size="13" fill="#666">'
            "no data</text>"
        )
        return _frame(width, height, title, body)
    ticks = nice_ticks(0.0, max(max(finite), 0.0) or 1.0, 5)
    hi = max(ticks[-1], max(finite)) or 1.0
    for t in ticks:
        x = left + max(t, 0.0) / hi * plot_w
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="#e5e5e5"/>')
        body.append(
            f'<text x="{x:.1f}" y="{height - bottom + 14}" font-size="11" text-anchor="middle">'
            f"{fmt_tick(t)}</text>"
        )
    for i, (label, value) in enumerate(zip(labels, values, strict=False)):
        y = top + i * row
        v = float(value) if math.isfinite(value) else 0.0
        w = max(0.0, v) / hi * plot_w
        name = escape(label if len(label) <= 28 else label[:27] + "…")
        body.append(f'<text x="{left - 6}" y="{y + row - 5}" font-size="11" text-anchor="end">{name}</text>')
        body.append(
            f'<rect x="{left}" y="{y + 2}" width="{w:.1f}" height="{row - 4}" fill="{color}">'
            f"<title>{escape(label)}: {v:.4g}</title></rect>"
        )
        body.append(f'<text x="{left + w + 4:.1f}" y="{y + row - 5}" font-size="11">{v:.3g}</text>')
    body.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#333"/>')
    if value_label:
        body.append(
            f'<text x="{left + plot_w / 2}" y="{height - 6}" font-size="11" text-anchor="middle">'
            f"{escape(value_label)}</text>"
        )
    return _frame(width, height, title, body)
