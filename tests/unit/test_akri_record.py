"""The agent's record of handler registrations: what a restarted agent takes back."""

from __future__ import annotations

import json
from pathlib import Path

from agent.discovery.akri_registration import RECORD_NAME, HandlerRegistration
from agent.metrics import AgentMetrics


def test_the_record_brings_back_live_handlers_and_drops_vanished_sockets(tmp_path: Path) -> None:
    live = tmp_path / "live.sock"
    live.touch()  # stands for the socket of a handler still running
    (tmp_path / RECORD_NAME).write_text(json.dumps([
        {"name": "live", "endpoint": str(live), "endpointType": "UDS", "shared": False},
        {"name": "gone", "endpoint": str(tmp_path / "gone.sock"), "endpointType": "UDS",
         "shared": True},
        {"name": "pod", "endpoint": "http://10.0.0.5:9000", "endpointType": "NETWORK",
         "shared": True},
        {"name": "garbled", "endpointType": "UDS"},
    ]))
    service = HandlerRegistration(directory=tmp_path, grace=1.0, metrics=AgentMetrics())
    service.restore()
    assert service.registrations.names() == ["live", "pod"]
    registration = service.registrations.get("live")
    assert registration is not None
    assert registration.shared is False


def test_an_unreadable_record_is_ignored(tmp_path: Path) -> None:
    (tmp_path / RECORD_NAME).write_text("{not json")
    service = HandlerRegistration(directory=tmp_path, grace=1.0, metrics=AgentMetrics())
    service.restore()
    assert service.registrations.names() == []


def test_every_endpoint_of_a_name_is_recorded_and_brought_back(tmp_path: Path) -> None:
    first, second = tmp_path / "first.sock", tmp_path / "second.sock"
    first.touch()
    second.touch()
    entries = [{"name": "h", "endpoint": str(path), "endpointType": "UDS", "shared": False}
               for path in (first, second)]
    (tmp_path / RECORD_NAME).write_text(json.dumps(entries))
    service = HandlerRegistration(directory=tmp_path, grace=1.0, metrics=AgentMetrics())
    service.restore()
    assert [r.endpoint for r in service.registrations.endpoints("h")] == [str(first),
                                                                          str(second)]
    (tmp_path / RECORD_NAME).unlink()
    service._save()
    assert json.loads((tmp_path / RECORD_NAME).read_text()) == entries
