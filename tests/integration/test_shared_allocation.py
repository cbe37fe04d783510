"""Which allocator serves a Configuration's shared devices, as the controller decides it on the
real API server, on every version (this file runs in the suite on the newest minor and in the
compatibility run on the oldest, where DRAExtendedResource is off).

Each test first asks the API server itself (a dry-run apply of a DeviceClass mapping an
extended resource) whether it keeps ``extendedResourceName``; the Configuration's
``status.sharedDeviceAllocation``, its ``Allocator`` condition and the per-Instance
DeviceClasses must then follow: ``dra`` where it is kept, the compatibility mode (with a
condition naming the gate) where it is dropped, and always what the spec pins."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from agent.dra import slices
from agent.kube.client import as_dict
from controller.dra.instance_classes import DeviceClassResource
from crds import dra
from crds.naming import instance_name, instance_resource_name
from crds.resources import ConfigurationResource
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane


async def _serves_extended_resources(kube: AsyncClient, namespace: str) -> bool:
    probe = dra.device_class(namespace, "probe", extended_resource="edgeplug.io/probe")
    probe["metadata"]["name"] = f"probe-{namespace}.edgeplug.io"
    stored = await kube.patch(DeviceClassResource, probe["metadata"]["name"], probe,
                              patch_type=PatchType.APPLY, field_manager="test-probe",
                              dry_run=True)
    return bool(as_dict(stored)["spec"].get("extendedResourceName"))


async def _allocation(kube: AsyncClient, namespace: str, name: str
                      ) -> tuple[str, dict[str, Any]] | None:
    """The Configuration's ``status.allocator`` and its condition, once written."""
    body = as_dict(await kube.get(ConfigurationResource, name, namespace=namespace))
    status = body.get("status") or {}
    conditions = [c for c in status.get("conditions") or []
                  if c["type"] == "Allocator"]
    if not status.get("allocator") or not conditions:
        return None
    assert status.get("sharedDeviceAllocation") == status["allocator"]  # for older agents
    return str(status["allocator"]), conditions[0]


async def _instance_class(kube: AsyncClient, namespace: str, instance: str
                          ) -> dict[str, Any] | None:
    try:
        return as_dict(await kube.get(DeviceClassResource,
                                      dra.instance_class_name(namespace, instance)))
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise


async def _asked_for(control_plane: ControlPlane, kube: AsyncClient, namespace: str,
                     configuration: str, instance: str, *, also: str | None = None
                     ) -> dict[str, Any]:
    """The Instance's own DeviceClass, made once a pod waiting to be scheduled asks for
    ``edgeplug.io/<instance>`` (and for ``also``'s), and not before."""
    await harness.eventually(lambda: _mapped(kube, namespace, configuration),
                             what=f"{configuration}'s class mapping")
    assert await _instance_class(kube, namespace, instance) is None, "made before any pod asked"
    resources = {"limits": {instance_resource_name(n): "1"
                            for n in (instance, also) if n is not None}}
    pod = h.extended_resource_pod(f"asks-{instance}", instance_resource_name(instance))
    pod["spec"]["containers"][0]["resources"] = resources
    h.apply(control_plane, namespace, pod)
    return await harness.eventually(lambda: _instance_class(kube, namespace, instance),
                                    what=f"{instance}'s DeviceClass, once a pod asked")


async def _mapped(kube: AsyncClient, namespace: str, configuration: str) -> str | None:
    body = await h.device_class(kube, namespace, configuration)
    return None if body is None else body["spec"].get("extendedResourceName")


async def test_a_configuration_that_does_not_choose_gets_what_the_cluster_serves(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
) -> None:
    served = await _serves_extended_resources(kube, namespace)
    cam = instance_name("cams", "cam", shared=True, node="")
    async with h.device_classes(kube, namespace), h.dra_agents(control_plane, ["n1"],
                                                                namespace):
        harness.apply(control_plane, namespace, harness.debug_echo_configuration(
            "cams", descriptions=["cam"], shared=True))
        mode, condition = await harness.eventually(
            lambda: _allocation(kube, namespace, "cams"), what="the controller's choice")
        if served:
            assert (mode, condition["status"], condition["reason"]) == (
                "dra", "True", "ServedByScheduler")
            body = await _asked_for(control_plane, kube, namespace, "cams", cam)
            assert body["spec"]["extendedResourceName"] == f"edgeplug.io/{cam}"
            assert dra.instance_selector(cam) in body["spec"]["selectors"][0]["cel"][
                "expression"]
            # The Configuration's class maps its resource too, since its devices are shared.
            mapped = await harness.eventually(lambda: _mapped(kube, namespace, "cams"),
                                              what="the Configuration's class mapping")
            assert mapped == "edgeplug.io/cams"
            control_plane.kubectl("delete", "configuration", "cams", "-n", namespace)

            async def gone() -> bool:
                return await _instance_class(kube, namespace, cam) is None

            await harness.eventually(gone, what="the class deleted with its Instance")
        else:
            assert (mode, condition["status"], condition["reason"]) == (
                "devicePlugin", "True", "DRAExtendedResourcesUnavailable")
            assert "DRAExtendedResource" in condition["message"]
            assert await _instance_class(kube, namespace, cam) is None


