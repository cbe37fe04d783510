"""An agent killed with SIGKILL and started again deletes and re-creates nothing.

The agent runs as a real subprocess (``python -m agent.main``), so the kill is a real one: no
shutdown code runs. Instance uids must be unchanged afterwards and slot claims kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crds.naming import instance_name, slot_id
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane


async def test_sigkill_and_restart_keeps_instances_and_slots(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    node = harness.new_node(control_plane)
    availability = tmp_path / "offline"
    availability.write_text("d2\nu1\n")  # come online only after the restart
    shared_cfg = harness.debug_echo_configuration(
        "kept", descriptions=["d0", "d1", "d2"], capacity=2, availability_file=availability
    )
    local_cfg = harness.debug_echo_configuration(
        "mine", descriptions=["u0", "u1"], shared=False, availability_file=availability
    )
    names = {
        instance_name("kept", "d0", shared=True, node=node),
        instance_name("kept", "d1", shared=True, node=node),
        instance_name("mine", "u0", shared=False, node=node),
    }
    later = {
        instance_name("kept", "d2", shared=True, node=node),
        instance_name("mine", "u1", shared=False, node=node),
    }
    client = harness.api_client(control_plane)
    log = tmp_path / "agent.log"
    agent = harness.AgentSubprocess(
        control_plane, node_name=node, namespace=namespace, log_path=log
    )
    harness.apply(control_plane, namespace, shared_cfg, local_cfg)
    agent.start()
    try:
        async def published() -> dict[str, dict[str, Any]] | None:
            found = await harness.instances(client, namespace)
            return found if set(found) == names else None

        before = await harness.eventually(published, what=f"Instances {sorted(names)} (log: {log})")

        # A slot claimed as the device-plugin side would claim it.
        claimed = instance_name("kept", "d0", shared=True, node=node)
        slot = slot_id(claimed, 1)
        patch = {"spec": {"deviceUsage": {slot: node}}}
        control_plane.kubectl("patch", "instance", claimed, "-n", namespace, "--type=merge",
                              "-p", json.dumps(patch))

        agent.kill()
        agent.start()

        # Devices that come online now are published only by the restarted agent, after it
        # has reconciled (in the same pass) the Instances it adopted.
        availability.write_text("")

        async def rediscovered() -> bool:
            return later <= set(await harness.instances(client, namespace))

        await harness.eventually(rediscovered, what=f"restarted agent publishing {sorted(later)}")
        after = await harness.instances(client, namespace)
        assert set(after) == names | later
        for name in names:
            assert after[name]["metadata"]["uid"] == before[name]["metadata"]["uid"], name
            assert after[name]["spec"]["nodes"] == [node]
        assert after[claimed]["spec"]["deviceUsage"][slot] == node
        assert after[claimed]["spec"]["deviceUsage"][slot_id(claimed, 0)] == ""
    finally:
        agent.stop()
        await client.close()
