"""Draws a Grafana dashboard's panels as one SVG picture, from series already fetched.

Docs/operations.md shows the dashboard (deploy/monitoring/dashboard.json) as it
looked in a real run, and no Grafana or browser runs here. This module is the pure part: given
the dashboard's JSON and, per panel title, the series its queries returned (label and points),
it lays the panels out on Grafana's grid (24 columns, ``gridPos`` in grid units), writes each
title, draws ``timeseries`` panels as line plots with axes and a legend, ``stat`` panels as
their last values over a sparkline, and ``row`` panels as section headings. A panel with no
series says "No data", as Grafana does. tests/harness/dashboard_picture.py feeds it from a real
Prometheus; tests/unit/test_dashboard_svg.py checks its output.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

COLUMN_PX = 50  # one of Grafana's 24 grid columns
ROW_PX = 30  # one grid row, Grafana's height unit
GAP_PX = 6
MARGIN_PX = 12
HEADER_PX = 34  # the dashboard's title
PALETTE = ("#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#f2495c", "#b877d9", "#8ab8ff",
           "#ffb357", "#96d98d", "#ca95e5")
BACKGROUND = "#111217"
PANEL_FILL = "#181b1f"
PANEL_EDGE = "#2c3235"
TEXT = "#ccccdc"
FAINT = "#8e8e9e"
FONT = "font-family=\"Inter, Helvetica, Arial, sans-serif\""


@dataclass(frozen=True)
class Series:
    """One line: its legend label and its (Unix time, value) points, finite values only."""

    label: str
    points: tuple[tuple[float, float], ...]


def legend(template: str, metric: Mapping[str, str]) -> str:
    """Grafana's ``legendFormat``: each ``{{label}}`` replaced by the series' label value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), template)


def points(values: Sequence[Sequence[Any]]) -> tuple[tuple[float, float], ...]:
    """Prometheus' ``[time, "value"]`` pairs as floats, NaN and infinities left out."""
    out = []
    for stamp, text in values:
        value = float(text)
        if math.isfinite(value):
            out.append((float(stamp), value))
    return tuple(out)


def format_value(value: float, unit: str) -> str:
    """A value as the panel's unit shows it (Grafana's ``short``, ``s`` and ``percentunit``)."""
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "s":
        if value == 0:
            return "0 s"
        return f"{value * 1000:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    if abs(value) >= 1000:
        return f"{value / 1000:.3g}K"
    return f"{value:.3g}"


def render(dashboard: Mapping[str, Any], data: Mapping[str, Sequence[Series]],
           start: float, end: float) -> str:
    """The whole dashboard as an SVG document; ``data`` maps panel titles to their series."""
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width = 24 * COLUMN_PX + 2 * MARGIN_PX
    height = HEADER_PX + rows * ROW_PX + 2 * MARGIN_PX
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" {FONT} font-size="11">',
        f'<rect width="{width}" height="{height}" fill="{BACKGROUND}"/>',
        _text(MARGIN_PX, MARGIN_PX + 16, dashboard.get("title", ""), size=16, weight="bold"),
        _text(width - MARGIN_PX, MARGIN_PX + 16,
              f"{when}, {end - start:.0f} s shown", anchor="end", fill=FAINT),
    ]
    for panel in panels:
        grid = panel["gridPos"]
        x = MARGIN_PX + grid["x"] * COLUMN_PX + GAP_PX / 2
        y = MARGIN_PX + HEADER_PX + grid["y"] * ROW_PX + GAP_PX / 2
        w = grid["w"] * COLUMN_PX - GAP_PX
        h = grid["h"] * ROW_PX - GAP_PX
        if panel["type"] == "row":
            heading = _text(x, y + 17, panel["title"], size=13, weight="bold")
            parts.append(f'<g class="row">{heading}</g>')
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        series = list(data.get(panel["title"], ()))
        parts.append(f'<g class="panel" data-title={quoteattr(panel["title"])}>')
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="3" '
                     f'fill="{PANEL_FILL}" stroke="{PANEL_EDGE}"/>')
        parts.append(_text(x + 8, y + 16, panel["title"], size=12, weight="bold",
                           css="panel-title"))
        body = (x + 8, y + 24, w - 16, h - 30)
        if not any(s.points for s in series):
            parts.append(_text(x + w / 2, y + h / 2 + 8, "No data", size=14, anchor="middle",
                               fill=FAINT))
        elif panel["type"] == "stat":
            parts.extend(_stat(body, series, unit, start, end))
        else:
            parts.extend(_timeseries(body, series, unit, start, end))
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _text(x: float, y: float, content: str, *, size: int = 11, anchor: str = "start",
          fill: str = TEXT, weight: str = "normal", css: str = "") -> str:
    klass = f' class="{css}"' if css else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{fill}" font-weight="{weight}"{klass}>{escape(content)}</text>')


