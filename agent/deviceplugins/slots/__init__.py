"""Slots: how one device's capacity is shared between pods and nodes, and served to the kubelet.

The one subsystem between the kubelet's device ids and the API's ``deviceUsage`` slots,
reservations and demand, layered bottom-up: ``rules`` (pure functions over Instances, no I/O,
no gRPC), ``ledger`` (conditioned writes of claims and reservations), ``recording``, ``demand``,
``freeing``, ``handoff`` and ``display``, ``backends`` (Allocate and friends answered with
slots) and ``service`` (the reconcile loop that runs plugins for the Instances this node
serves). The generic plugin lifecycle is ``agent.deviceplugins.kubelet``'s. The invariants and why
they hold: docs/slots.md.
"""
