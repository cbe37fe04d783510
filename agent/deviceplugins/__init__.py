"""The device-plugin allocator (the compatibility mode): devices offered to the kubelet.

``kubelet`` speaks the kubelet's device-plugin and pod-resources APIs; ``slots`` shares a
device's capacity between pods and nodes and answers ``Allocate``; ``crossnode`` is the
cross-node protocol, loaded only once a shared device is served this way. The DRA default never
imports this package: ``agent.device_plugin_seam`` starts it (docs/slots.md).
"""