def _line(series: Series, box: tuple[float, float, float, float], start: float, end: float,
          low: float, high: float, colour: str, stroke: float) -> list[str]:
    """Polylines for one series, broken where a gap of more than 3 s has no points."""
    x0, y0, w, h = box
    span = max(end - start, 1e-9)
    rise = max(high - low, 1e-9)
    runs: list[list[str]] = [[]]
    previous: float | None = None
    for stamp, value in series.points:
        if previous is not None and stamp - previous > 3:
            runs.append([])
        previous = stamp
        px = x0 + (stamp - start) / span * w
        py = y0 + h - (value - low) / rise * h
        runs[-1].append(f"{px:.1f},{py:.1f}")
    return [f'<polyline points="{" ".join(run)}" fill="none" stroke="{colour}" '
            f'stroke-width="{stroke}" stroke-linejoin="round"/>' for run in runs if run]


def _range(series: Sequence[Series]) -> tuple[float, float]:
    values = [v for s in series for _, v in s.points]
    low, high = min(0.0, min(values)), max(values)
    if high <= low:
        high = low + 1
    return low, high * 1.1 if high > 0 else high


def _timeseries(box: tuple[float, float, float, float], series: Sequence[Series], unit: str,
                start: float, end: float) -> list[str]:
    x0, y0, w, h = box
    legend_rows = _legend_layout(series, w)
    axis_w, axis_h = 52.0, 16.0
    plot = (x0 + axis_w, y0 + 4, w - axis_w, h - axis_h - 4 - 16 * len(legend_rows))
    px, py, pw, ph = plot
    low, high = _range(series)
    out = []
    for i in range(5):
        value = low + (high - low) * i / 4
        gy = py + ph - ph * i / 4
        out.append(f'<line x1="{px:.1f}" y1="{gy:.1f}" x2="{px + pw:.1f}" y2="{gy:.1f}" '
                   f'stroke="{PANEL_EDGE}"/>')
        out.append(_text(px - 4, gy + 4, format_value(value, unit), anchor="end", fill=FAINT))
    for i in range(5):
        stamp = start + (end - start) * i / 4
        gx = px + pw * i / 4
        out.append(_text(gx, py + ph + 13, time.strftime("%H:%M:%S", time.gmtime(stamp)),
                         anchor="middle" if 0 < i < 4 else ("start" if i == 0 else "end"),
                         fill=FAINT))
    for index, one in enumerate(series):
        out.extend(_line(one, plot, start, end, low, high, PALETTE[index % len(PALETTE)], 1.6))
    ly = py + ph + axis_h + 12
    for row in legend_rows:
        for lx, index in row:
            colour = PALETTE[index % len(PALETTE)]
            out.append(f'<rect x="{x0 + lx:.1f}" y="{ly - 4:.1f}" width="14" height="3" '
                       f'fill="{colour}"/>')
            out.append(_text(x0 + lx + 18, ly, series[index].label, css="legend"))
        ly += 16
    return out


def _legend_layout(series: Sequence[Series], width: float) -> list[list[tuple[float, int]]]:
    """Legend entries placed left to right, wrapping; each entry is (x offset, series index)."""
    rows: list[list[tuple[float, int]]] = [[]]
    x = 0.0
    for index, one in enumerate(series):
        size = 18 + 6.2 * len(one.label) + 14
        if rows[-1] and x + size > width:
            rows.append([])
            x = 0.0
        rows[-1].append((x, index))
        x += size
    return rows


def _stat(box: tuple[float, float, float, float], series: Sequence[Series], unit: str,
          start: float, end: float) -> list[str]:
    x0, y0, w, h = box
    low, high = _range(series)
    out = []
    for index, one in enumerate(series):
        out.extend(_line(one, (x0, y0 + h * 0.45, w, h * 0.55), start, end, low, high,
                         PALETTE[index % len(PALETTE)], 1.2))
    shown = [s for s in series if s.points]
    cell = w / len(shown)
    for index, one in enumerate(shown):
        cx = x0 + cell * (index + 0.5)
        colour = PALETTE[series.index(one) % len(PALETTE)]
        out.append(_text(cx, y0 + h * 0.48, format_value(one.points[-1][1], unit), size=28,
                         anchor="middle", fill=colour, weight="bold"))
        out.append(_text(cx, y0 + h * 0.48 + 15, one.label, anchor="middle", fill=FAINT,
                         css="legend"))
    return out
