"""The webhook's answers, over tables: refused with the field named, admitted, warned; never a
crash on a malformed review.

The integration test checks that the API server calls the webhook and shows its message; the
corner cases (odd review bodies, a handler that throws, the unknown-handler switch, properties
from Secrets) are cheaper and clearer checked here, on ``review`` itself.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from controller.webhook.review import review
from discovery_handlers.contract import Device, PropertyValue
from discovery_handlers.registry import register_handler


def _review(obj: Any, operation: str = "CREATE", uid: str = "u-1") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": operation, "object": obj}}


def _config(handler: Any, details: Any = "", properties: Any = None) -> dict[str, Any]:
    section: dict[str, Any] = {"name": handler, "discoveryDetails": details}
    if properties is not None:
        section["discoveryProperties"] = properties
    return {"spec": {"discoveryHandler": section}}


def _answer(body: Any, **kwargs: Any) -> dict[str, Any]:
    response: dict[str, Any] = review(body, **kwargs)["response"]
    return response


@pytest.mark.parametrize(("obj", "field"), [
    (_config("debugEcho", "descriptions: []"), "discoveryDetails.descriptions"),
    (_config("debugEcho", "descriptions: [a, a]"), "discoveryDetails.descriptions[1]"),
    (_config("udev", "udevRules: ['KERNEL=\"x\"']"), "discoveryDetails.udevRules[0]"),
    (_config("debugEcho", ["not", "text"]), "spec.discoveryHandler.discoveryDetails"),
    (_config(None), "spec.discoveryHandler.name"),
    ({"spec": "nonsense"}, "spec.discoveryHandler.name"),
    (None, "spec.discoveryHandler.name"),
    (_config("nosuch"), "spec.discoveryHandler.name: unknown discovery handler 'nosuch'"),
])
def test_refused_naming_the_field(obj: Any, field: str) -> None:
    answer = _answer(_review(obj))
    assert answer["allowed"] is False
    assert answer["uid"] == "u-1"
    assert field in answer["status"]["message"]
    assert answer["status"]["code"] == 422


def test_good_details_admitted_without_warnings() -> None:
    answer = _answer(_review(_config("debugEcho", "descriptions: [a, b]")))
    assert answer == {"uid": "u-1", "allowed": True}


def test_delete_and_connect_are_not_judged() -> None:
    assert _answer(_review(None, operation="DELETE"))["allowed"] is True


def test_unknown_handler_admitted_with_a_warning_when_asked() -> None:
    answer = _answer(_review(_config("nosuch")), allow_unknown_handlers=True)
    assert answer["allowed"] is True
    assert "unknown discovery handler 'nosuch'" in answer["warnings"][0]


def test_complaint_about_a_secret_property_is_left_to_the_agent() -> None:
    details = ("opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp://h:4840/']}}\n"
               "security: {policy: Basic256Sha256}\n")
    from_secret = [{"name": "clientCertificate",
                    "valueFrom": {"secretKeyRef": {"name": "s", "key": "c"}}},
                   {"name": "clientPrivateKey",
                    "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    answer = _answer(_review(_config("opcua", details, from_secret)))
    assert answer["allowed"] is True
    assert "clientCertificate" in answer["warnings"][0]
    # Without any property at all, the same details are refused: nothing is left to the agent.
    assert _answer(_review(_config("opcua", details)))["allowed"] is False


class _Throwing:
    """A third-party handler with a bug in its parser."""

    name = "throwing"
    shared = False

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]) -> Any:
        raise ZeroDivisionError("oops")

    async def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]:
        yield []


def test_a_handler_that_throws_is_refused_naming_it() -> None:
    register_handler(_Throwing())
    answer = _answer(_review(_config("throwing", "x: 1")))
    assert answer["allowed"] is False
    assert "'throwing' failed unexpectedly" in answer["status"]["message"]


@pytest.mark.parametrize("body", [None, [], {}, {"request": None}, {"request": {"uid": 3}}])
def test_not_a_review_is_a_value_error(body: Any) -> None:
    with pytest.raises(ValueError, match="AdmissionReview"):
        review(body)


#: Each built-in handler's vendor libraries: the controller's image need not carry them.
VENDOR_LIBRARIES = ("pyudev", "asyncua", "onvif", "zeep", "lxml")
_JUDGE_WITHOUT_VENDORS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {vendors!r}:
            raise ImportError("vendor library " + name + " is not installed here")
sys.meta_path.insert(0, Block())
from controller.webhook.review import judge
for name, details in {cases!r}:
    section = {{"name": name, "discoveryDetails": details}}
    verdict = judge({{"spec": {{"discoveryHandler": section}}}})
    print(name, verdict.allowed, verdict.message)
"""


def test_every_built_in_handler_judged_without_its_vendor_library() -> None:
    cases = [("udev", "udevRules: ['KERNEL=\"x\"']"), ("onvif", "ipAddresses: 3"),
             ("opcua", "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['http://h/']}}"),
             ("ascend", "healthPollSeconds: -1"), ("debugEcho", "descriptions: []")]
    script = _JUDGE_WITHOUT_VENDORS.format(vendors=VENDOR_LIBRARIES, cases=cases)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(cases), done.stdout
    for (name, _), line in zip(cases, lines, strict=True):
        assert line.startswith(f"{name} False spec.discoveryHandler.discoveryDetails."), line
        assert "failed to load" not in line, line
