"""``opcua``: OPC-UA servers found through discovery servers (or asked directly), checked.

``handler`` is the entry point's target. Importing the package does not import asyncua; only
``discover`` does. The modules and why they are split so: docs/handlers/opcua.md, "How it works,
and why".
"""

from discovery_handlers.opcua.handler import OpcuaHandler, handler

__all__ = ["OpcuaHandler", "handler"]
