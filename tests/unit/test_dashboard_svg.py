"""The dashboard picture's writer (tests/harness/dashboard_svg.py): given series for the real
dashboard's panels, its output is well-formed SVG with one panel per dashboard panel title, each
series in its panel's legend, and "No data" where a panel got none."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

from tests.harness.dashboard_svg import Series, legend, points, render
from tests.harness.prometheus import DASHBOARD

SVG = "{http://www.w3.org/2000/svg}"
START = 1_700_000_000.0


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _titles(dashboard: dict[str, Any]) -> list[str]:
    return [p["title"] for p in dashboard["panels"] if p["type"] != "row"]


def _panels(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "panel"]
    titles = [g.get("data-title") for g in groups]
    assert len(titles) == len(set(titles)), titles
    return {str(g.get("data-title")): g for g in groups}


def _texts(group: ET.Element, css: str | None = None) -> list[str]:
    return [t.text or "" for t in group.iter(f"{SVG}text") if css is None or t.get("class") == css]


def test_one_panel_per_dashboard_title_with_its_series_or_no_data() -> None:
    dashboard = _dashboard()
    titles = _titles(dashboard)
    ramp = tuple((START + i, float(i % 3)) for i in range(60))
    data = {title: [Series(f"{title} <a & b>", ramp), Series("second", ramp[::2])]
            for title in titles[::2]}  # every other panel fed; the rest get nothing
    svg = render(dashboard, data, START, START + 60)
    panels = _panels(svg)
    assert sorted(panels) == sorted(titles)
    for title, group in panels.items():
        assert _texts(group, "panel-title") == [title]
        if title in data:
            assert _texts(group, "legend") == [f"{title} <a & b>", "second"]
            assert "No data" not in _texts(group)
        else:
            assert _texts(group, "legend") == []
            assert "No data" in _texts(group)
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    headings = [t.text for g in ET.fromstring(svg).iter(f"{SVG}g") if g.get("class") == "row"
                for t in g.iter(f"{SVG}text")]
    assert headings == rows


def test_a_gap_in_a_series_breaks_its_line() -> None:
    dashboard = _dashboard()
    title = next(p["title"] for p in dashboard["panels"] if p["type"] == "timeseries")
    gapped = tuple((START + i, 1.0) for i in [*range(10), *range(30, 40)])
    svg = render(dashboard, {title: [Series("x", gapped)]}, START, START + 40)
    lines = list(_panels(svg)[title].iter(f"{SVG}polyline"))
    assert [len(str(line.get("points")).split()) for line in lines] == [10, 10]


def test_legend_and_points_follow_prometheus_answers() -> None:
    metric = {"namespace": "factory", "configuration": "cams", "health": "healthy"}
    assert legend("{{namespace}}/{{configuration}} {{ health }}", metric) == (
        "factory/cams healthy")
    assert legend("{{node}} up", metric) == " up"
    assert points([[START, "1"], [START + 1, "NaN"], [START + 2, "+Inf"], [START + 3, "0.5"]]) == (
        (START, 1.0), (START + 3, 0.5))
