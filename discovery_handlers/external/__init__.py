"""Akri's discovery handlers as edgeplug handlers: the table of registrations, the contract adapter
that streams a registered handler's lists, and the generated ``v0`` API (``akriapi``).

The agent hosts the registration service and installs ``ExternalHandlers`` as the registry's
resolver; nothing here knows of Kubernetes or the agent (docs/handlers/akri.md, "The modules").
"""
