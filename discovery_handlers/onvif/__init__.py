"""ONVIF discovery handler: IP cameras found by WS-Discovery, filtered, authenticated, described.

Why this exists: it is the entry point's target (``discovery_handlers.onvif:handler``). Layout:
``details``/``credentials`` parse the Configuration, ``wsd_messages``/``cameras`` are the pure
logic, ``wsd_transport`` (sockets) and ``soap`` (onvif-zeep-async) the thin I/O wrappers, and
``scanner`` drives them; ``handler`` is the contract adapter.
"""

from discovery_handlers.onvif.handler import OnvifHandler

handler = OnvifHandler()

__all__ = ["OnvifHandler", "handler"]
