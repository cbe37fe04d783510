"""What ``kubectl get instances`` says about DRA (``controller.dra.dra_usage``): the records decoded
from the API's JSON and the servedBy/claims each Instance should show."""

from __future__ import annotations

import json
from typing import Any, cast

from controller.dra import dra_usage as u
from controller.kube.client import Kube
from controller.kube.rest import Rest
from controller.kube.watching import Kind, Watcher


def _slice(pool: str, *devices: tuple[str, str, str], driver: str = "edgeplug.io") -> bytes:
    body: dict[str, Any] = {
        "metadata": {"name": f"s-{pool}", "resourceVersion": "7"},
        "spec": {"driver": driver, "pool": {"name": pool}, "devices": [
            {"name": name, "attributes": {"namespace": {"string": ns},
                                          "instance": {"string": inst},
                                          "configuration": {"string": "cam"}}}
            for name, ns, inst in devices]},
    }
    return json.dumps(body).encode()


def _claim(name: str, *results: tuple[str, str, str]) -> bytes:
    status: dict[str, Any] = {}
    if results:
        status["allocation"] = {"devices": {"results": [
            {"request": "r", "driver": d, "pool": p, "device": dev} for d, p, dev in results]}}
    return json.dumps({"metadata": {"name": name, "namespace": "ns", "resourceVersion": "3"},
                       "status": status}).encode()


def test_decoders_keep_only_what_the_fields_need() -> None:
    published, version = u.decode_slice(_slice("ns/cam/node/n1", ("cam-a", "ns", "cam-a")))
    assert version == "7"
    assert published == u.PublishedSlice(name="s-ns/cam/node/n1", devices=(
        (("ns/cam/node/n1", "cam-a"), ("ns", "cam-a")),))
    assert u.decode_slice(_slice("p", ("d", "ns", "x"), driver="gpu.example.com"))[0] is None
    claim, _ = u.decode_claim(_claim("c", ("edgeplug.io", "p", "d"), ("gpu.example.com", "p", "g")))
    assert claim == u.AllocatedClaim(key=("ns", "c"), devices=frozenset({("p", "d")}))
    assert u.decode_claim(_claim("pending"))[0] == u.AllocatedClaim(
        key=("ns", "pending"), devices=frozenset()), "not allocated: holds nothing"
    node, _ = u.decode_node(json.dumps({"metadata": {"name": "n1"}, "status": {"capacity": {
        "cpu": "2", "edgeplug.io/cam-a": "2", "edgeplug.io/cam-b": "0"}}}).encode())
    assert node.resources == frozenset({"edgeplug.io/cam-a"})
    inst, _ = u.decode_instance(json.dumps({
        "metadata": {"name": "cam-a", "namespace": "ns"},
        "spec": {"nodes": ["n2", "n1"]}, "status": {"claims": 1}}).encode())
    assert (inst.nodes, inst.served_by, inst.claims) == (("n1", "n2"), None, 1)


def test_served_by_claims_and_nodes_per_instance() -> None:
    def inst(name: str, *nodes: str) -> u.InstanceUsage:
        return u.InstanceUsage(namespace="ns", name=name, nodes=nodes, served_by=None,
                               claims=None)

    slices = [u.PublishedSlice(name="s", devices=(
        (("ns/cam/node/n1", "cam-a"), ("ns", "cam-a")),
        (("ns/cam/node/n1", "cam-b"), ("ns", "cam-b"))))]
    claims = [
        u.AllocatedClaim(key=("ns", "one"), devices=frozenset({("ns/cam/node/n1", "cam-a")})),
        u.AllocatedClaim(key=("other", "two"), devices=frozenset({("ns/cam/node/n1", "cam-a")})),
        # two requests on one device count once; a device no slice publishes counts nowhere
        u.AllocatedClaim(key=("ns", "three"), devices=frozenset({
            ("ns/cam/node/n1", "cam-b"), ("ns/cam/node/n1", "cam-b"), ("gone", "cam-c")})),
    ]
    nodes = {"n1": u.AdvertisingNode(name="n1", resources=frozenset({"edgeplug.io/cam-a"})),
             "n2": u.AdvertisingNode(name="n2", resources=frozenset({"edgeplug.io/cam-c"}))}
    wanted = u.desired_fields([inst("cam-a", "n1"), inst("cam-b", "n1", "n3"),
                               inst("cam-c", "n2"), inst("cam-d", "n9")],
                              slices=slices, claims=claims, nodes=nodes)
    assert wanted == {("ns", "cam-a"): ("both", 2, "n1"), ("ns", "cam-b"): ("dra", 1, "n1,n3"),
                      ("ns", "cam-c"): ("device-plugin", 0, "n2"), ("ns", "cam-d"): ("", 0, "n9")}


def test_a_claim_deallocated_then_deleted_stops_counting() -> None:
    """The resource claim controller first removes the allocation, then deletes the claim;
    neither event carries an allocation, and both must leave the Instance's count at 0."""
    kind: Kind[tuple[str, str], u.AllocatedClaim] = Kind(
        name="claims", path="/apis/resource.k8s.io/v1/resourceclaims", decode=u.decode_claim,
        key=lambda claim: claim.key)
    watcher = Watcher(http=None, kind=kind, on_change=lambda *_: None)  # type: ignore[arg-type]
    pool = "ns/cam/node/n1"
    slices = [u.decode_slice(_slice(pool, ("cam-a", "ns", "cam-a")))[0]]
    instance = u.InstanceUsage(namespace="ns", name="cam-a", nodes=("n1",), served_by=None,
                               claims=None)

    def claims() -> int:
        wanted = u.desired_fields([instance], slices=[s for s in slices if s],
                                  claims=watcher.store.values(), nodes={})
        return wanted[("ns", "cam-a")][1]

    for kind_of_event, results in (("ADDED", [("edgeplug.io", pool, "cam-a")]),
                                   ("MODIFIED", [("edgeplug.io", pool, "cam-a")]),
                                   ("MODIFIED", []), ("DELETED", [])):
        line = json.dumps({"type": kind_of_event,
                           "object": json.loads(_claim("c", *results))}).encode()
        watcher._event(line)
        assert claims() == (1 if results else 0), kind_of_event
    assert watcher.store == {}


def test_no_write_before_a_device_is_served_and_none_woken_by_its_own() -> None:
    fresh = u.InstanceUsage(namespace="ns", name="cam-a", nodes=("n1",), served_by=None,
                            claims=None)
    # Unwritten and served by nothing: written once it is served, not before.
    assert u.unwritten_reads_so(fresh, ("", 0, "n1"))
    assert not u.unwritten_reads_so(fresh, ("dra", 0, "n1"))
    written = u.InstanceUsage(namespace="ns", name="cam-a", nodes=("n1",), served_by="dra",
                              claims=0, shown_nodes="n1")
    assert not u.unwritten_reads_so(written, ("", 0, "n1"))  # taken back: written
    usage = u.DraUsage(http=cast(Rest, None), kube=cast(Kube, None))
    usage._wrote[("ns", "cam-a")] = ("dra", 0, "n1")
    usage._instance_changed(("ns", "cam-a"), fresh, written)  # its own write comes back
    assert not usage._wake.is_set()
    moved = u.InstanceUsage(namespace="ns", name="cam-a", nodes=("n1", "n2"), served_by="dra",
                            claims=0, shown_nodes="n1")
    usage._instance_changed(("ns", "cam-a"), written, moved)
    assert usage._wake.is_set()
