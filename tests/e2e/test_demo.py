"""``make demo`` keeps working: README.md's first command is run as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from crds import dra_slices
from tests.harness.controlplane import REPO_ROOT

DEMO_TIMEOUT_S = 240


def test_demo_shows_a_pod_getting_a_shared_device_through_the_scheduler() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.harness.demo"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S, check=False,
    )
    out = result.stdout
    assert result.returncode == 0, f"demo failed:\n{out}\n{result.stderr}"
    # Nothing a user would worry about: no warning, no raw map in a column.
    assert "WARNING" not in out + result.stderr, out + result.stderr
    assert "{}" not in out
    # The Configuration's devices are allocated by the scheduler ...
    assert "debugEcho   2          2           2         2       DiscoveryDetailsValid   dra" in out
    # ... both simulated devices became Instances with their Akri-compatible names, each in a
    # shared pool the scheduler allocates from ...
    assert "debug-echo-8120fe   debug-echo   true" in out
    for instance in ("debug-echo-8120fe", "debug-echo-a19705"):
        assert dra_slices.shared_pool("default", "debug-echo", instance) in out
    # ... broker pods run with the device's env from their claim's CDI device ...
    assert "debug-echo-8120fe-demo-node-pod   1/1     Running" in out
    assert "debug-echo-a19705-demo-node-pod/debug-echo-broker: {'DEBUG_ECHO_DESCRIPTION': 'foo1'" \
        in out
    # ... the user's pod shares foo0 through its own claim, whose status says what it got ...
    assert "my-app-dev-" in out
    assert "allocated,reserved" in out
    claim = out.split("# status.devices", 1)[1]
    assert "device: debug-echo-8120fe" in claim
    assert "reason: DeviceHealthy" in claim
    assert "my-app/app: {'DEBUG_ECHO_DESCRIPTION': 'foo0'" in out
    # ... and after unplugging foo1, its Instance and broker are gone while foo0's remain.
    after = out.split("# unplugging foo1", 1)[1]
    assert "debug-echo-a19705" not in after
    assert "debug-echo-8120fe-demo-node-pod" in after
    assert "my-app " in after
    assert "Traceback" not in result.stderr, result.stderr
