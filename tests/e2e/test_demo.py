"""``make demo`` keeps working: README.md's first command is run as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from tests.harness.controlplane import REPO_ROOT

DEMO_TIMEOUT_S = 240


def test_demo_shows_instances_brokers_and_unplugging() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.harness.demo"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S, check=False,
    )
    out = result.stdout
    assert result.returncode == 0, f"demo failed:\n{out}\n{result.stderr}"
    # Both simulated devices became Instances with their Akri-compatible names ...
    assert "debug-echo-8120fe" in out
    assert "debug-echo-a19705" in out
    # ... device resources the node allocates, broker pods that run with the device's env ...
    assert "edgeplug.io/debug-echo-8120fe: 2" in out
    assert "debug-echo-8120fe-demo-node-pod   1/1     Running" in out
    assert "'DEBUG_ECHO_DESCRIPTION': 'foo1'" in out
    # ... and after unplugging foo1, its Instance and broker are gone while foo0's remain.
    after = out.split("# unplugging foo1", 1)[1]
    assert "debug-echo-a19705" not in after
    assert "debug-echo-8120fe-demo-node-pod" in after
    assert "Traceback" not in result.stderr, result.stderr
