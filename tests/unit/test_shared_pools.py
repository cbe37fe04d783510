"""Which shared pools the controller publishes (``controller.shared_pools.wanted_pools``)."""

from __future__ import annotations

from controller.shared_pools import wanted_pools
from crds import dra_slices
from crds.configuration import Allocator
from crds.instance import Instance, InstanceSpec

DRA, PLUGINS = Allocator.DRA, Allocator.DEVICE_PLUGIN


def _instance(name: str, configuration: str, *, shared: bool = True,
              reported: tuple[str, ...] = ("n1",)) -> Instance:
    return Instance(name=name, namespace="ns",
                    spec=InstanceSpec(configuration_name=configuration, shared=shared,
                                      nodes=("n1", "n2")),
                    reported=frozenset(reported))


def test_only_shared_devices_of_configurations_the_scheduler_allocates() -> None:
    instances = [_instance("cam-000001", "cam"), _instance("cam-000002", "cam", shared=False),
                 _instance("old-000003", "old"), _instance("new-000004", "new"),
                 _instance("cam-000005", "cam", reported=())]
    pools, held = wanted_pools(instances, {("ns", "cam"): DRA, ("ns", "old"): PLUGINS})
    assert list(pools) == [dra_slices.shared_pool("ns", "cam", "cam-000001")]
    assert pools["ns/cam/shared/cam-000001"].nodes == ("n1",)
    # Wanted, but no node's verdict known yet: held, not withdrawn.
    assert held == {dra_slices.shared_pool("ns", "cam", "cam-000005")}
