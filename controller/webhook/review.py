"""One AdmissionReview in, one answer out: a Configuration's handler parses its discoveryDetails.

Pure, no I/O: ``review`` admits, refuses with the handler's message, or admits with a warning
when the complaint names a property only the agent can read (a Secret or ConfigMap value);
docs/architecture.md, "The admission webhook"."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from discovery_handlers.contract import InvalidDetails, PropertyValue
from discovery_handlers.registry import BrokenHandler, UnknownHandler, load_handler

log = logging.getLogger(__name__)

ADMISSION_API_VERSION: Final = "admission.k8s.io/v1"
ADMISSION_KIND: Final = "AdmissionReview"
HTTP_INVALID: Final = 422
HTTP_BAD_REQUEST: Final = 400
HANDLER_FIELD: Final = "spec.discoveryHandler"


@dataclass(frozen=True)
class Verdict:
    """What the webhook answers: allowed or not, why not (naming the field), any warnings."""

    allowed: bool
    message: str = ""
    code: int = HTTP_INVALID
    warnings: tuple[str, ...] = ()


ALLOWED: Final = Verdict(allowed=True)


def _handler_section(obj: Any) -> Mapping[str, Any] | None:
    if not isinstance(obj, Mapping):
        return None
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    section = spec.get("discoveryHandler")
    return section if isinstance(section, Mapping) else None


def _properties(section: Mapping[str, Any]) -> tuple[dict[str, PropertyValue], list[str]]:
    """Literal property values, and the names of those read from Secrets or ConfigMaps."""
    literal: dict[str, PropertyValue] = {}
    deferred: list[str] = []
    raw = section.get("discoveryProperties") or ()
    if not isinstance(raw, Sequence):
        return literal, deferred
    for entry in raw:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        if entry.get("valueFrom") is not None:
            deferred.append(entry["name"])
        else:
            value = entry.get("value")
            literal[entry["name"]] = value if isinstance(value, str) else ""
    return literal, deferred


def judge(obj: Any, *, allow_unknown_handlers: bool = False) -> Verdict:
    """The verdict on one Configuration (the review's ``request.object``)."""
    section = _handler_section(obj)
    if section is None or not isinstance(section.get("name"), str):
        return Verdict(False, f"{HANDLER_FIELD}.name: required (the discovery handler's name)")
    name: str = section["name"]
    details = section.get("discoveryDetails") or ""
    if not isinstance(details, str):
        return Verdict(False, f"{HANDLER_FIELD}.discoveryDetails: must be a string (YAML text)")
    try:
        handler = load_handler(name)
    except UnknownHandler as error:
        message = f"{HANDLER_FIELD}.name: {error}"
        if allow_unknown_handlers:
            return Verdict(True, warnings=(f"{message}; not checked at admission",))
        return Verdict(False, message)
    except BrokenHandler as error:
        return Verdict(False, f"{HANDLER_FIELD}.name: {error}")
    literal, deferred = _properties(section)
    try:
        handler.parse_details(details, literal)
    except InvalidDetails as error:
        text = str(error)
        named = [prop for prop in deferred if prop in text]
        if named:
            return Verdict(True, warnings=(
                f"{HANDLER_FIELD}.{text} (not refused: it depends on discoveryProperties read"
                f" from Secrets or ConfigMaps ({', '.join(named)}), which the agent reads and"
                " checks when it runs this Configuration)",
            ))
        return Verdict(False, f"{HANDLER_FIELD}.{text} (discovery handler {name!r})")
    except Exception as error:  # a handler's bug: refuse, say whose, keep serving
        log.exception("discovery handler %r failed parsing discoveryDetails", name)
        return Verdict(False, f"{HANDLER_FIELD}.discoveryDetails: discovery handler {name!r}"
                              f" failed unexpectedly parsing it ({type(error).__name__})")
    return ALLOWED


def review(body: Any, *, allow_unknown_handlers: bool = False) -> dict[str, Any]:
    """The AdmissionReview answer to ``body`` (a decoded AdmissionReview request)."""
    request = body.get("request") if isinstance(body, Mapping) else None
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ValueError("not an admission.k8s.io/v1 AdmissionReview with a request.uid")
    if request.get("operation") in ("CREATE", "UPDATE"):
        verdict = judge(request.get("object"), allow_unknown_handlers=allow_unknown_handlers)
    else:
        verdict = ALLOWED
    response: dict[str, Any] = {"uid": request["uid"], "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "code": verdict.code, "reason": "Invalid", "message": verdict.message,
        }
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": ADMISSION_KIND, "response": response}
