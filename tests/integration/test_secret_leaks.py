"""No Secret value reaches a status, an Event, a log line or an Instance.

Discovery properties read from Secrets reach the handlers, and a handler's
complaint about its input goes to the Configuration's status, an Event and the agent's log. One
ONVIF path quoted a value from a Secret there (a username written where a property name was
expected, ``username_ref``). Here recognisable values are planted in a real Secret, the agent's
discovery side runs against the real API server with two Configurations reading it (an ONVIF
one whose credentials are wrong in exactly that way, and a debugEcho one that works and
publishes an Instance), and every status, Event, Instance and log record is searched for them.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest

from agent.discovery.events import REASON_INVALID_DETAILS, condition_type_for
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane

pytestmark = pytest.mark.timeout(120)

#: Recognisable values planted in the Secret; none may show up anywhere.
PLANTED_USER = "planted-user-4f1c9a"
PLANTED_PASSWORD = "planted-pass-8d2e7b"
PLANTED_UUID = "planted-uuid-77aa31"
SECRET = "cam-creds"


def _secret() -> dict[str, Any]:
    refs = json.dumps({PLANTED_UUID: {"username_ref": PLANTED_USER}})  # a value, not a name
    values = {"refs": refs, "username": PLANTED_USER, "password": PLANTED_PASSWORD}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}}


def _from_secret(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": key}}}


def _onvif() -> dict[str, Any]:
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "leaky-cams"},
        "spec": {"capacity": 1, "discoveryHandler": {
            "name": "onvif", "discoveryDetails": "",
            "discoveryProperties": [
                {"name": "device_credential_ref_list", "value": '["cam_refs"]'},
                _from_secret("cam_refs", "refs"),
                _from_secret("username_default", "username"),
                _from_secret("password_default", "password"),
            ]}},
    }


def _json(cp: ControlPlane, *args: str) -> str:
    return cp.kubectl("get", *args, "-o", "json").stdout


async def test_planted_secret_values_appear_in_no_status_event_log_or_instance(
    control_plane: ControlPlane, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    cp = control_plane
    caplog.set_level(logging.DEBUG)
    node = harness.new_node(cp)
    echo = harness.debug_echo_configuration(
        "echo-creds", descriptions=["dev0"],
        discovery_properties=[_from_secret("USERNAME", "username"),
                              _from_secret("PASSWORD", "password")])
    client = harness.api_client(cp)
    try:
        async with harness.agent_in_process(cp, node_name=node, namespace=namespace):
            harness.apply(cp, namespace, _secret(), _onvif(), echo)
            kind = condition_type_for(REASON_INVALID_DETAILS, node)

            async def refused() -> dict[str, Any] | None:
                cfg = json.loads(_json(cp, "configuration", "leaky-cams", "-n", namespace))
                for cond in (cfg.get("status") or {}).get("conditions") or []:
                    if cond["type"] == kind and cond["reason"] == REASON_INVALID_DETAILS:
                        return dict(cond)
                return None

            condition = await harness.eventually(refused, what=f"condition {kind} on leaky-cams")
            # The complaint names the property and the entry, so the user can find it.
            assert "discoveryProperties.cam_refs" in condition["message"], condition
            assert "entry 1" in condition["message"], condition

            async def warned() -> bool:
                events = json.loads(_json(cp, "events", "-n", namespace))["items"]
                return any(e["reason"] == REASON_INVALID_DETAILS for e in events)

            await harness.eventually(warned, what="the InvalidDiscoveryDetails Event")

            async def published() -> bool:
                return bool(await harness.instances(client, namespace))

            await harness.eventually(published, what="the echo Configuration's Instance")
    finally:
        await client.close()
    shown = {
        "statuses": _json(cp, "configurations", "-n", namespace),
        "events": _json(cp, "events", "-n", namespace),
        "instances": _json(cp, "instances", "-n", namespace),
        "log": "\n".join(caplog.text.splitlines()),
    }
    for where, text in shown.items():
        for planted in (PLANTED_USER, PLANTED_PASSWORD, PLANTED_UUID):
            assert planted not in text, f"{planted!r} shown in the {where}"
