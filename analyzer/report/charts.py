"""Inline SVG charts for report.html: drawn here, so the report needs no script to show them.

Every mark carries a <title> (the browser's tooltip) with its exact values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

CATEGORY_COLORS: dict[str, str] = {
    "host (held back)": "#d62728",
    "cpu_op": "#4e79a7",
    "gpu_compute": "#2a4d6e",
    "gpu_memory": "#76b7b2",
    "python": "#b07aa1",
    "dataloader": "#edc948",
    "gc": "#9c755f",
    "cuda_runtime": "#ff9da7",
    "communication": "#f28e2b",
    "idle": "#d9d9d9",
    "annotation": "#bab0ac",
    "other": "#bab0ac",
    # Collectives split across ranks (report: "Collectives: waiting vs transfer").
    "transfer": "#59a14f",
    "waiting for the last rank": "#e15759",
}
FALLBACK_COLOR = "#8c8c8c"
NORMAL = "#4e79a7"
CULPRIT = "#d62728"
MISSING = "#bdbdbd"
STUCK = "#7b3294"
FONT = 12


def _attrs(**kw: object) -> str:
    return " ".join(f'{k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in kw.items())


def _nice_max(value: float) -> float:
    """The smallest 4 × (1, 2, 2.5 or 5 × 10^k) covering value: round tick labels."""
    if value <= 0:
        return 4.0
    tick = value / 4
    exp = 10.0 ** math.floor(math.log10(tick))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * exp >= tick:
            return 4 * m * exp
    return 40 * exp


def _y_axis(x: float, top: float, height: float, vmax: float, unit: str, width: float) -> str:
    parts = []
    for i in range(5):
        v = vmax * i / 4
        y = top + height - height * i / 4
        parts.append(
            f"<line {_attrs(x1=x, x2=x + width, y1=y, y2=y, stroke='#e5e5e5')}/>"
            f"<text {_attrs(x=x - 6, y=y + 4, text_anchor='end', font_size=FONT - 1, fill='#555')}>"
            f"{v:g}{escape(unit)}</text>"
        )
    return "".join(parts)


@dataclass(frozen=True)
class _Bars:
    """The layout of a chart with one bar per rank: the plot area, its scale, the bars' slots."""

    width: float
    height: float
    left: float
    top: float
    plot_w: float
    plot_h: float
    vmax: float
    slot: float
    bar_w: float
    label_every: int
    """Every how many bars a label is written below (40 labels at most)."""

    @classmethod
    def layout(cls, count: int, peak: float, *, height: float, top: float, bottom: float) -> _Bars:
        """`count` bars, the tallest `peak` (with its headroom): the y axis ends at the round
        value above it."""
        width, left = 1100.0, 60.0
        plot_w = width - left - 10
        n = max(count, 1)
        slot = plot_w / n
        return cls(
            width=width,
            height=height,
            left=left,
            top=top,
            plot_w=plot_w,
            plot_h=height - top - bottom,
            vmax=_nice_max(peak),
            slot=slot,
            bar_w=max(1.0, min(60.0, slot * 0.7)),
            label_every=max(1, math.ceil(n / 40)),
        )

    def x(self, i: int) -> float:
        """The left edge of bar `i`, centred in its slot."""
        return self.left + self.slot * i + (self.slot - self.bar_w) / 2

    def opening(self, unit: str) -> list[str]:
        """The <svg> element's start and the y axis."""
        return [
            f'<svg class="chart" role="img" {_attrs(viewBox=f"0 0 {self.width} {self.height}")} '
            f'preserveAspectRatio="xMinYMin meet">',
            _y_axis(self.left, self.top, self.plot_h, self.vmax, unit, self.plot_w),
        ]


@dataclass(frozen=True)
class Bar:
    label: str
    value: float | None
    """None: no value (a missing worker: drawn as a placeholder)."""
    color: str
    tooltip: str
    marker: str = ""
    """Short text drawn above the bar (e.g. 'culprit', 'missing')."""


