"""lightkube resource classes for edgeplug's two kinds and the DRA ResourceSlices, defined once for
agent and controller (docs/architecture.md, "The API package").
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
