"""Slots: how one device's capacity is shared between pods and nodes, and served to the kubelet.

Why this exists: the kubelet sees device ids; the API sees ``deviceUsage`` slots, per-node
reservations and demand. This package is the one subsystem between them, layered bottom-up:
``rules`` (pure functions over Instances, no I/O, no gRPC), ``ledger`` (conditioned writes of
claims and reservations), ``demand`` and ``freeing`` (Pending pods that want a slot, slots of
vanished pods), ``backends`` (Allocate and friends answered with slots) and ``service`` (the
reconcile loop that runs plugins for the Instances this node serves). The generic plugin
lifecycle (sockets, registration, kubelet restarts) is ``agent.deviceplugin``'s.
"""
