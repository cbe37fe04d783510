"""Discovery: Configurations in, this node's devices out, as Instances and the node's device table.

``configuration_watch`` starts a run (``runs``) per Configuration selecting this node; each run
resolves ``properties``, drives its handler and hands each device list to
``instance_publisher``, which writes Instances and fills ``node_devices``, the table both
allocators serve from. Never imports an allocator (docs/architecture.md).
"""
