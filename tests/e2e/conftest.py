"""End-to-end tests run their kubelet stand-ins on the kubelet's own device manager, as the
integration tests do (``kubelet_stand_in`` there); ``EDGEPLUG_KUBELET=emulator`` opts out.
The real-node tests' module fixtures (``plane``, ``node``: ``tests.harness.realnode_brokers``)
are offered here once instead of each module importing them."""

from tests.harness.realnode_brokers import node, plane
from tests.integration.conftest import kubelet_stand_in

__all__ = ["kubelet_stand_in", "node", "plane"]
