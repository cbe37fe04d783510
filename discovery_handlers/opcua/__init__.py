"""``opcua``: OPC-UA servers found through discovery servers (or asked directly), checked.

Why this exists: factory PLCs and gateways speak OPC-UA; each reachable server becomes a shared
device whose brokers get ``OPCUA_DISCOVERY_URL`` (Akri's name, and Akri's device id, so Instance
names match). The package is split the way every handler is: ``details`` (parsing, no OPC-UA
library), ``selection`` (pure rules over FindServers answers), ``client`` (the thin asyncua
seam), ``monitor`` (the per-URL and per-server tasks) and ``handler`` (the contract adapter).
Importing this package does not import asyncua: only ``discover`` does.
"""

from discovery_handlers.opcua.handler import OpcuaHandler, handler

__all__ = ["OpcuaHandler", "handler"]
