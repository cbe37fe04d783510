"""Pods the kubelet rejected at admission: which ones, and which device resource is to blame. Pure.

``rejected_at_admission``, ``blamed_resources`` and ``event_name`` read the pod's status as the
kubelet writes it (docs/architecture.md, "The controller's modules").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

UNEXPECTED_ADMISSION_ERROR: Final = "UnexpectedAdmissionError"
ADMISSION_REASON_SUFFIX: Final = "AdmissionError"
REJECTED_PREFIX: Final = "Pod was rejected"
FAILED: Final = "Failed"
#: The longest object name the API server accepts (a DNS subdomain).
EVENT_NAME_MAX: Final = 253
#: What may come before and after a resource name in a message, so the name is whole and not part
#: of a longer one (``edgeplug.io/cam`` inside ``edgeplug.io/cam-a1b2c3``). A name never ends in
#: a dot, so a dot followed by no name character ends a sentence, not the name.
_BEFORE: Final = r"(?<![A-Za-z0-9._/-])"
_AFTER: Final = r"(?![A-Za-z0-9_/-]|\.[A-Za-z0-9])"


def rejected_at_admission(*, phase: str, reason: str, message: str) -> bool:
    """Whether a pod's status says the kubelet refused to admit it."""
    if phase != FAILED:
        return False
    return reason.endswith(ADMISSION_REASON_SUFFIX) or message.startswith(REJECTED_PREFIX)


def named_in(text: str, resource: str) -> bool:
    """Whether ``resource`` appears in ``text`` as a whole name."""
    pattern = _BEFORE + re.escape(resource) + _AFTER
    return re.search(pattern, text) is not None


def blamed_resources(*, reason: str, message: str, requested: Iterable[str]) -> list[str]:
    """Which of the ``requested`` extended resources (all the pod asks for, whoever serves
    them) the rejection was for: those the reason or message names; when it names none and the
    reason is the device manager's ``UnexpectedAdmissionError`` (an ``Allocate`` that failed
    with a message of its own), all of them. Empty: the rejection was about something else
    (CPU, memory, node affinity). The caller keeps those edgeplug serves."""
    wanted = sorted(set(requested))
    named = [r for r in wanted if named_in(message, r) or reason == f"OutOf{r}"]
    if named:
        return named
    return wanted if reason == UNEXPECTED_ADMISSION_ERROR else []


def extended_resources(names: Iterable[str]) -> tuple[str, ...]:
    """The extended resource names among a pod's requests and limits (``domain/name``): the
    only ones a device plugin can serve. Sorted, each once."""
    return tuple(sorted({n for n in names if "/" in n}))


def event_name(involved: str, pod_uid: str) -> str:
    """The name of the one Event about pod ``pod_uid`` on the object ``involved``: the same
    name from every replica and after a restart, so a second report is a 409, not a copy.
    A long ``involved`` is cut so the name stays a valid DNS subdomain (the uid keeps it
    unique)."""
    head = involved[: EVENT_NAME_MAX - len(pod_uid) - 1].rstrip(".-")
    return f"{head}.{pod_uid}"
