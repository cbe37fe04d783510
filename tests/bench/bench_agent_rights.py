"""What the agent's Instance admission policy costs each slot write.

Every claim, free and reservation the agent writes passes through the CEL rules of
deploy/manifests/agent-instance-policy.yaml (maps of up to 1,024 slots). This times a JSON merge
patch of one ``deviceUsage`` slot, as the agent's ledger writes it, with the agent's own
node-bound token, first with the policy bound and then with its binding removed, on an Instance
of ``SLOTS`` slots, and prints the medians of several rounds next to a fixed loop's duration
showing the machine's speed. Nothing is asserted.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lightkube import ApiError, Client, KubeConfig
from lightkube.types import PatchType

from agent.kube.client import InstanceResource
from tests.bench.stats import machine_speed_line, summary
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.service_accounts import pod_bound

MANIFESTS = REPO_ROOT / "deploy" / "manifests"
POLICY = "edgeplug-agent-own-node-instances"
NODE = "bench-rights-node"
NAMESPACE = "bench-rights"
SLOTS = 256
WRITES = 100
ROUNDS = 3
#: The fixed loop whose duration shows the machine's speed at the time of the reading.
#: How long a policy change may take to reach enforcement.
POLICY_SETTLE_S = 60.0
POLL_S = 0.2


def _writes(client: Client, name: str) -> list[float]:
    slot = f"{name}-0"
    samples = []
    for i in range(WRITES):
        value = NODE if i % 2 == 0 else ""
        started = time.perf_counter()
        client.patch(InstanceResource, name, {"spec": {"deviceUsage": {slot: value}}},
                     namespace=NAMESPACE, patch_type=PatchType.MERGE)
        samples.append(time.perf_counter() - started)
    return samples


def _policy_enforced(client: Client, name: str) -> bool:
    """Whether a write on a slot of another node is refused right now."""
    try:
        client.patch(InstanceResource, name, {"spec": {"deviceUsage": {f"{name}-1": "x-other"}}},
                     namespace=NAMESPACE, patch_type=PatchType.MERGE, dry_run=True)
    except ApiError:
        return True
    return False


def _wait(client: Client, name: str, *, enforced: bool) -> None:
    deadline = time.monotonic() + POLICY_SETTLE_S
    while _policy_enforced(client, name) != enforced:
        if time.monotonic() > deadline:
            raise SystemExit(f"the policy did not become {'enforced' if enforced else 'idle'}")
        time.sleep(POLL_S)  # polling a condition with a deadline


def _rounds(label: str, client: Client, name: str) -> None:
    medians = []
    for round_ in range(ROUNDS):
        samples = _writes(client, name)
        medians.append(statistics.median(samples) * 1000)
        print(summary(f"  {label}, round {round_ + 1}", samples), flush=True)
    print(f"  {label}: median of round medians {statistics.median(medians):.2f} ms", flush=True)


def run(plane: ControlPlane) -> None:
    for file in ("namespace.yaml", "agent-rbac.yaml", "agent-instance-policy.yaml"):
        plane.kubectl("apply", "-f", str(MANIFESTS / file))
    plane.kubectl("apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}))
    plane.kubectl("create", "namespace", NAMESPACE)
    name = "cam-b3b3b3"
    plane.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"configurationName": "cam", "capacity": SLOTS, "shared": True,
                 "nodes": [NODE, "x-other"],
                 "deviceUsage": {f"{name}-{i}": "" for i in range(SLOTS)}},
    }))
    folder = Path(tempfile.mkdtemp(prefix="bench-rights-"))
    agent = pod_bound(plane, namespace="edgeplug-system", account="edgeplug-agent", node=NODE,
                      folder=folder)
    client = Client(KubeConfig.from_file(str(agent.kubeconfig)))
    _wait(client, name, enforced=True)
    print(f"one deviceUsage merge patch by the agent's token, Instance of {SLOTS} slots, "
          f"{WRITES} writes per round", flush=True)
    _rounds("policy bound", client, name)
    plane.kubectl("delete", "validatingadmissionpolicybinding", POLICY)
    _wait(client, name, enforced=False)
    _rounds("no policy", client, name)
    client.close()


def main(argv: list[str]) -> None:
    del argv
    print(machine_speed_line(), flush=True)
    with ControlPlane() as plane:
        plane.apply_crds()
        run(plane)
    print(f"at the end: {machine_speed_line()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