async def test_a_configuration_pinned_to_device_plugins_keeps_them(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
) -> None:
    """One allocator: a shared device pinned to the device plugins gets no DeviceClass and is
    published in no ResourceSlice, so no claim can take one of its slots."""
    cam = instance_name("pinned", "cam", shared=True, node="")
    async with h.device_classes(kube, namespace), h.dra_agents(control_plane, ["n1"],
                                                                namespace) as agents:
        cfg = harness.debug_echo_configuration("pinned", descriptions=["cam"], shared=True)
        cfg["spec"]["sharedDeviceAllocation"] = "devicePlugin"
        harness.apply(control_plane, namespace, cfg)
        mode, condition = await harness.eventually(
            lambda: _allocation(kube, namespace, "pinned"), what="the controller's choice")
        assert (mode, condition["status"], condition["reason"]) == (
            "devicePlugin", "True", "DevicePluginChosen")
        assert await _instance_class(kube, namespace, cam) is None
        publisher = agents["n1"].publisher

        async def known() -> bool:
            names = {i.name for i in publisher.known_instances()}
            return cam in names and agents["n1"].agent.devices.get(namespace, cam) is not None

        await harness.eventually(known, what="the publisher knowing the device")
        # A local device's pool, published by a pass that already knew the pinned device.
        harness.apply(control_plane, namespace, harness.debug_echo_configuration(
            "usb", descriptions=["u0"], shared=False, allocator="dra"))
        local = slices.local_pool(namespace, "usb", "n1")

        async def published() -> bool:
            return bool(await h.pool_slices(kube, local))

        await harness.eventually(published, what="the local device's pool published")
        pool = slices.shared_pool(namespace, "pinned", cam)
        assert await h.pool_slices(kube, pool) == [], "a pinned device in a ResourceSlice"


async def test_asking_for_dra_where_it_is_missing_is_reported_and_served_compatibly(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
) -> None:
    served = await _serves_extended_resources(kube, namespace)
    cam = instance_name("asks", "cam", shared=True, node="")
    async with h.device_classes(kube, namespace), h.dra_agents(control_plane, ["n1"],
                                                                namespace):
        cfg = harness.debug_echo_configuration("asks", descriptions=["cam"], shared=True)
        cfg["spec"]["sharedDeviceAllocation"] = "dra"
        harness.apply(control_plane, namespace, cfg)
        mode, condition = await harness.eventually(
            lambda: _allocation(kube, namespace, "asks"), what="the controller's choice")
        if served:
            assert (mode, condition["status"]) == ("dra", "True")
            await _asked_for(control_plane, kube, namespace, "asks", cam)
            # Pinned back: the class goes, the device plugins serve it again.
            cfg["spec"]["sharedDeviceAllocation"] = "devicePlugin"
            harness.apply(control_plane, namespace, cfg)

            async def gone() -> bool:
                return await _instance_class(kube, namespace, cam) is None

            await harness.eventually(gone, what="the class deleted once pinned back")
            mode, condition = await harness.eventually(
                lambda: _allocation(kube, namespace, "asks"), what="the new choice")
            assert mode == "devicePlugin"
        else:
            assert (mode, condition["status"], condition["reason"]) == (
                "devicePlugin", "False", "DRAExtendedResourcesUnavailable")
            assert condition["message"].startswith("spec.allocator is dra, but")
            assert "DRAExtendedResource" in condition["message"]


async def test_a_local_devices_resources_are_mapped_only_where_the_scheduler_allocates_it(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
) -> None:
    """Local devices have one allocator too: where the scheduler allocates a Configuration's
    devices, its class maps ``edgeplug.io/<configuration>`` and each Instance's class
    ``edgeplug.io/<instance>``; a Configuration pinned to device plugins gets no mapping, so
    nothing serves those names through DRA behind the kubelet's back."""
    served = await _serves_extended_resources(kube, namespace)
    usb = instance_name("usb", "u0", shared=False, node="n1")
    old = instance_name("old", "o0", shared=False, node="n1")
    pinned = harness.debug_echo_configuration("old", descriptions=["o0"], shared=False,
                                              allocator="devicePlugin")
    async with h.device_classes(kube, namespace), h.dra_agents(control_plane, ["n1"],
                                                                namespace):
        harness.apply(control_plane, namespace, harness.debug_echo_configuration(
            "usb", descriptions=["u0"], shared=False), pinned)
        for name in ("usb", "old"):
            await harness.eventually(functools.partial(_allocation, kube, namespace, name),
                                     what=f"the controller's choice for {name}")
        await harness.eventually(lambda: h.device_class(kube, namespace, "old"),
                                 what="the pinned Configuration's class")
        assert await _mapped(kube, namespace, "old") is None
        if not served:
            assert await _mapped(kube, namespace, "usb") is None
            return
        assert await harness.eventually(lambda: _mapped(kube, namespace, "usb"),
                                        what="usb's class mapping") == "edgeplug.io/usb"
        body = await _asked_for(control_plane, kube, namespace, "usb", usb, also=old)
        assert body["spec"]["extendedResourceName"] == instance_resource_name(usb)
        assert await _instance_class(kube, namespace, old) is None


async def test_a_controller_without_dra_reports_the_compatibility_mode(
    peering: ControlPlane, namespace: str, kube: AsyncClient, tmp_path: Path,
) -> None:
    """Without ``--dra`` no DeviceClass maps ``edgeplug.io/<name>``: the controller says the
    device plugins allocate the devices, and why, so an agent with DRA on does not wait."""
    control_plane = peering
    controller = ControllerProcess(control_plane, namespaces=[namespace],
                                   log_path=tmp_path / "ctl.log", extra_args=FAST_ARGS)
    controller.start()
    try:
        harness.apply(control_plane, namespace, harness.debug_echo_configuration(
            "plain", descriptions=["cam"], shared=True))
        mode, condition = await harness.eventually(
            lambda: _allocation(kube, namespace, "plain"), what="the controller's choice")
        assert (mode, condition["status"], condition["reason"]) == (
            "devicePlugin", "True", "ControllerWithoutDRA")
        assert "--dra" in condition["message"]
    finally:
        controller.stop()