def bar_chart(bars: list[Bar], *, unit: str, reference: float | None, reference_label: str) -> str:
    values = [b.value for b in bars if b.value is not None]
    chart = _Bars.layout(
        len(bars), max(values, default=1.0) * 1.08, height=260.0, top=24.0, bottom=40.0
    )
    height, left, top = chart.height, chart.left, chart.top
    plot_w, plot_h, vmax, bar_w = chart.plot_w, chart.plot_h, chart.vmax, chart.bar_w
    out = chart.opening(unit)
    for i, bar in enumerate(bars):
        x = chart.x(i)
        if bar.value is None:
            h = plot_h
            out.append(
                f'<rect class="bar missing" {_attrs(x=round(x, 2), y=top, width=round(bar_w, 2), height=plot_h, fill="none", stroke=bar.color, stroke_dasharray="4 3")}>'
                f"<title>{escape(bar.tooltip)}</title></rect>"
            )
        else:
            h = plot_h * bar.value / vmax
            out.append(
                f'<rect class="bar" {_attrs(x=round(x, 2), y=round(top + plot_h - h, 2), width=round(bar_w, 2), height=round(max(h, 0.5), 2), fill=bar.color)}>'
                f"<title>{escape(bar.tooltip)}</title></rect>"
            )
        if bar.marker:
            y = top + plot_h - h - 4 if bar.value is not None else top + plot_h / 2
            out.append(
                f"<text {_attrs(x=round(x + bar_w / 2, 2), y=round(y, 2), text_anchor='middle', font_size=FONT - 1, fill=bar.color, font_weight='bold')}>"
                f"{escape(bar.marker)}</text>"
            )
        if i % chart.label_every == 0:
            out.append(
                f"<text {_attrs(x=round(x + bar_w / 2, 2), y=top + plot_h + 16, text_anchor='middle', font_size=FONT - 1, fill='#333')}>"
                f"{escape(bar.label)}</text>"
            )
    if reference is not None and reference > 0:
        y = top + plot_h - plot_h * reference / vmax
        out.append(
            f"<line {_attrs(x1=left, x2=left + plot_w, y1=round(y, 2), y2=round(y, 2), stroke='#333', stroke_dasharray='6 4')}/>"
            f"<text {_attrs(x=left + plot_w, y=round(y - 5, 2), text_anchor='end', font_size=FONT - 1, fill='#333')}>"
            f"{escape(reference_label)}</text>"
        )
    out.append(
        f"<text {_attrs(x=left + plot_w / 2, y=height - 4, text_anchor='middle', font_size=FONT, fill='#333')}>rank</text>"
    )
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class StackedBar:
    label: str
    segments: list[tuple[str, float]]
    """(category, value) bottom to top."""
    tooltip_prefix: str
    highlight: bool = False


def stacked_bars(bars: list[StackedBar], *, unit: str, categories: list[str]) -> str:
    totals = [sum(v for _, v in b.segments) for b in bars]
    chart = _Bars.layout(
        len(bars), max(totals, default=1.0) * 1.05, height=280.0, top=16.0, bottom=64.0
    )
    height, left, top = chart.height, chart.left, chart.top
    plot_h, vmax, bar_w = chart.plot_h, chart.vmax, chart.bar_w
    out = chart.opening(unit)
    for i, bar in enumerate(bars):
        x = chart.x(i)
        y = top + plot_h
        for category, value in bar.segments:
            if value <= 0:
                continue
            h = plot_h * value / vmax
            y -= h
            tip = f"{bar.tooltip_prefix} · {category}: {value:.2f} {unit.strip()}/step"
            out.append(
                f'<rect class="segment" {_attrs(x=round(x, 2), y=round(y, 2), width=round(bar_w, 2), height=round(h, 2), fill=CATEGORY_COLORS.get(category, FALLBACK_COLOR))}>'
                f"<title>{escape(tip)}</title></rect>"
            )
        if bar.highlight:
            out.append(
                f"<rect {_attrs(x=round(x - 2, 2), y=round(y - 2, 2), width=round(bar_w + 4, 2), height=round(top + plot_h - y + 2, 2), fill='none', stroke=CULPRIT, stroke_width=2)}/>"
            )
        if i % chart.label_every == 0:
            out.append(
                f"<text {_attrs(x=round(x + bar_w / 2, 2), y=top + plot_h + 16, text_anchor='middle', font_size=FONT - 1, fill=CULPRIT if bar.highlight else '#333', font_weight='bold' if bar.highlight else 'normal')}>"
                f"{escape(bar.label)}</text>"
            )
    lx = left
    for category in categories:
        color = CATEGORY_COLORS.get(category, FALLBACK_COLOR)
        out.append(
            f"<rect {_attrs(x=lx, y=height - 22, width=12, height=12, fill=color)}/>"
            f"<text {_attrs(x=lx + 16, y=height - 12, font_size=FONT, fill='#333')}>{escape(category)}</text>"
        )
        lx += 24 + 7.2 * len(category)
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class Cell:
    value: float
    tooltip: str
    flagged: bool = False


