"""DRA (resource.k8s.io/v1) beside the device plugins: ResourceSlices for the Instances this node
serves. Imported only when the agent runs with ``DRA=on`` (see ``agent.settings``)."""
