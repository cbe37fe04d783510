"""The engine: watches feed the state, a work queue runs the reconcilers, peering says which
replica acts; kopf's login sits here."""