def heatmap(
    row_labels: list[str],
    col_labels: list[str],
    cells: list[list[Cell]],
    *,
    flagged_cols: set[int],
) -> str:
    label_w = 380
    width = 1100
    cell_w = min(90.0, (width - label_w - 110) / max(len(col_labels), 1))
    cell_h = 22
    top = 28
    height = top + cell_h * len(row_labels) + 10
    vmax = max((c.value for row in cells for c in row), default=0.0) or 1.0
    out = [
        f'<svg class="heatmap" role="img" {_attrs(viewBox=f"0 0 {width} {max(height, 130)}")} '
        'preserveAspectRatio="xMinYMin meet">'
    ]
    label_every = max(1, math.ceil(24 / cell_w))  # room for a 3-digit rank label
    for j, label in enumerate(col_labels):
        if j % label_every:
            continue
        flagged = j in flagged_cols
        out.append(
            f"<text {_attrs(x=round(label_w + cell_w * j + cell_w / 2, 2), y=top - 8, text_anchor='middle', font_size=FONT - 1, fill=CULPRIT if flagged else '#333', font_weight='bold' if flagged else 'normal')}>"
            f"{escape(label)}</text>"
        )
    for i, label in enumerate(row_labels):
        y = top + cell_h * i
        shown = label if len(label) <= 58 else label[:55] + "…"
        out.append(
            f"<text {_attrs(x=label_w - 8, y=y + cell_h / 2 + 4, text_anchor='end', font_size=FONT - 1, fill='#222')}>"
            f"<title>{escape(label)}</title>{escape(shown)}</text>"
        )
        for j, cell in enumerate(cells[i]):
            x = label_w + cell_w * j
            out.append(
                f'<rect class="cell" {_attrs(x=round(x, 2), y=y, width=round(cell_w - 1, 2), height=cell_h - 1, fill=_blue(cell.value / vmax))}>'
                f"<title>{escape(cell.tooltip)}</title></rect>"
            )
            if cell.flagged:
                out.append(
                    f'<rect class="flag" {_attrs(x=round(x + 1, 2), y=y + 1, width=round(cell_w - 3, 2), height=cell_h - 3, fill="none", stroke=CULPRIT, stroke_width=2)}/>'
                )
    # Color scale legend.
    lx = label_w + cell_w * len(col_labels) + 16
    for s in range(5):
        frac = s / 4
        out.append(
            f"<rect {_attrs(x=round(lx, 2), y=top + 18 * s, width=14, height=16, fill=_blue(frac))}/>"
            f"<text {_attrs(x=round(lx + 20, 2), y=top + 18 * s + 12, font_size=FONT - 1, fill='#333')}>β {vmax * frac:.3f}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _blue(fraction: float) -> str:
    """White → dark blue, on a square-root scale so small β stay visible."""
    f = math.sqrt(min(max(fraction, 0.0), 1.0))
    start, end = (247, 251, 255), (8, 48, 107)
    r, g, b = (round(s + (e - s) * f) for s, e in zip(start, end, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"
