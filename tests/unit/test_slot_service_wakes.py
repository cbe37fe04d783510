"""Which Instance watch events wake the device-plugin service's reconcile pass.

A pass walks every Instance the node serves; at 200 devices each display write
(``status.used``, ``status.nodes``) used to bring one back as a watch event that woke a pass
deciding nothing new (idle CPU). The echo must be kept (its resourceVersion is what
the next conditioned write needs) without waking; every change a pass decides from must wake.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

from lightkube import AsyncClient

from agent.deviceplugins.slots.service import DevicePluginService
from agent.discovery.node_devices import NodeDeviceTable
from agent.kube.node_instances import serves_label
from agent.metrics import AgentMetrics
from crds.instance import Instance

NODE = "node-a"


def _service(tmp_path: Path) -> DevicePluginService:
    # No call reaches the client: seen only reads the object it is given.
    return DevicePluginService(
        client=cast(AsyncClient, object()), node_name=NODE, plugin_dir=tmp_path,
        pod_resources_socket=None, devices=NodeDeviceTable(), metrics=AgentMetrics(),
    )


def _instance(version: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "cam-1a2b3c", "namespace": "ns", "uid": "u1",
                     "resourceVersion": version,
                     "labels": {serves_label(NODE): "true"}},
        "spec": {"configurationName": "cam", "shared": True, "nodes": [NODE],
                 "capacity": 2, "deviceUsage": {"cam-1a2b3c-0": "", "cam-1a2b3c-1": ""}},
        "status": status,
    }


def test_the_echo_of_a_display_write_is_kept_but_wakes_no_pass(tmp_path: Path) -> None:
    service = _service(tmp_path)
    assert service.instances.seen(_instance("1"))  # first sight: a pass must serve it
    service.pass_starts()
    assert not service.instances.seen(_instance("2", used=0, nodes=NODE))
    # The newer resourceVersion is what the next conditioned write is made on.
    assert service.instances[("ns", "cam-1a2b3c")].resource_version == "2"


def test_every_change_a_pass_decides_from_wakes_it(tmp_path: Path) -> None:
    service = _service(tmp_path)
    base = _instance("1")
    service.instances.seen(base)
    service.pass_starts()
    changes: dict[str, dict[str, dict[str, Any]]] = {
        "a reservation": {"status": {"reservations": {"cam-1a2b3c-0": NODE}}},
        "another node's demand": {"status": {"demand": {"node-b": 1}}},
        "a slot taken": {"spec": {"deviceUsage": {"cam-1a2b3c-0": "node-b"}}},
        "a node listed": {"spec": {"nodes": [NODE, "node-b"]}},
        "claims counted": {"status": {"claims": 1}},
    }
    for version, (what, change) in enumerate(changes.items(), start=2):
        changed = copy.deepcopy(base)
        changed["metadata"]["resourceVersion"] = str(version)
        for part, fields in change.items():
            changed[part] = {**changed[part], **fields}
        assert service.instances.seen(changed), what
        service.instances.seen(base)  # back to the base for the next change (itself a change)
    unlabelled = copy.deepcopy(base)
    unlabelled["metadata"]["labels"] = {}
    assert service.instances.seen(unlabelled), "this node's label gone"


def test_the_echo_of_a_write_no_pass_started_from_wakes_one(tmp_path: Path) -> None:
    # An Allocate's recording is kept (remember) ahead of its watch event, and no pass is run
    # for the write itself: its echo is what brings the pass that offers the rest anew.
    service = _service(tmp_path)
    service.instances.seen(_instance("1"))
    service.pass_starts()
    recorded = _instance("2")
    recorded["spec"]["deviceUsage"] = {"cam-1a2b3c-0": NODE, "cam-1a2b3c-1": ""}
    service.instances.remember(Instance.from_object(recorded))
    assert service.instances.seen(recorded)
