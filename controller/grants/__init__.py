"""The Roles that let each node's agent read the Secrets and offer the devices of the
Configurations selecting it."""
