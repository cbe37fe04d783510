"""No finalizer: deleting a Configuration never waits for the controller (real control plane).

A finalizer left on a Configuration by an operator that is uninstalled or down makes
``kubectl delete`` hang forever; the controller must put none on Configurations or Instances.
"""

from __future__ import annotations

from controller.main import FINALIZER
from tests.harness import controller_process as h
from tests.harness.controlplane import ControlPlane

#: ``kubectl delete`` waits this long for the object to be gone (it hangs on a finalizer).
DELETE_TIMEOUT = "30s"




def _with_broker(plane: ControlPlane, namespace: str) -> tuple[str, str]:
    cfg = h.unique("fin")
    inst = f"{cfg}-abcdef"
    h.apply(plane, h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec()))
    h.apply(plane, h.instance(namespace, inst, configuration_name=cfg, nodes=["n-1"]))
    h.wait_until(lambda: h.broker_pods(plane, namespace), what=f"a broker pod for {inst}")
    return cfg, inst


def test_no_finalizer_on_configurations_or_instances(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    cfg, inst = _with_broker(control_plane, namespace)
    # The status is written by the Configuration pass: the controller has handled it.
    body = h.wait_until(
        lambda: (c := h.get(control_plane, h.configuration_path(namespace, cfg)))
        and (c.get("status") or {}).get("instanceCount") == 1 and c,
        what="the Configuration's status counting its Instance",
    )
    assert not body["metadata"].get("finalizers"), body["metadata"]
    inst_body = h.get(control_plane, h.instance_path(namespace, inst))
    assert inst_body is not None
    assert not inst_body["metadata"].get("finalizers"), inst_body["metadata"]


def test_configuration_deletes_while_controller_is_stopped(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    cfg, _ = _with_broker(control_plane, namespace)
    controller.stop()
    done = control_plane.kubectl(
        "delete", "configurations.edgeplug.io", cfg, "-n", namespace,
        f"--timeout={DELETE_TIMEOUT}", check=False,
    )
    assert done.returncode == 0, f"kubectl delete did not complete: {done.stderr}"
    assert h.get(control_plane, h.configuration_path(namespace, cfg)) is None, (
        "the Configuration is still there after kubectl delete returned"
    )


def test_finalizer_left_by_an_older_version_is_released(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    cfg = h.unique("old")
    body = h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec())
    body["metadata"]["finalizers"] = [FINALIZER]
    h.apply(control_plane, body)
    h.wait_until(
        lambda: (c := h.get(control_plane, h.configuration_path(namespace, cfg))) is not None
        and not c["metadata"].get("finalizers"),
        what=f"the controller to remove the {FINALIZER} finalizer an older version put there",
    )
