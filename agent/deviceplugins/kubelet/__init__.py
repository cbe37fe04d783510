"""Kubelet device plugins for the agent.

The kubelet learns about devices only through its ``deviceplugin/v1beta1``
gRPC API. This package keeps the generic plugin lifecycle (serving a socket, registering,
surviving kubelet restarts: ``server``, ``registration``, ``manager``) apart from what a plugin
advertises and hands out: ``backend`` is the seam, and ``agent.deviceplugins.slots`` implements it
with slots and wires both to Instances.
"""
