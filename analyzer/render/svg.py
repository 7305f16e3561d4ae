"""Charts as inline SVG: line, vertical bar (grouped or stacked) and horizontal bar charts.

The HTML pages embed these instead of a charting library, so that
``analyzer report --html`` and ``analyzer check --html`` need nothing beyond
the core install and a page works offline without scripts. Each chart is a
``<figure>`` holding one ``<svg>`` with a ``<title>`` (its accessible name),
axes with round-number ticks, a legend, and a ``<title>`` tooltip on every
point and bar giving its exact value. Missing values (None, NaN) are gaps.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Sequence

# Plotly's and matplotlib's default qualitative palette (category10): colour-blind
# distinguishable for the first few series, which is all a chart here has.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
WIDTH, HEIGHT = 960, 380
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50


@dataclass(frozen=True)
class Series:
    """One named series: ``y[i]`` at ``x[i]``; None or NaN is a gap. ``lines``: joined by lines, else markers only."""

    name: str
    x: Sequence[float]
    y: Sequence[float | None]
    lines: bool = True


@dataclass(frozen=True)
class Band:
    """A shaded span of the x axis (warmup or profiled steps), ``x0`` to ``x1``."""

    x0: float
    x1: float
    colour: str
    label: str = ""


@dataclass(frozen=True)
class HLine:
    """A dashed horizontal line at ``y`` with a label (a statistic of a series)."""

    y: float
    colour: str
    label: str


@dataclass(frozen=True)
class Bars:
    """One bar series over the categories of a bar chart: ``values[i]`` for ``categories[i]``."""

    name: str
    values: Sequence[float | None]
    colour: str | None = None
    hover: Sequence[str] = field(default_factory=tuple)


def _finite(v: float | None) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def _xy(x: float, y: float | None) -> tuple[float, float] | None:
    """A point as floats, or None for a gap (a missing or non-finite coordinate)."""
    return (float(x), float(y)) if y is not None and _finite(y) and _finite(x) else None


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering ``[lo, hi]``: steps of 1, 2 or 5 times a power of ten."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def _tick_text(v: float, integer: bool = False) -> str:
    """An axis label that fits the margin: SI prefixes from 10,000 on (``300M`` for 3e8 bytes)."""
    if integer:
        return f"{v:.0f}"
    for threshold, divisor, prefix in ((1e12, 1e12, "T"), (1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(v) >= threshold:
            return f"{v / divisor:.4g}{prefix}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.6g}"


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


class _Frame:
    """The plot area and the mapping of data to pixels."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, height: int = HEIGHT, left: int = LEFT):
        self.x0, self.x1, self.y0, self.y1 = x0, x1 if x1 > x0 else x0 + 1, y0, y1 if y1 > y0 else y0 + 1
        self.height, self.left = height, left
        self.right_px, self.bottom_px = WIDTH - RIGHT, height - BOTTOM

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right_px - self.left)

    def py(self, y: float) -> float:
        return self.bottom_px - (y - self.y0) / (self.y1 - self.y0) * (self.bottom_px - TOP)


def _svg(title: str, body: list[str], height: int = HEIGHT) -> str:
    return (
        f'<figure class="chart"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" role="img" font-family="system-ui,sans-serif" font-size="12">'
        f"<title>{_esc(title)}</title>"
        f'<text x="{WIDTH / 2:.0f}" y="20" text-anchor="middle" font-size="14">{_esc(title)}</text>'
        + "".join(body)
        + "</svg></figure>"
    )


def _y_axis(f: _Frame, ticks: Sequence[float], title: str) -> list[str]:
    out = []
    for t in ticks:
        y = f.py(t)
        out.append(
            f'<line x1="{f.left}" x2="{f.right_px}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
            f'<text x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end">{_esc(_tick_text(t))}</text>'
        )
    out.append(
        f'<text transform="translate(14,{(TOP + f.bottom_px) / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">{_esc(title)}</text>'
    )
    return out


