"""End-to-end tests run their kubelet stand-ins on the kubelet's own device manager, as the
integration tests do (``kubelet_stand_in`` there); ``EDGEPLUG_KUBELET=emulator`` opts out."""

from tests.integration.conftest import kubelet_stand_in

__all__ = ["kubelet_stand_in"]
