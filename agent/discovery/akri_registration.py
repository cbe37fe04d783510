"""Akri's handler registration, hosted by the agent: out-of-process handlers join by gRPC.

``HandlerRegistration`` serves Akri's ``v0.Registration`` on the node's socket, keeps the
``Registrations`` table (``restore`` reads it back after a restart) and installs the registry's
process-wide resolver. How it works: docs/handlers/akri.md.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import grpc
from prometheus_client import Counter, Gauge

from agent.metrics import AgentMetrics
from discovery_handlers.external.akriapi import discovery_pb2 as pb
from discovery_handlers.external.akriapi import discovery_pb2_grpc as pb_grpc
from discovery_handlers.external.handler import ExternalHandlers
from discovery_handlers.external.registrations import (
    BadRegistration,
    EndpointType,
    Registrations,
)
from discovery_handlers.registry import set_resolver

log = logging.getLogger(__name__)

#: Akri's name for the agent's registration socket, inside the discovery-handlers directory.
REGISTRATION_SOCKET_NAME = "agent-registration.sock"
#: The node's registrations, kept beside the socket so that a restarted agent knows the handlers
#: that registered with its predecessor: Akri's handlers register again only when a stream of
#: theirs closes, which a handler serving no Configuration never sees. A handler recorded there
#: that is gone is dropped like any other, once unreachable for longer than the grace.
RECORD_NAME = "edgeplug-registrations.json"


class _RegistrationService(pb_grpc.RegistrationServicer):
    def __init__(self, registrations: Registrations, received: Counter) -> None:
        self._registrations = registrations
        self._received = received

    async def RegisterDiscoveryHandler(
        self,
        request: pb.RegisterDiscoveryHandlerRequest,
        context: grpc.aio.ServicerContext[pb.RegisterDiscoveryHandlerRequest, pb.Empty],
    ) -> pb.Empty:
        try:
            endpoint_type = EndpointType(request.endpoint_type)
            registration = self._registrations.register(
                name=request.name, endpoint=request.endpoint, endpoint_type=endpoint_type,
                shared=request.shared,
            )
        except (BadRegistration, ValueError) as exc:
            log.warning("refused the registration of discovery handler %r: %s",
                        request.name, exc, extra={"handler": request.name})
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this line is for readers and type checkers
        self._received.labels(registration.name).inc()
        log.info(
            "discovery handler %r registered at %s (%s, %s devices)", registration.name,
            registration.endpoint, registration.endpoint_type.name,
            "shared" if registration.shared else "local", extra={"handler": registration.name},
        )
        return pb.Empty()


class HandlerRegistration:
    """The registration service of one agent: ``run`` serves it until cancelled."""

    def __init__(self, *, directory: Path, grace: float, metrics: AgentMetrics) -> None:
        self.directory = directory
        self.socket = directory / REGISTRATION_SOCKET_NAME
        self.registrations = Registrations()
        self._grace = grace
        self._registered = Gauge(
            "edgeplug_discovery_handlers_registered",
            "Out-of-process discovery handlers registered on this node (Akri's protocol), "
            "1 per registered name", ["handler"], registry=metrics.registry,
        )
        self._received = Counter(
            "edgeplug_discovery_handler_registrations",
            "Registrations the agent accepted from out-of-process discovery handlers (Akri's "
            "protocol), the same endpoint registering again included", ["handler"],
            registry=metrics.registry,
        )
        self._shown: set[str] = set()
        self.record = directory / RECORD_NAME
        self.registrations.on_change(self._count)

    def _count(self) -> None:
        names = set(self.registrations.names())
        for gone in self._shown - names:
            self._registered.remove(gone)
        for name in names - self._shown:
            self._registered.labels(name).set(1)
        self._shown = names

    def _save(self) -> None:
        entries = []
        for name in self.registrations.names():
            for registration in self.registrations.endpoints(name):
                entries.append({
                    "name": name, "endpoint": registration.endpoint,
                    "endpointType": registration.endpoint_type.name,
                    "shared": registration.shared,
                })
        partial = self.record.with_suffix(".partial")
        try:
            partial.write_text(json.dumps(entries, indent=1))
            os.replace(partial, self.record)
        except OSError as exc:
            log.warning("could not record the registrations in %s (%s); a restarted agent "
                        "waits for the handlers to register again", self.record, exc)

    def restore(self) -> None:
        """Register again what the record holds (``run`` calls it first)."""
        try:
            entries = json.loads(self.record.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("ignored the registration record %s (%s)", self.record, exc)
            return
        for entry in entries if isinstance(entries, list) else []:
            try:
                endpoint_type = EndpointType[str(entry["endpointType"])]
                endpoint = str(entry["endpoint"])
                if endpoint_type is EndpointType.UDS and not os.path.exists(endpoint):
                    # The handler is gone (its socket with it): not worth a grace during which
                    # a built-in of its name would not serve.
                    log.info("recorded discovery handler %r is gone (%s missing)",
                             entry["name"], endpoint)
                    continue
                self.registrations.register(
                    name=str(entry["name"]), endpoint=endpoint, endpoint_type=endpoint_type,
                    shared=bool(entry["shared"]),
                )
            except (KeyError, TypeError, BadRegistration) as exc:
                log.warning("ignored a recorded registration %r (%s)", entry, exc)
        log.info("restored %d discovery-handler registrations from %s", sum(
            len(self.registrations.endpoints(n)) for n in self.registrations.names()),
            self.record)

    async def run(self) -> None:
        """Install the resolver at once (before any discovery run loads a handler: ``main``
        starts this first), then serve the socket until cancelled."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.socket.unlink(missing_ok=True)
        except OSError as exc:
            log.error("cannot host discovery-handler registration in %s (%s); external "
                      "discovery handlers are off", self.directory, exc)
            return
        self.restore()
        self.registrations.on_change(self._save)
        set_resolver(ExternalHandlers(
            self.registrations, grace=self._grace, waiting_on=str(self.socket)
        ))
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(
            _RegistrationService(self.registrations, self._received), server
        )
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        ours = os.stat(self.socket).st_ino
        log.info("serving discovery-handler registration on %s", self.socket)
        try:
            await server.wait_for_termination()
        finally:
            set_resolver(None)
            await server.stop(grace=None)
            try:
                if os.stat(self.socket).st_ino == ours:  # not a newer agent's socket
                    self.socket.unlink()
            except FileNotFoundError:
                pass