def _legend(names: Sequence[tuple[str, str]], f: _Frame) -> list[str]:
    out, x = [], float(f.left)
    y = f.height - 10
    for name, colour in names:
        out.append(
            f'<rect x="{x:.0f}" y="{y - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14:.0f}" y="{y}">{_esc(name)}</text>'
        )
        x += 24 + 7.5 * len(name)
    return out


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_title: str,
    y_title: str,
    bands: Sequence[Band] = (),
    hlines: Sequence[HLine] = (),
    integer_x: bool = True,
) -> str:
    """Numeric series over a numeric x axis, as markers joined by lines (:attr:`Series.lines`); "" with no finite point."""
    points = [p for s in series for p in map(_xy, s.x, s.y) if p is not None]
    if not points:
        return ""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points] + [h.y for h in hlines if _finite(h.y)]
    # From zero when the values are near it, so that a small change does not look large.
    yticks = nice_ticks(0.0 if 0 <= min(ys) < 0.25 * max(ys) else min(ys), max(ys))
    xlo, xhi = min(xs + [b.x0 for b in bands]), max(xs + [b.x1 for b in bands])
    pad = 0.5 if integer_x else 0.0
    f = _Frame(xlo - pad, xhi + pad, yticks[0], yticks[-1])
    body = _y_axis(f, yticks, y_title)
    for b in bands:
        x0, x1 = f.px(max(b.x0, f.x0)), f.px(min(b.x1, f.x1))
        body.append(
            f'<rect x="{x0:.1f}" y="{TOP}" width="{max(0.0, x1 - x0):.1f}" height="{f.bottom_px - TOP}" '
            f'fill="{b.colour}" fill-opacity="0.18"><title>{_esc(b.label)}</title></rect>'
        )
    xticks = [t for t in nice_ticks(xlo, xhi, 10) if xlo - pad <= t <= xhi + pad and (not integer_x or t == int(t))]
    for t in xticks:
        body.append(
            f'<text x="{f.px(t):.1f}" y="{f.bottom_px + 16}" text-anchor="middle">'
            f"{_esc(_tick_text(t, integer_x))}</text>"
        )
    body.append(
        f'<line x1="{f.left}" x2="{f.right_px}" y1="{f.bottom_px}" y2="{f.bottom_px}" stroke="#888"/>'
        f'<text x="{(f.left + f.right_px) / 2:.0f}" y="{f.bottom_px + 32}" text-anchor="middle">'
        f"{_esc(x_title)}</text>"
    )
    for h in hlines:
        if _finite(h.y):
            y = f.py(h.y)
            body.append(
                f'<line x1="{f.left}" x2="{f.right_px}" y1="{y:.1f}" y2="{y:.1f}" stroke="{h.colour}" '
                f'stroke-dasharray="6 4"/><text x="{f.left + 4}" y="{y - 4:.1f}" fill="{h.colour}">'
                f"{_esc(h.label)}</text>"
            )
    legend = []
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        legend.append((s.name, colour))
        run: list[str] = []
        segments: list[list[str]] = [run]
        dots = []
        for point in map(_xy, s.x, s.y):
            if point is None:
                run = []
                segments.append(run)
                continue
            x, y = point
            px, py = f.px(x), f.py(y)
            run.append(f"{px:.1f},{py:.1f}")
            dots.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{3 if s.lines else 5}" fill="{colour}">'
                f"<title>{_esc(s.name)}: {_esc(_tick_text(x, integer_x))}, {y:.6g}</title></circle>"
            )
        if s.lines:
            body += [
                f'<polyline points="{" ".join(seg)}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
                for seg in segments
                if len(seg) > 1
            ]
        body += dots
    return _svg(title, body + _legend(legend, f))


