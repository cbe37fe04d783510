"""A real Prometheus (Debian's ``prometheus``) for the harness, and the repository's monitoring
files as Python values.

``Prometheus`` runs one process from a directory of the caller's own (config, storage), on a
free loopback port, scraping the given targets every second and evaluating
``deploy/monitoring/alerts.yaml``; ``query`` and ``query_range`` ask its HTTP API, ``wait``
and (on an event loop) ``until`` poll a check of its answers.
``alert_exprs`` and ``panel_queries`` read the alert rules and the Grafana dashboard. Used by
tests/integration/test_prometheus.py and tests/harness/dashboard_picture.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.harness.controlplane import REPO_ROOT, free_port

MONITORING = REPO_ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "dashboard.json"
DEADLINE_S = 90.0


class Prometheus:
    """One Prometheus process with its own directory, listening on 127.0.0.1 only."""

    def __init__(self, folder: Path, targets: dict[str, int]) -> None:
        binary = shutil.which("prometheus")
        assert binary is not None, "prometheus missing: install Debian's prometheus (.ci/apt)"
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(MONITORING / "alerts.yaml")],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in targets.items()
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = folder / "prometheus.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [binary, f"--config.file={folder / 'prometheus.yml'}",
                 f"--storage.tsdb.path={folder / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT, cwd=folder,
            )

    def _get(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now."""
        return self._get("/api/v1/query", {"query": expr})

    def query_range(self, expr: str, start: float, end: float,
                    step: float) -> list[dict[str, Any]]:
        """The matrix ``expr`` evaluates to from ``start`` to ``end`` (Unix seconds)."""
        return self._get("/api/v1/query_range", {
            "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})

    def wait(self, what: str, check: Any) -> Any:
        deadline = time.monotonic() + DEADLINE_S
        last: Any = None
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            with contextlib.suppress(OSError):
                last = check()
                if last:
                    return last
            time.sleep(0.5)  # polling Prometheus' answer; each look is a real query
        raise AssertionError(f"timed out waiting for {what}; last: {last}")

    async def until(self, what: str, check: Callable[[], Any]) -> Any:
        """``wait`` for a caller on an event loop: the loop runs between looks."""
        deadline = time.monotonic() + DEADLINE_S
        last: Any = None
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            with contextlib.suppress(OSError):
                last = check()
                if last:
                    return last
            await asyncio.sleep(0.5)  # polling Prometheus' answer; each look is a real query
        raise AssertionError(f"timed out waiting for {what}; last: {last}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def alert_exprs() -> dict[str, str]:
    groups = yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def panel_queries() -> dict[str, list[str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {p["title"]: [t["expr"] for t in p["targets"]]
            for p in dashboard["panels"] if p["type"] != "row"}
