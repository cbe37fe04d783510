"""The scheduler's allocator on the controller's side: the allocator choice, DeviceClasses, nodes
whose agent is gone, and the Instances' usage display."""