def bar_chart(
    title: str, categories: Sequence[str], bars: Sequence[Bars], *, y_title: str, stacked: bool = False
) -> str:
    """Vertical bars per category, one colour per series, grouped side by side or stacked; "" with no finite value."""
    values = [[v if _finite(v) else None for v in b.values] for b in bars]
    if not categories or not any(v is not None for vs in values for v in vs):
        return ""
    if stacked:
        top = max(sum(vs[i] or 0.0 for vs in values) for i in range(len(categories)))
        bottom = 0.0
    else:
        top = max(v for vs in values for v in vs if v is not None)
        bottom = min(0.0, min(v for vs in values for v in vs if v is not None))
    yticks = nice_ticks(bottom, top)
    f = _Frame(0, len(categories), yticks[0], yticks[-1])
    body = _y_axis(f, yticks, y_title)
    slot = (f.right_px - f.left) / len(categories)
    width = slot * 0.7 / (1 if stacked else len(bars))
    for i, cat in enumerate(categories):
        cx = f.left + slot * (i + 0.5)
        body.append(f'<text x="{cx:.1f}" y="{f.bottom_px + 16}" text-anchor="middle">{_esc(cat)}</text>')
        base = 0.0
        for j, (b, vs) in enumerate(zip(bars, values)):
            v = vs[i]
            if v is None:
                continue
            colour = b.colour or PALETTE[j % len(PALETTE)]
            lo, hi = (base, base + v) if stacked else (min(0.0, v), max(0.0, v))
            x = cx - slot * 0.35 + (0 if stacked else j * width)
            y0, y1 = f.py(hi), f.py(lo)
            tip = b.hover[i] if i < len(b.hover) else f"{b.name}, {cat}: {v:.6g}"
            body.append(
                f'<rect x="{x:.1f}" y="{y0:.1f}" width="{width:.1f}" height="{max(0.0, y1 - y0):.1f}" '
                f'fill="{colour}"><title>{_esc(tip)}</title></rect>'
            )
            if stacked:
                base += v
    body.append(f'<line x1="{f.left}" x2="{f.right_px}" y1="{f.py(0.0):.1f}" y2="{f.py(0.0):.1f}" stroke="#888"/>')
    legend = [(b.name, b.colour or PALETTE[j % len(PALETTE)]) for j, b in enumerate(bars)]
    return _svg(title, body + _legend(legend, f))


def hbar_chart(
    title: str, labels: Sequence[str], values: Sequence[float], *, x_title: str, hover: Sequence[str] = ()
) -> str:
    """One horizontal bar per label, top to bottom in the order given; "" with no finite value."""
    if not labels or not any(_finite(v) for v in values):
        return ""
    row = 22
    height = TOP + BOTTOM + row * len(labels)
    left = 420  # long kernel names: the labels get the left part of the chart
    xticks = nice_ticks(0.0, max(float(v) for v in values if _finite(v)))
    f = _Frame(xticks[0], xticks[-1], 0, 1, height=height, left=left)
    body = []
    for t in xticks:
        x = f.px(t)
        body.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{f.bottom_px}" stroke="#e5e5e5"/>'
            f'<text x="{x:.1f}" y="{f.bottom_px + 16}" text-anchor="middle">{_esc(_tick_text(t))}</text>'
        )
    body.append(
        f'<text x="{(left + f.right_px) / 2:.0f}" y="{f.bottom_px + 32}" text-anchor="middle">{_esc(x_title)}</text>'
    )
    for i, (label, v) in enumerate(zip(labels, values)):
        y = TOP + i * row
        tip = hover[i] if i < len(hover) else label
        body.append(f'<text x="{left - 6}" y="{y + row * 0.65:.1f}" text-anchor="end">{_esc(label)}</text>')
        if _finite(v):
            body.append(
                f'<rect x="{left}" y="{y + 3}" width="{max(0.0, f.px(float(v)) - left):.1f}" '
                f'height="{row - 6}" fill="{PALETTE[0]}"><title>{_esc(tip)}: {float(v):.6g}</title></rect>'
            )
    return _svg(title, body, height=height)
