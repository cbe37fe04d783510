"""lightkube resource classes for edgeplug's two kinds (and the DRA ResourceSlices both publish),
defined once for agent and controller.

Why this exists: both the agent and the controller talk to the API with lightkube, and a generic
resource class registers itself with lightkube by (group, version, kind); defining it in one
place keeps both on the same class and the same API coordinates as the CRD manifests.
"""

from __future__ import annotations

from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from crds.api import (
    CONFIGURATION_KIND,
    CONFIGURATION_PLURAL,
    GROUP,
    INSTANCE_KIND,
    INSTANCE_PLURAL,
    VERSION,
)

ConfigurationResource = create_namespaced_resource(
    GROUP, VERSION, CONFIGURATION_KIND, CONFIGURATION_PLURAL
)
InstanceResource = create_namespaced_resource(GROUP, VERSION, INSTANCE_KIND, INSTANCE_PLURAL)
#: DRA's ResourceSlices: the agents publish their nodes' local pools, the controller the shared
#: devices' (``crds.dra_slices``).
ResourceSliceResource = create_global_resource(
    "resource.k8s.io", "v1", "ResourceSlice", "resourceslices"
)
