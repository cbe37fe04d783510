"""ONVIF discovery handler: IP cameras found by WS-Discovery, filtered, authenticated, described.

``handler`` is the entry point's target (``discovery_handlers.onvif:handler``). The modules and
what each one does: docs/handlers/onvif.md, "How it works, and why".
"""

from discovery_handlers.onvif.handler import OnvifHandler

handler = OnvifHandler()

__all__ = ["OnvifHandler", "handler"]
